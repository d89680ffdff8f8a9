"""The next step is a pure function of durable state: a table of states and the step each
one leads to (no event loop, no I/O)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from engine import (
    CaseStatus,
    DispatchRequest,
    Enter,
    Finish,
    Judge,
    PhaseState,
    Refusal,
    RetryPolicy,
    RunRound,
    attempt_hash,
    decide,
)
from engine._phases._protocol import RoundInfo, parse_rounds

pytestmark = pytest.mark.usefixtures("backend")

POLICY = "p" * 64
CONTEXT = "c" * 64


def _state(**kw: Any) -> PhaseState:
    base: dict[str, Any] = dict(
        key="interpretation", phase="INTERPRETING_CASE", package_id="pkg-1", revision=1,
        entered=True, accepted=False, history_problem=None, precheck=None,
        pinned_policy_sha=POLICY, current_policy_sha=POLICY, context_sha=CONTEXT,
        prompt_id="interpretation_v1", prompt_sha="f" * 64, series=1, rounds=(),
        rejected=frozenset(), last_round=None, status=None)
    base.update(kw)
    return PhaseState(**base)


def _round(n: int, outcome: str, series: int = 1) -> RoundInfo:
    return RoundInfo(f"analysis/interpretation/0001/rounds/{series:04d}-{n:04d}.{outcome}.json",
                     series, n, outcome)


REQ = DispatchRequest(policy={}, retry=RetryPolicy(max_rounds=3, base_delay_s=30,
                                                   max_delay_s=3600))
NOW = 1_000_000.0
DEFAULT_HASH = _state().attempt("default")


def _due(at: float) -> dict[str, Any]:
    return {"retry": {"due_at_posix": at}, "attempt_hash": DEFAULT_HASH}


TABLE: dict[str, tuple[PhaseState, type, str | None]] = {
    "not entered": (_state(entered=False, pinned_policy_sha=None, context_sha=None),
                    Enter, None),
    "not entered, precondition fails": (
        _state(entered=False, precheck=Refusal("ERROR", "interpretation_not_confirmed", "x")),
        Finish, "interpretation_not_confirmed"),
    "entered, no round": (_state(), RunRound, None),
    "completed": (_state(accepted=True), Finish, "completed"),
    "completed, later policy differs": (_state(accepted=True, current_policy_sha="x" * 64),
                                        Finish, "completed"),
    "declared without history": (_state(history_problem="registry without creations"),
                                 Finish, "unsupported_history"),
    "policy changed while pending": (_state(current_policy_sha="x" * 64), Finish,
                                     "policy_changed"),
    "answer checkpointed": (_state(rounds=(_round(1, "answer"),),
                                   last_round={"attempt_hash": DEFAULT_HASH}), Judge, None),
    "gateway-invalid answer checkpointed": (_state(rounds=(_round(1, "invalid"),),
                                                   last_round={"attempt_hash": DEFAULT_HASH}),
                                            Judge, None),
    "answer rejected, same attempt": (_state(rounds=(_round(1, "answer"),),
                                             last_round={"attempt_hash": DEFAULT_HASH},
                                             rejected=frozenset({DEFAULT_HASH})),
                                      Finish, "attempt_rejected"),
    "unavailable, not due": (_state(rounds=(_round(1, "unavailable"),),
                                    last_round=_due(NOW + 10)), Finish, "not_due"),
    "unavailable, due": (_state(rounds=(_round(1, "unavailable"),), last_round=_due(NOW - 1)),
                         RunRound, None),
    # A due time no writer sets (a crafted import) held the case DEFERRED for ever.
    **{f"unavailable, due at {at!r}": (_state(rounds=(_round(1, "unavailable"),),
                                              last_round=_due(at)), RunRound, None)
       for at in (1e300, float("inf"), -5.0)},
    "rounds exhausted": (_state(rounds=tuple(_round(i, "unavailable") for i in (1, 2, 3)),
                                last_round={"retry": {"blocked": True}}),
                         Finish, "rounds_exhausted"),
    # Blocked under a lower limit than REQ's 3: still blocked, not run on.
    "blocked by its last round, limit since raised": (
        _state(rounds=(_round(1, "unavailable"),), last_round={"retry": {"blocked": True}}),
        Finish, "rounds_exhausted"),
    "exhausted, then unblocked (series 2)": (_state(series=2, rounds=()), RunRound, None),
    "provider configuration last": (_state(rounds=(_round(1, "configuration"),),
                                           last_round={}), RunRound, None),
}


class TestDecide:
    @pytest.mark.parametrize("label", sorted(TABLE))
    def test_table(self, label: str) -> None:
        """Each durable state leads to exactly one step."""
        state, kind, reason = TABLE[label]
        step = decide(state, REQ, NOW)
        assert isinstance(step, kind), (label, step)
        if reason is not None:
            assert isinstance(step, Finish) and step.reason == reason, (label, step)

    def test_next_round_number_and_calls(self) -> None:
        """After round 2 the next is round 3; a RUNNING status for that round means a call
        was started and never recorded, so this one is the second."""
        state = _state(rounds=(_round(1, "unavailable"), _round(2, "unavailable")),
                       last_round=_due(NOW - 1))
        step = decide(state, attrs.evolve(REQ, retry=RetryPolicy(max_rounds=10)), NOW)
        assert isinstance(step, RunRound) and (step.round, step.calls_started) == (3, 1)
        crashed = attrs.evolve(state, status=CaseStatus(
            status="RUNNING", phase="INTERPRETING_CASE", round=3, attempt_id="default",
            calls_started=1))
        step = decide(crashed, attrs.evolve(REQ, retry=RetryPolicy(max_rounds=10)), NOW)
        assert isinstance(step, RunRound) and step.calls_started == 2

    def test_a_call_started_too_often_unrecorded_blocks_the_round(self) -> None:
        """MAX_CALL_STARTS starts of one round's call, none recorded: the next dispatch
        calls nobody and ends BLOCKED ``calls_unrecorded``, to be set durably (the status
        it is derived from would otherwise say the same for ever). One start fewer still
        runs; another round's, another attempt's or a BLOCKED status's count does not
        count."""
        from engine._phases._protocol import MAX_CALL_STARTS

        req = attrs.evolve(REQ, retry=RetryPolicy(max_rounds=10))

        def started(n: int, **kw: Any) -> PhaseState:
            status = dict(status="RUNNING", phase="INTERPRETING_CASE", round=1,
                          attempt_id="default", calls_started=n) | kw
            return _state(status=CaseStatus(**status))

        step = decide(started(MAX_CALL_STARTS - 1), req, NOW)
        assert isinstance(step, RunRound) and step.calls_started == MAX_CALL_STARTS
        step = decide(started(MAX_CALL_STARTS), req, NOW)
        assert isinstance(step, Finish) and (step.status, step.reason, step.round) == (
            "BLOCKED", "calls_unrecorded", 1) and step.durable
        for other in ({"round": 2}, {"attempt_id": "other"}, {"status": "BLOCKED"},
                      {"phase": "GENERATING_HYPOTHESES"}):
            step = decide(started(MAX_CALL_STARTS, **other), req, NOW)
            assert isinstance(step, RunRound) and step.calls_started == 1, other

    def test_a_new_attempt_id_after_a_rejection_runs_a_round(self) -> None:
        state = _state(rounds=(_round(1, "answer"),), last_round={"attempt_hash": DEFAULT_HASH},
                       rejected=frozenset({DEFAULT_HASH}))
        step = decide(state, attrs.evolve(REQ, attempt_id="second"), NOW)
        assert isinstance(step, RunRound) and step.round == 2
        assert step.attempt_hash == state.attempt("second") != DEFAULT_HASH

    def test_due_is_read_from_the_round_record_not_memory(self) -> None:
        """The same state, judged at two times: before and after its due time."""
        state = _state(rounds=(_round(1, "unavailable"),), last_round=_due(NOW))
        assert isinstance(decide(state, REQ, NOW - 0.001), Finish)
        assert isinstance(decide(state, REQ, NOW), RunRound)


class TestAttemptHash:
    def test_binds_every_input(self) -> None:
        """Changing any bound input changes the attempt hash."""
        base = dict(package_id="p", phase="INTERPRETING_CASE", revision=1, attempt_id="a",
                    prompt_id="interpretation_v1", prompt_sha256="1" * 64,
                    context_sha256="2" * 64, policy_sha256="3" * 64)
        h = attempt_hash(**base)  # type: ignore[arg-type]
        for key, other in [("package_id", "q"), ("phase", "GENERATING_HYPOTHESES"),
                           ("revision", 2), ("attempt_id", "b"), ("prompt_id", "x"),
                           ("prompt_sha256", "4" * 64), ("context_sha256", "5" * 64),
                           ("policy_sha256", "6" * 64)]:
            assert attempt_hash(**{**base, key: other}) != h, key  # type: ignore[arg-type]


class TestRoundNames:
    def test_the_current_series_and_rejections_from_file_names(self) -> None:
        prefix = "analysis/interpretation/0001/"
        paths = [f"{prefix}rounds/0001-0001.unavailable.json",
                 f"{prefix}rounds/0001-0002.unavailable.json",
                 f"{prefix}unblocks/0002.json",
                 f"{prefix}rounds/0002-0001.answer.json",
                 f"{prefix}errors/{'a' * 64}.json",
                 f"{prefix}rounds/not-a-round.json", f"{prefix}policy.json"]
        series, rounds, rejected = parse_rounds(paths, prefix)
        assert series == 2
        assert [(r.round, r.outcome) for r in rounds] == [(1, "answer")]
        assert rejected == frozenset({"a" * 64})
