"""Everything the CLI prints: one JSON document with ``--json``, tables otherwise, errors
with their reason and hint on stderr, and progress bars on a terminal.

Text that came from outside (titles, names, paths, messages) is passed through
``terminal_safe`` before it reaches a terminal, and table cells are plain text, never
Rich markup; the JSON document escapes C1 controls and bidi overrides as ``\\u`` escapes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from engine import VianoError, terminal_safe

# C1 controls and bidi controls: written as \u escapes, so the document is safe on a
# terminal and still means the same text.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# A lone surrogate (what a file name or argument that is not UTF-8 decodes to) has no
# UTF-8 form, and its \u escape is refused by strict parsers (RFC 8259 section 8.2): it is
# written as the visible text ``\udcff``, as terminal_safe shows it on a terminal.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_lone_surrogates(v) for v in value]
    return value


def json_text(value: Any, *, indent: int | None = 2, ascii_only: bool = False) -> str:
    """``value`` as one JSON document that every strict parser reads as UTF-8."""
    text = json.dumps(_no_lone_surrogates(value), indent=indent, ensure_ascii=ascii_only)
    return text if ascii_only else _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class OutputUnwritable(VianoError):
    """Standard output refused the result (a full disk, an I/O error): the command's work
    is done (what it had to write is durable); only its report is lost. Exit 1, never
    ``internal_error``."""

    default_reason = "output_unwritable"
    default_hint = ("Free space where standard output goes, or send it elsewhere; anything "
                    "the command wrote to the store is kept ('viano status' shows it).")

    @classmethod
    def of(cls, exc: OSError) -> OutputUnwritable:
        return cls(f"the result could not be written to standard output "
                   f"({exc.strerror or type(exc).__name__})")


@contextmanager
def writing_stdout() -> Iterator[None]:
    """A write to stdout: a broken pipe stays one (the reader went away, see ``main``);
    any other failure is :class:`OutputUnwritable`."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputUnwritable.of(exc) from exc


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich exits 1 when the reader goes away; the command's own outcome decides
        instead (``main`` treats a broken pipe as done: what had to be durable is)."""
        raise BrokenPipeError


def _console(*, stderr: bool) -> _Console:
    """A console that never wraps a line it did not choose to: on a terminal, its width;
    anywhere else (a pipe, a file, a CI log) as wide as the content, so ``grep`` and ``cut``
    see one row per line and no word broken in two."""
    console = _Console(stderr=stderr, soft_wrap=True, highlight=False, markup=False,
                       emoji=False)
    if not console.is_terminal:
        console.width = 10_000
    return console


def quiet_stdout() -> None:
    """The reader went away (``viano … | head -1``): point stdout at /dev/null, so that
    what is still written, and the interpreter's final flush, do not fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class Output:
    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.out = _console(stderr=False)
        self.err = _console(stderr=True)
        self.documents = 0
        # A command that works through many cases (batch, daemon, run, bulk intake) goes
        # on when the reader of its lines goes away: the lines were a report of the work,
        # not the work. Other commands stop there (what they had to write is durable).
        self.outlives_reader = False
        self.reader_gone = False
        # Such a command whose stdout refused a line (a full disk) goes on too, without
        # its lines, and fails at the end with this (``main``): the report was lost.
        self.unwritable: OutputUnwritable | None = None

    def _print(self, renderable: Any) -> None:
        if self.reader_gone:
            return
        try:
            with writing_stdout():
                self.out.print(renderable)
        except BrokenPipeError:
            if not self.outlives_reader:
                raise
            self.reader_gone = True
            quiet_stdout()
        except OutputUnwritable as exc:
            if not self.outlives_reader:
                raise
            self.reader_gone = True
            self.unwritable = exc
            self.note(f"warning: {exc.message}; the work goes on without its lines, and "
                      "the command will fail at its end (exit 1, or its own code if worse)")

    def document(self, value: Any) -> None:
        """The single JSON document of a ``--json`` run."""
        self.documents += 1
        with writing_stdout():
            sys.stdout.write(json_text(value) + "\n")
            sys.stdout.flush()

    def table(self, title: str | None, columns: Sequence[str],
              rows: Sequence[Sequence[Any]]) -> None:
        table = Table(title=None if title is None else Text(terminal_safe(title)),
                      show_lines=False, header_style="bold")
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*(Text("" if v is None else terminal_safe(str(v))) for v in row))
        self._print(table)

    def line(self, text: str) -> None:
        self._print(Text(terminal_safe(text, multiline=True)))

    def markdown(self, text: str) -> None:
        """Markdown meant to be copied or posted: its bytes as they are on a pipe or in a
        file; on a terminal, control characters escaped (it is already escaped Markdown)."""
        if sys.stdout.isatty():
            self._print(Text(terminal_safe(text.removesuffix("\n"), multiline=True)))
        else:
            with writing_stdout():
                sys.stdout.write(text)
                sys.stdout.flush()

    def note(self, text: str) -> None:
        """A human line on stderr (never disturbs a JSON document on stdout). A stderr that
        refuses it (a full disk) loses the line, not the command: a daemon died of it."""
        with contextlib.suppress(OSError):
            self.err.print(Text(terminal_safe(text, multiline=True)))

    def error(self, exc: VianoError) -> None:
        if self.as_json and not self.documents and not isinstance(exc, OutputUnwritable):
            # stdout gone or full: stderr below still says why
            with contextlib.suppress(OSError, OutputUnwritable):
                self.document({"error": exc.to_json()})
        self.err.print(Text(f"error[{exc.reason}]: {terminal_safe(exc.message)}", style="red"))
        self.err.print(Text(f"  what to do: {terminal_safe(exc.hint)}"))

    @contextmanager
    def progress(self, description: str, total: int | None,
                 unit_bytes: bool = False) -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr when it is a terminal; a no-op otherwise."""
        with self.progress_with_text(description, total, unit_bytes) as (advance, _text):
            yield advance

    @contextmanager
    def progress_with_text(self, description: str, total: int | None,
                           unit_bytes: bool = False
                           ) -> Iterator[tuple[Callable[[int], None], Callable[[str], None]]]:
        """A progress bar with a line of counts beside it, an ETA, on stderr when it is a
        terminal; no-ops otherwise."""
        if not self.err.is_terminal:
            yield (lambda _n: None), (lambda _t: None)
            return
        columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
        columns.append(DownloadColumn() if unit_bytes else
                       TextColumn("{task.completed}/{task.total}"))
        columns += [TimeRemainingColumn(), TextColumn("{task.fields[counts]}")]
        with Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(description, total=total, counts="")
            yield ((lambda n: bar.advance(task, n)),
                   (lambda text: bar.update(task, counts=terminal_safe(text))))
