"""The durable phase protocol, written once for every LLM phase (the spec's CaseLLMRunner).

A phase of an analysis revision lives under ``analysis/<key>/<NNNN>/``::

    policy.json                         the pinned policy (generation 1 of the phase)
    context.json                        the model's input, exactly as sent (idem)
    rounds/<SSSS>-<RRRR>.<outcome>.json a round record: series S, round R, outcome
    requests/<sha256>.json              each distinct request body a round sent
    errors/<attempt-hash>.json          why an attempt's answer was rejected
    unblocks/<SSSS>.json                who allowed series S after a block, and when
    ...                                 the phase's accepted artifacts

Every one of them is write-once. The next step is a pure function of them (plus the case's
durable status, for the at-least-once count, and the clock, for due times):
:func:`decide`. Three generations make a phase on the normal path: **enter** (policy and
context, pinned before the first model request), **round** (the answer checkpointed with
the hashes of its inputs, or the unavailability with the next due time) and **accept**
(the artifacts and their pointers together). A crash anywhere resumes from the last of
them; a checkpointed answer is replayed, never asked for again.

The **attempt hash** binds one attempt to everything that shaped its answer: the package,
the phase, the revision, the attempt id, the prompt id and the sha256 of its text, and the
sha256 of ``context.json`` and of ``policy.json``. ``errors/<attempt-hash>.json`` therefore
names exactly one rejected (attempt, inputs) pair, and the same attempt id can never be
asked again under the same inputs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._canonical import canonical_json, sha256_hex
from .._config import RetryPolicy
from .._gateway import doubled
from .._store import MAX_DUE_AT, CaseStatus, iso_utc

ROUND_FILE = re.compile(
    r"rounds/(\d{4})-(\d{4})\.(answer|unavailable|configuration|invalid)\.json")
_ERRORS = re.compile(r"errors/([0-9a-f]{64})\.json")
UNBLOCK_FILE = re.compile(r"unblocks/(\d{4})\.json")
ATTEMPT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
OUTCOMES = {"answer": "answer", "providers_unavailable": "unavailable",
            "provider_configuration": "configuration", "invalid_answer": "invalid"}

# Dispatch results (CONTRACT.md section 1) and their exit codes.
COMPLETED, RETRY_PENDING, DEFERRED, BLOCKED, ERROR = (
    "COMPLETED", "RETRY_PENDING", "DEFERRED", "BLOCKED", "ERROR")
EXIT_CODES = {COMPLETED: 0, RETRY_PENDING: 10, DEFERRED: 11, BLOCKED: 12, ERROR: 13}


@functools.lru_cache(maxsize=1024)
def phase_dir(key: str, revision: int) -> str:
    """A phase's folder for a revision (remembered: a step asks for it hundreds of times
    per case, py-spy put the formatting at 1% of the engine's CPU)."""
    return f"analysis/{key}/{revision:04d}/"


def round_path(key: str, revision: int, series: int, round_no: int, outcome: str) -> str:
    return f"{phase_dir(key, revision)}rounds/{series:04d}-{round_no:04d}.{OUTCOMES[outcome]}.json"


def attempt_hash(*, package_id: str, phase: str, revision: int, attempt_id: str,
                 prompt_id: str, prompt_sha256: str, context_sha256: str,
                 policy_sha256: str) -> str:
    """See the module docstring: what one attempt is bound to."""
    return sha256_hex(canonical_json({
        "package_id": package_id, "phase": phase, "analysis_revision": revision,
        "attempt_id": attempt_id, "prompt_id": prompt_id, "prompt_sha256": prompt_sha256,
        "context_sha256": context_sha256, "policy_sha256": policy_sha256}))


def due_delay(unavailable_rounds: int, retry: RetryPolicy) -> float:
    """After the k-th unavailable round: base_delay_s * 2**(k-1), capped at max_delay_s."""
    return doubled(retry.base_delay_s, retry.max_delay_s, unavailable_rounds - 1)


@attrs.frozen
class DispatchRequest:
    """What one dispatch of a phase is asked to do, under which runtime policy."""

    policy: Mapping[str, Any]            # the phase's policy as configured now
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    attempt_id: str = "default"
    auto_confirm: bool = False

    def __attrs_post_init__(self) -> None:
        if ATTEMPT_ID.fullmatch(self.attempt_id) is None:
            from .._errors import UsageError

            raise UsageError(f"attempt id {self.attempt_id!r} is not valid",
                             hint="Use 1-64 letters, digits, '.', '_' or '-'.")


