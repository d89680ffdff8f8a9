"""What callers ask the store to commit, and what comes back.

- :class:`PublishRequest`: a new generation on top of ``expected_generation`` (``None``
  creates the package), optionally with the case's new durable status, set in the same
  transaction.
- :class:`StatusRequest`: the durable status alone, fenced by the same compare-and-swap on
  the head generation (a stale actor cannot overwrite a newer state).
- :class:`ImportRequest`: a whole validated history, appended as it is.

Each request gets one :class:`Outcome`: its durable acknowledgement or the error that
refused it. A refused request writes nothing and does not affect the others in its batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from .._errors import ChangeRejected, VianoError
from .._ids import validate_case_id
from ._manifest import Change, Manifest
from ._sources import BlobSource

STATUSES = ("READY", "RUNNING", "RETRY_PENDING", "COMPLETED", "BLOCKED", "ERROR")


def _status_value(_inst: Any, _attr: Any, value: str) -> None:
    if value not in STATUSES:
        raise ChangeRejected(f"status {value!r} is not one of {', '.join(STATUSES)}")


# The last second a UTC timestamp can show (9999-12-31T23:59:59Z): a due time past it
# (or before 1970) is no time a writer sets, and could not be printed.
MAX_DUE_AT = 253_402_300_799.0


def _due(_inst: Any, _attr: Any, value: float | None) -> None:
    if value is not None and (type(value) is not float or not 0.0 <= value <= MAX_DUE_AT):
        raise ChangeRejected(f"due_at {value!r} is not a POSIX time from 1970 to 9999")


_MAX_INT = 2**62  # within a signed 64-bit column in every backend
_MAX_TEXT = 256
# What no status word may hold: C0 and C1 controls, DEL, and lone surrogates (which no
# backend's UTF-8 text column can store).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _text(_inst: Any, attr: Any, value: str | None) -> None:
    """A status word: what every backend's text column holds (no NUL, no control
    characters, bounded), so no status can fail the batch it is committed in."""
    if value is None and attr.name != "phase":
        return
    if type(value) is not str or not 0 < len(value) <= _MAX_TEXT or \
            _UNPRINTABLE.search(value) is not None:
        raise ChangeRejected(f"status {attr.name} {value!r} is not a printable word of at "
                             f"most {_MAX_TEXT} characters")


def _count(_inst: Any, attr: Any, value: int | None) -> None:
    if value is None and attr.name != "calls_started":
        return
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise ChangeRejected(f"status {attr.name} {value!r} is not a count from 0 to 2**62")


@attrs.frozen
class CaseStatus:
    """The durable status of a case, kept in the store's index and indexed by due time.

    ``status`` is READY (work to do now), RUNNING (a model call of ``round`` is under
    way: ``calls_started`` counts the calls made for it, so a repeat after a crash is
    visible), RETRY_PENDING (until ``due_at``), COMPLETED, BLOCKED or ERROR, with the
    ``reason`` code of the last dispatch result."""

    status: str = attrs.field(validator=_status_value)
    phase: str = attrs.field(validator=_text)  # type: ignore[assignment]  # required there
    reason: str | None = attrs.field(default=None, validator=_text)
    round: int | None = attrs.field(default=None, validator=_count)
    max_rounds: int | None = attrs.field(default=None, validator=_count)
    due_at: float | None = attrs.field(default=None, validator=_due)
    attempt_id: str | None = attrs.field(default=None, validator=_text)
    calls_started: int = attrs.field(default=0, validator=_count)

    @property
    def due_at_iso(self) -> str | None:
        return None if self.due_at is None else iso_utc(self.due_at)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "phase": self.phase, "reason": self.reason,
                "round": self.round, "max_rounds": self.max_rounds,
                "due_at": self.due_at_iso, "attempt_id": self.attempt_id,
                "calls_started": self.calls_started}


def iso_utc(posix: float) -> str:
    """A due time to the second, rounded **up**: a person (or a cron job) acting at the time
    shown is never told the round is not due yet."""
    if type(posix) is not float or not 0.0 <= posix <= MAX_DUE_AT:  # a damaged row: shown
        return f"(not a time: {posix!r})"
    return datetime.fromtimestamp(math.ceil(posix), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _case_id(_inst: Any, _attr: Any, value: str) -> None:
    validate_case_id(value)


@attrs.frozen
class PublishRequest:
    """Publish ``change`` on top of ``expected_generation`` (``None``: create the package)."""

    package_id: str
    case_id: str = attrs.field(validator=_case_id)
    expected_generation: int | None
    change: Change
    status: CaseStatus | None = None

    def __attrs_post_init__(self) -> None:
        if self.expected_generation is None and self.change.phase is None:
            raise ChangeRejected("creating a package needs a phase")


@attrs.frozen
class StatusRequest:
    """Set the durable status of a case whose head is ``expected_generation``."""

    package_id: str
    case_id: str = attrs.field(validator=_case_id)
    expected_generation: int
    status: CaseStatus


@attrs.frozen
class ImportRequest:
    """Append a whole validated history (``manifests`` in generation order) as it is.

    If the package already exists, its history must be a prefix of the imported one: the
    missing generations are appended (fast-forward); identical history is a no-op. A
    shorter or diverged history is refused."""

    package_id: str
    case_id: str = attrs.field(validator=_case_id)
    manifests: tuple[Manifest, ...]
    blobs: Mapping[str, BlobSource]


Request = PublishRequest | StatusRequest | ImportRequest


@attrs.frozen
class Published:
    """The durable acknowledgement of one publication, status change or import."""

    package_id: str
    case_id: str
    generation: int
    manifest: Manifest
    status: CaseStatus | None = None

    @property
    def manifest_sha256(self) -> str:
        return self.manifest.sha256


Outcome = Published | VianoError
