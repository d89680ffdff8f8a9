"""The cross-process case lock: ``fcntl.flock`` on ``locks/<case_id>.lock``, never waited on.

The OS releases it when the holding process dies, so a crash never leaves a case locked.
A busy lock is reported at once as :class:`CaseLocked` (a DEFERRED result), never queued.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import CaseLocked
from .._ids import validate_case_id


@contextmanager
def case_lock(store_root: Path, case_id: str) -> Iterator[None]:
    validate_case_id(case_id)
    locks = store_root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{case_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise CaseLocked(f"case {case_id!r} is locked by another process") from exc
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
