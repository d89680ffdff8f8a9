"""What one round returns: an answer, or a record of why no answer came."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import attrs

from ._audit import AuditRecord
from ._classes import FailureClass
from ._wire import Prompt


class RoundStatus(enum.StrEnum):
    ANSWER = "answer"
    INVALID_ANSWER = "invalid_answer"            # a provider answered off contract: no failover
    UNAVAILABLE = "providers_unavailable"        # retry in a later round
    CONFIGURATION = "provider_configuration"     # every provider tried refused the request


@attrs.frozen
class RoundRequest:
    prompt: Prompt
    max_output_bytes: int | None = None  # None: the gateway's configured limit

    def output_limit(self, gateway_limit: int) -> int:
        """The most bytes an answer may have: the phase's own (pinned) limit, never above
        the gateway's ``max_output_bytes``, the operator's guard for every call."""
        if self.max_output_bytes is None:
            return gateway_limit
        return min(self.max_output_bytes, gateway_limit)


@attrs.frozen
class RoundOutcome:
    status: RoundStatus
    attempts: tuple[AuditRecord, ...]
    provider: str | None = None
    content: str | None = None
    parsed: dict[str, Any] | None = None

    @property
    def raw(self) -> bytes | None:
        return None if self.content is None else self.content.encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "provider": self.provider,
                "content": self.content, "parsed": self.parsed,
                "attempts": [a.to_json() for a in self.attempts]}


def no_answer_status(attempts: Sequence[AuditRecord]) -> RoundStatus:
    """Every provider refusing the request is distinguishable from unavailability. A
    provider skipped while it cools down is unavailable (it may answer a later round), so a
    round in which any provider was skipped or unavailable is unavailability."""
    if attempts and all(a.failure is FailureClass.CONFIGURATION for a in attempts):
        return RoundStatus.CONFIGURATION
    return RoundStatus.UNAVAILABLE
