"""The Hypothesis Builder's public API (spec hypothesis-builder-v1):

    from viano_bug_analysis.analysis import HypothesisBuilder, HypothesisConfig

    policy = HypothesisConfig.load("config/analysis.local.toml")
    builder = HypothesisBuilder(store, gateway, policy)
    result = await builder.build(case_id, package_id)

``store`` and ``gateway`` are the handles of :func:`viano_bug_analysis.open_store` and
:func:`viano_bug_analysis.open_gateway`; ``build`` runs one dispatch of the hypothesis
phase for that case inside the caller's trio run, through a case actor (the case's lease,
the gateway pool, the publisher). It never starts the interpretation phase itself.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from actors import (
    Clock,
    GatewayHandle,
    PhaseServices,
    StoreHandle,
    SystemClock,
    dispatch_phase,
    log_event,
)
from engine import (
    HYPOTHESES,
    Config,
    DispatchRequest,
    DispatchResult,
    HypothesisLimits,
    HypothesisPolicy,
    RetryPolicy,
)

HypothesisResult = DispatchResult
"""The typed result of a build: ``status`` (COMPLETED, RETRY_PENDING, DEFERRED, BLOCKED or
ERROR), ``reason`` (a stable code: completed, providers_unavailable, rounds_exhausted,
calls_unrecorded, not_due, locked, stale_generation, invalid_answer, attempt_rejected,
policy_changed, interpretation_not_confirmed, interpretation_mismatch, missing_observations,
limit_exceeded, provider_configuration, unsupported_history, store_corrupt,
store_unavailable), ``message``, the case and
package ids, revision, generation, attempt id, round, max_rounds and due time;
``to_json()`` is CONTRACT.md's dispatch result."""


@attrs.frozen
class HypothesisConfig:
    """The builder's policy: counts, budget and limits (``[hypotheses]``, pinned per
    analysis revision) and the round policy (``[retry]``)."""

    hypotheses: HypothesisPolicy = attrs.field(factory=HypothesisPolicy)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)

    @property
    def min_hypotheses(self) -> int:
        return self.hypotheses.min_hypotheses

    @property
    def max_hypotheses(self) -> int:
        return self.hypotheses.max_hypotheses

    @property
    def initial_budget(self) -> int:
        return self.hypotheses.initial_budget

    @property
    def limits(self) -> HypothesisLimits:
        return self.hypotheses.limits

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HypothesisConfig:
        """From a configuration file, loaded as strictly as the CLI loads it (a bad key,
        a wrong type, min > max: ``ConfigError`` naming the key and the file)."""
        return cls.from_config(Config.load(path))

    @classmethod
    def from_config(cls, config: Config) -> HypothesisConfig:
        return cls(hypotheses=config.hypotheses, retry=config.retry)

    @classmethod
    def defaults(cls) -> HypothesisConfig:
        return cls()

    def request(self, attempt_id: str = "default") -> DispatchRequest:
        config = attrs.evolve(Config.defaults(), hypotheses=self.hypotheses)
        return DispatchRequest(policy=HYPOTHESES.configured(config), retry=self.retry,
                               attempt_id=attempt_id)


class HypothesisBuilder:
    def __init__(self, store: StoreHandle, gateway: GatewayHandle, policy: HypothesisConfig,
                 *, clock: Clock | None = None, events: Any = log_event):
        self.store, self.gateway, self.policy = store, gateway, policy
        self._services = PhaseServices(store, gateway, clock or SystemClock(), events)

    async def build(self, case_id: str, package_id: str, *,
                    attempt_id: str = "default") -> HypothesisResult:
        """One dispatch of the hypothesis phase for ``case_id``, whose manifest must carry
        ``package_id`` (a pair that does not belong together is refused,
        ``PhaseRefused`` package_mismatch)."""
        return await dispatch_phase(self._services, HYPOTHESES, case_id,
                                    self.policy.request(attempt_id), package_id=package_id)


__all__ = ["HypothesisBuilder", "HypothesisConfig", "HypothesisResult"]