@attrs.frozen
class DispatchResult:
    """The result of one dispatch (CONTRACT.md section 1)."""

    case_id: str
    package_id: str
    phase: str
    status: str
    reason: str | None
    message: str
    analysis_revision: int
    package_generation: int
    attempt_id: str
    round: int | None = None
    max_rounds: int | None = None
    due_at: float | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "package_id": self.package_id, "phase": self.phase,
                "status": self.status, "reason": self.reason, "message": self.message,
                "analysis_revision": self.analysis_revision,
                "package_generation": self.package_generation, "attempt_id": self.attempt_id,
                "round": self.round, "max_rounds": self.max_rounds,
                "due_at": None if self.due_at is None else iso_utc(self.due_at)}


@attrs.frozen
class RoundInfo:
    """What a round's file name says (its document is read only when needed)."""

    path: str
    series: int
    round: int
    outcome: str          # answer | unavailable | configuration | invalid


@attrs.frozen
class Refusal:
    """A terminal result that needs no publication."""

    status: str
    reason: str
    message: str


@attrs.frozen
class PhaseState:
    """Everything :func:`decide` needs, read from one generation and the case's status."""

    key: str
    phase: str
    package_id: str
    revision: int
    entered: bool
    accepted: bool
    history_problem: str | None       # the accepted/declared artifacts do not stand up
    precheck: Refusal | None          # a precondition of the phase fails (checked on
                                      # every dispatch, before anything else: before the
                                      # history, before entering, and before reuse)
    pinned_policy_sha: str | None
    current_policy_sha: str
    context_sha: str | None
    prompt_id: str
    prompt_sha: str
    series: int
    rounds: tuple[RoundInfo, ...]     # the current series, in order
    rejected: frozenset[str]          # attempt hashes with an errors file
    last_round: Mapping[str, Any] | None  # the document of the current series' last round
    status: CaseStatus | None

    def attempt(self, attempt_id: str) -> str:
        assert self.context_sha is not None and self.pinned_policy_sha is not None
        return attempt_hash(package_id=self.package_id, phase=self.phase,
                            revision=self.revision, attempt_id=attempt_id,
                            prompt_id=self.prompt_id, prompt_sha256=self.prompt_sha,
                            context_sha256=self.context_sha,
                            policy_sha256=self.pinned_policy_sha)

    @property
    def unavailable_rounds(self) -> int:
        return sum(r.outcome == "unavailable" for r in self.rounds)


# -- steps ------------------------------------------------------------------------------

@attrs.frozen
class Enter:
    """Publish policy.json and context.json (pinning the policy)."""


@attrs.frozen
class RunRound:
    series: int
    round: int
    attempt_id: str
    attempt_hash: str
    calls_started: int                # counting this one (a repeat after a crash is > 1)


@attrs.frozen
class Judge:
    """Validate the checkpointed answer of ``round`` and accept or reject it."""

    round: RoundInfo
    document: Mapping[str, Any]


@attrs.frozen
class Finish:
    """Nothing to publish: the dispatch ends with this result."""

    status: str
    reason: str | None
    message: str
    round: int | None = None
    max_rounds: int | None = None
    due_at: float | None = None
    # Set durably before the dispatch ends: a result derived from the durable status
    # itself, which would otherwise stay as it was (and say the same again for ever).
    durable: bool = False


Step = Enter | RunRound | Judge | Finish

# The starts of one round's model call that may go unrecorded (the process died, was
# interrupted or failed between the call and its record, each time): then the round stops
# BLOCKED ``calls_unrecorded`` rather than pay for the same call again at every restart
# of a crash loop, every retry of an internal error, for ever.
MAX_CALL_STARTS = 5


