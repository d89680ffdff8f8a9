"""Audit records: one per provider attempt, returned to the caller for checkpointing.

A record never holds a secret: request headers are filtered, URLs masked, bodies and error
messages scrubbed of every known secret value before they are stored here.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ._classes import FailureClass

BODY_LIMIT = 64 * 1024  # response bytes kept in a record


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


@attrs.frozen
class AuditRecord:
    prompt_id: str
    provider: str
    kind: str
    attempt: int                 # 1-based within the round
    retry: int                   # 0 for the first try at this provider in this round
    url: str
    request_headers: dict[str, str]
    request_body: str
    status: int | None
    response_headers: dict[str, str]
    response_body: str
    response_truncated: bool
    started_at: str              # wall clock, for people
    duration_ms: float
    failure: FailureClass | None
    detail: str                  # stable snake_case: ok, http_503, connect_error, …
    error: str                   # redacted, human
    # Finite or None whatever made the record: it is stored, and the store refuses NaN and
    # infinities (a record it cannot write lost the round's answer).
    retry_after_s: float | None = attrs.field(default=None, converter=_finite)

    def to_json(self) -> dict[str, Any]:
        doc = attrs.asdict(self)
        doc["failure"] = None if self.failure is None else self.failure.value
        return doc
