"""Named crash points at every durable step, for crash-injection tests and benchmarks.

The same names serve as pause points: with ``VIANO_PAUSE_AT=point`` and
``VIANO_PAUSE_FILE=path`` a child process creates ``path`` when it reaches the point and
waits there until ``path`` is removed, so a test can run another process in that window
(for example ``viano gc`` between a blob write and its transaction).

A point is armed either programmatically (``arm_crash_point("txn.before_commit")``: the step raises
:class:`SimulatedCrash`, a ``BaseException`` that no ordinary handler swallows) or from the
environment of a child process (``VIANO_CRASH_AT=blob.fsync`` or ``blob.fsync:3`` for the
third hit), in which case the process dies on the spot with ``os._exit(137)``: no cleanup,
no rollback, no flush — the on-disk state is exactly what a power cut would leave.
"""

from __future__ import annotations

import os
import threading
import time

CRASH_POINTS: tuple[str, ...] = (
    "blob.write",          # half of a large blob is in its temporary file
    "blob.fsync",          # the temporary file is complete and fsynced, not yet renamed
    "blob.rename",         # renamed into place, directory not yet fsynced
    "blob.dirsync",        # directory fsynced; the transaction has not started
    "batch.blobs_ready",   # every large blob of a batch is in place; no transaction yet
    "txn.before_commit",   # every row of the batch is written, COMMIT not yet issued
    "txn.after_commit",    # COMMIT is durable, callers not yet answered
    "gc.before_unlink",    # gc chose an orphan, has not removed it
    "migrate.before_commit",  # a store-format migration is written, COMMIT not yet issued
    "phase.entered",       # a phase's policy and context are durable; no model call yet
    "phase.answered",      # the gateway answered; the round is not recorded yet
    "phase.recorded",      # the round record is durable; the answer not yet judged
    "phase.judged",        # the accepted artifacts (or the rejection) are durable
    "export.written",      # an export is complete in its temporary file, not yet renamed
)

ENV_VAR = "VIANO_CRASH_AT"
PAUSE_VAR = "VIANO_PAUSE_AT"
PAUSE_FILE_VAR = "VIANO_PAUSE_FILE"


class SimulatedCrash(BaseException):
    """Raised at an armed crash point in-process. Derives from BaseException on purpose."""


_lock = threading.Lock()
_armed: dict[str, int] = {}
_hits: dict[str, int] = {}


def _from_env() -> tuple[str, int] | None:
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth or "1")


# Read once: the variables arm a child process from its start (the environment is not a
# control channel afterwards), and a crash point sits on every publication's path.
_ENV_CRASH = _from_env()
_ENV_PAUSE = (os.environ.get(PAUSE_VAR), os.environ.get(PAUSE_FILE_VAR))


def arm_crash_point(point: str, nth: int = 1) -> None:
    """Make the ``nth`` next hit of ``point`` raise :class:`SimulatedCrash`."""
    if point not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(CRASH_POINTS)}")
    with _lock:
        _armed[point] = nth
        _hits[point] = 0


def disarm_crash_points() -> None:
    with _lock:
        _armed.clear()
        _hits.clear()


def _pause(point: str) -> None:
    at, marker = _ENV_PAUSE
    if at != point or not marker:
        return
    with open(marker, "w") as f:
        f.write(f"{os.getpid()} {point}\n")
    while os.path.exists(marker):
        time.sleep(0.01)


def crash_point(point: str) -> None:
    """Mark a durable step. Costs three comparisons when nothing is armed."""
    if _ENV_PAUSE[0] is not None:
        _pause(point)
    env = _ENV_CRASH
    if env is not None and env[0] == point:
        with _lock:
            _hits[point] = _hits.get(point, 0) + 1
            if _hits[point] == env[1]:
                os._exit(137)
    if not _armed:
        return
    with _lock:
        if point not in _armed:
            return
        _hits[point] += 1
        if _hits[point] == _armed[point]:
            del _armed[point]
            raise SimulatedCrash(point)
