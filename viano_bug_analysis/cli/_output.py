"""Everything the CLI prints: one JSON document with ``--json``, tables otherwise, errors
with their reason and hint on stderr, and progress bars on a terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from engine import VianoError


class Output:
    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.out = Console(soft_wrap=True, highlight=False)
        self.err = Console(stderr=True, soft_wrap=True, highlight=False)

    def document(self, value: Any) -> None:
        """The single JSON document of a ``--json`` run."""
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def table(self, title: str | None, columns: Sequence[str],
              rows: Sequence[Sequence[Any]]) -> None:
        table = Table(title=title, show_lines=False, header_style="bold")
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        self.out.print(table)

    def line(self, text: str) -> None:
        self.out.print(text, markup=False)

    def error(self, exc: VianoError) -> None:
        if self.as_json:
            self.document({"error": exc.to_json()})
        self.err.print(f"error[{exc.reason}]: {exc.message}", markup=False, style="red")
        self.err.print(f"  what to do: {exc.hint}", markup=False)

    @contextmanager
    def progress(self, description: str, total: int | None,
                 unit_bytes: bool = False) -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr when it is a terminal; a no-op otherwise."""
        if not self.err.is_terminal:
            yield lambda _n: None
            return
        columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
        columns.append(DownloadColumn() if unit_bytes else
                       TextColumn("{task.completed}/{task.total}"))
        columns.append(TimeRemainingColumn())
        with Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)
