"""``--log-json``: one JSON line per phase step and dispatch result, to stderr or a file.
Quiet unless asked for. The events carry no secret (no audit record is logged)."""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from engine import UsageError, enclosing_store, terminal_safe

from ._output import json_text


class _JsonLines(logging.Handler):
    def __init__(self, stream: IO[str], name: str):
        super().__init__(logging.INFO)
        self.stream = stream
        self.name_shown = name
        self.failed: OSError | ValueError | None = None
        self.lost = 0

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "viano_event", None)
        if not isinstance(event, dict):
            return
        line = {"ts": datetime.fromtimestamp(record.created, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"), **event}
        try:
            self.stream.write(json_text(line, indent=None, ascii_only=True) + "\n")
            self.stream.flush()
        except (OSError, ValueError) as exc:
            # A full disk or a closed log never stops the work; it is said once, on
            # stderr, when the first event is lost, and counted at the end.
            self.lost += 1
            if self.failed is None:
                self.failed = exc
                why = getattr(exc, "strerror", None) or type(exc).__name__
                with suppress(OSError, ValueError):
                    sys.stderr.write(f"warning: --log-json {self.name_shown}: events are "
                                     f"being lost ({why}); the work goes on\n")

    def report_lost(self) -> None:
        if self.lost:
            with suppress(OSError, ValueError):
                sys.stderr.write(f"warning: --log-json {self.name_shown}: {self.lost} "
                                 "event(s) could not be written\n")


@contextmanager
def event_log(target: str | None, store_root: Path | None = None) -> Iterator[None]:
    if target is None:
        yield
        return
    logger = logging.getLogger("viano.events")
    stream: IO[str] = sys.stderr if target == "-" else open_log(target, store_root)
    handler = _JsonLines(stream, terminal_safe(_shown(target)))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.report_lost()
        if stream is not sys.stderr:
            with suppress(OSError):  # a full disk or a gone reader never fails the work
                stream.close()


_HINT = "Give a file in a directory that exists and is writable, or '-' for stderr."


def _outside_every_store(target: str, path: Path, store_root: Path | None) -> None:
    """Refuse (``destination_in_store``) a log path inside this store or any store folder:
    appending to a store's database or a blob corrupts it."""
    try:
        place = path.resolve()
        inside = enclosing_store(place)
        if store_root is not None:
            root = store_root.resolve()
            if place == root or root in place.parents:
                inside = store_root
    except (OSError, RuntimeError, ValueError) as exc:
        raise _refused(target, str(exc)) from exc
    if inside is not None:
        raise UsageError(f"--log-json {_shown(target)} is inside the store folder "
                         f"{_shown(str(inside))}", reason="destination_in_store",
                         hint="Write the event log outside every store folder.")


def open_log(target: str, store_root: Path | None) -> IO[str]:
    """The event log's file, opened for appending, or a refusal (``usage_error``) that
    names why: never a path inside the store (appending to its database would corrupt
    it), never a FIFO that no process reads (opening it would wait for one forever), and
    never a block device. A FIFO with a reader, a character device (``/dev/null``, a
    terminal) and a regular file are what a log can be written to."""
    _outside_every_store(target, Path(target), store_root)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(target, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader
            raise UsageError(f"--log-json {_shown(target)} is a FIFO that no process reads",
                             hint="Start its reader first, or give a file.") from exc
        raise _refused(target, exc.strerror or str(exc)) from exc
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise _refused(target, "not a file, a FIFO or a character device")
        if stat.S_ISREG(mode):
            if st.st_nlink > 1:  # another name may be inside a store: a blob, its database
                raise _refused(target, "a file with other names (hard links), which may be "
                                       "another program's file or a store's")
            # What was opened, not what the name said before: a link swapped in since.
            opened = Path(f"/proc/self/fd/{fd}")
            if opened.is_symlink():
                _outside_every_store(target, Path(os.readlink(opened)), store_root)
        os.set_blocking(fd, True)
        return open(fd, "a", encoding="utf-8", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _refused(target: str, why: str) -> UsageError:
    return UsageError(f"--log-json cannot write {_shown(target)!r}: {why}", hint=_HINT)


def _shown(target: str) -> str:
    return target.encode("utf-8", "backslashreplace").decode("utf-8")
