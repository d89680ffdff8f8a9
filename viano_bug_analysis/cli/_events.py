"""``--log-json``: one JSON line per phase step and dispatch result, to stderr or a file.
Quiet unless asked for. The events carry no secret (no audit record is logged)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO

from engine import UsageError


class _JsonLines(logging.Handler):
    def __init__(self, stream: IO[str]):
        super().__init__(logging.INFO)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "viano_event", None)
        if not isinstance(event, dict):
            return
        line = {"ts": datetime.fromtimestamp(record.created, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"), **event}
        try:
            self.stream.write(json.dumps(line, ensure_ascii=True, sort_keys=False) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed log never stops the work


@contextmanager
def event_log(target: str | None) -> Iterator[None]:
    if target is None:
        yield
        return
    logger = logging.getLogger("viano.events")
    try:
        stream: IO[str] = sys.stderr if target == "-" else open(  # noqa: SIM115
            target, "a", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--log-json cannot write {target!r}: {exc.strerror or exc}",
                         hint="Give a file in a directory that exists and is writable, "
                              "or '-' for stderr.") from exc
    handler = _JsonLines(stream)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        if stream is not sys.stderr:
            stream.close()
