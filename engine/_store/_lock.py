"""The SQLite backend's case lease: ``fcntl.flock`` on ``locks/<case_id>.lock``, never waited
on.

The OS releases it when the holding process dies, so a crash never leaves a case locked.
A busy lock is reported at once as :class:`CaseLocked` (a DEFERRED result), never queued.
``flock`` locks belong to an open file description, so two holders in one process exclude
each other exactly as two processes do.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import CaseLocked, StorageError


@contextmanager
def flock_lease(locks: str | Path, case_id: str) -> Iterator[None]:
    """Hold the lease on ``case_id`` (already validated: it is a safe file name). The
    folder is made only when the lock file cannot be opened for its lack: a ``mkdir`` per
    lease (and pathlib's joins) was a twentieth of a batch's CPU."""
    path = os.path.join(locks, case_id + ".lock")
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            os.makedirs(locks, exist_ok=True)
            fd = os.open(path, flags, 0o644)
    except OSError as exc:
        read_only = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        raise StorageError(f"cannot take the lease on case {case_id!r}: "
                           f"{exc.strerror or exc}",
                           reason="store_read_only" if read_only else "store_unavailable",
                           hint="This store cannot be written by you; read commands still "
                                "work." if read_only else "Check the store folder.") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise CaseLocked(f"case {case_id!r} is locked by another dispatch") from exc
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