def decide(state: PhaseState, request: DispatchRequest, now: float) -> Step:
    """The next step of a phase, from durable state alone (no I/O, no event loop)."""
    # The phase's preconditions first (the builder re-verifies the interpretation "before
    # anything else"): a phase's own history is derived from what they check (the
    # hypotheses' context from the interpretation's statements), so an edited
    # interpretation must be named as such, not as the history it no longer derives.
    if state.precheck is not None:  # checked on every dispatch, before any reuse too
        return Finish(state.precheck.status, state.precheck.reason, state.precheck.message)
    if state.history_problem is not None:
        return Finish(ERROR, "unsupported_history", state.history_problem)
    if state.accepted:
        return Finish(COMPLETED, "completed", "the phase is complete; its accepted artifacts "
                                              "are reused")
    if not state.entered:
        return Enter()
    if state.pinned_policy_sha != state.current_policy_sha:
        return Finish(ERROR, "policy_changed", "the configured policy differs from the one "
                                               "pinned for this analysis revision; nothing was "
                                               "reset (start a new revision with 'viano "
                                               "reopen' to use the new policy)")
    last = state.rounds[-1] if state.rounds else None
    if last is not None and last.outcome in ("answer", "invalid") and state.last_round:
        judged = state.last_round.get("attempt_hash") in state.rejected
        if not judged:
            return Judge(last, state.last_round)
    attempt = state.attempt(request.attempt_id)
    if attempt in state.rejected:
        return Finish(ERROR, "attempt_rejected",
                      f"attempt {request.attempt_id!r} was rejected under these inputs; "
                      "correct it with a new --attempt-id (the policy stays pinned)")
    max_rounds = request.retry.max_rounds
    # A series its last round blocked stays blocked until 'viano unblock', whatever the
    # limit is now: a raised max_rounds ran more rounds after it, a history the audit
    # (rightly) refuses, and the case was broken for good.
    if exhausted_by(max_rounds, state.rounds) or (
            last is not None and last.outcome == "unavailable"
            and blocked_series(state.last_round)):
        return Finish(BLOCKED, "rounds_exhausted",
                      f"{state.unavailable_rounds} rounds found no provider available; "
                      "'viano unblock' allows a new series", round=last.round if last else None,
                      max_rounds=max_rounds)
    if last is not None and last.outcome == "unavailable" and state.last_round:
        due = _due(state.last_round)
        if due is not None and now < due:
            return Finish(DEFERRED, "not_due", f"the next round is due at {iso_utc(due)}",
                          round=last.round, max_rounds=max_rounds, due_at=due)
    next_round = (last.round + 1) if last else 1
    calls = 1
    s = state.status
    if s is not None and s.status == "RUNNING" and s.round == next_round and \
            s.attempt_id == request.attempt_id and s.phase == state.phase:
        calls = s.calls_started + 1   # a call of this round was started and never recorded
        if s.calls_started >= MAX_CALL_STARTS:
            return Finish(BLOCKED, "calls_unrecorded",
                          f"round {next_round}'s model call was started {s.calls_started} "
                          "times without a recorded answer (each time the process died, was "
                          "stopped or interrupted, or failed once the call had started); "
                          "stopped so that the call is not paid for again and again. Find "
                          "the cause in the logs, then dispatch the case again by its id",
                          round=next_round, max_rounds=max_rounds, durable=True)
    return RunRound(state.series, next_round, request.attempt_id, attempt, calls)


def _due(doc: Mapping[str, Any]) -> float | None:
    """The due time a round document records, if it is one a writer sets (1970 to 9999):
    a crafted one (1e300, from an import) held the case DEFERRED for ever, and made
    ``batch --wait`` sleep until then. Anything else is no due time: the round is due."""
    retry = doc.get("retry")
    due = retry.get("due_at_posix") if isinstance(retry, dict) else None
    return due if type(due) is float and 0.0 <= due <= MAX_DUE_AT else None


def blocked_series(doc: Mapping[str, Any] | None) -> bool:
    """Whether a round document blocked its series (the limit was reached when it was
    written). One reading for dispatch, ``unblock`` and the history audit."""
    retry = doc.get("retry") if doc else None
    return isinstance(retry, dict) and retry.get("blocked") is True


def exhausted_by(limit: int, rounds: Sequence[RoundInfo]) -> bool:
    """Whether ``limit`` (a ``max_rounds``) exhausts a series: it holds at least ``limit``
    unavailable rounds. One rule for the three that must agree: dispatch answers BLOCKED
    by it, ``unblock`` accepts a series that a since-lowered limit exhausted by it, and
    the history audit checks that unblock by it."""
    return limit >= 1 and sum(r.outcome == "unavailable" for r in rounds) >= limit


def parse_rounds(paths: Sequence[str], prefix: str) -> tuple[int, list[RoundInfo],
                                                               frozenset[str]]:
    """From a phase folder's file names: the current series, its rounds in order, and the
    rejected attempt hashes."""
    series = 1
    rounds: list[RoundInfo] = []
    rejected: set[str] = set()
    for path in paths:
        rel = path[len(prefix):]
        if m := UNBLOCK_FILE.fullmatch(rel):
            series = max(series, int(m.group(1)))
        elif m := _ERRORS.fullmatch(rel):
            rejected.add(m.group(1))
    for path in paths:
        rel = path[len(prefix):]
        if (m := ROUND_FILE.fullmatch(rel)) and int(m.group(1)) == series:
            rounds.append(RoundInfo(path, series, int(m.group(2)), m.group(3)))
    rounds.sort(key=lambda r: r.round)
    return series, rounds, frozenset(rejected)
