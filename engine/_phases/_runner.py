"""The phase runner's durable records: what each step publishes (a :class:`Change` and the
case's new durable status), for any phase that implements :class:`PhaseSpec`.

Pure functions over a :class:`PackageView` (whose reader is the store's, called on a worker
thread by the case actor). The case actor carries the steps out; nothing here knows about
trio, actors or the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._canonical import artifact_json, sha256_hex, utc_now_iso
from .._gateway import (
    AuditRecord,
    FailureClass,
    InvalidAnswer,
    Prompt,
    RoundOutcome,
    RoundStatus,
    extract_content,
    parse_contracted_json,
)
from .._gateway._wire import EnvelopeError
from .._store import BytesSource, CaseStatus, Change, iso_utc
from ._history import history_problems, pinned_inputs, pointer_problems
from ._prompts import PromptText, load_prompt
from ._protocol import (
    BLOCKED,
    COMPLETED,
    ERROR,
    RETRY_PENDING,
    DispatchRequest,
    Judge,
    PhaseState,
    Refusal,
    RunRound,
    due_delay,
    parse_rounds,
    phase_dir,
    round_path,
)
from ._revisions import revision_record_problems
from ._spec import Accepted, PhaseSpec, Problem, paths, policy_bytes
from ._view import HistoryProblem, PackageView, remember_written


def load_state(spec: PhaseSpec, view: PackageView, status: CaseStatus | None,
               request: DispatchRequest) -> PhaseState:
    """Read what :func:`decide` needs from one generation."""
    m = view.manifest
    rev = m.analysis_revision
    p = paths(spec, rev)
    prompt = load_prompt(spec.prompt_id)
    base = phase_dir(spec.key, rev)
    series, rounds, rejected = parse_rounds(sorted(m.paths_under(base)), base)
    problems = history_problems(spec, view, rev) + pointer_problems(spec, view)
    history = "; ".join(problems) if problems else None
    last_doc = None
    if rounds and history is None:
        last_doc = view.read_object(rounds[-1].path)
    entered = view.has(p["policy"]) and view.has(p["context"])
    return PhaseState(
        key=spec.key, phase=spec.phase, package_id=m.package_id, revision=rev,
        entered=entered, accepted=history is None and spec.accepted(view, rev),
        history_problem=history, precheck=_precheck(spec, view),
        pinned_policy_sha=view.sha(p["policy"]),
        current_policy_sha=sha256_hex(policy_bytes(spec, rev, spec.policy(request))),
        context_sha=view.sha(p["context"]), prompt_id=prompt.prompt_id,
        prompt_sha=prompt.sha256, series=series, rounds=tuple(rounds), rejected=rejected,
        last_round=last_doc, status=status)


def _precheck(spec: PhaseSpec, view: PackageView) -> Refusal | None:
    """The head's revision records first (a generation that raised the revision with no
    reopen would otherwise get that revision's phases, batch and budgets), then the
    phase's own preconditions."""
    revisions = revision_record_problems(view)
    if revisions:
        return Refusal(ERROR, "unsupported_history", "; ".join(revisions))
    try:
        return spec.precheck(view)
    except HistoryProblem as exc:
        return Refusal(ERROR, "unsupported_history", str(exc))


# -- enter ------------------------------------------------------------------------------

def enter_change(spec: PhaseSpec, view: PackageView, request: DispatchRequest
                 ) -> tuple[Change, CaseStatus] | Refusal:
    """Generation 1 of a phase: the pinned policy and the context, and the intent of round
    1's first call (so a crash during that call is counted)."""
    rev = view.manifest.analysis_revision
    policy = spec.policy(request)
    context = spec.context(view, policy, rev)
    if isinstance(context, Refusal):
        return context
    p = paths(spec, rev)
    change = Change(files={p["policy"]: BytesSource.of(policy_bytes(spec, rev, policy)),
                           p["context"]: BytesSource.of(context)},
                    pointers={f"{spec.pointer_prefix}_policy": p["policy"],
                              f"{spec.pointer_prefix}_context": p["context"]},
                    phase=spec.phase)
    return remember_written(change), running(spec, 1, request.attempt_id, 1)


def running(spec: PhaseSpec, round_no: int, attempt_id: str, calls: int) -> CaseStatus:
    return CaseStatus(status="RUNNING", phase=spec.phase, reason="calling_model",
                      round=round_no, attempt_id=attempt_id, calls_started=calls)


# -- a round ----------------------------------------------------------------------------

def prompt_for(spec: PhaseSpec, view: PackageView) -> Prompt:
    """The exact model request of this phase: the versioned prompt, and context.json as
    the user message, byte for byte as pinned."""
    prompt: PromptText = load_prompt(spec.prompt_id)
    context = view.read(paths(spec, view.manifest.analysis_revision)["context"])
    return Prompt(prompt_id=spec.prompt_id, system=prompt.text,
                  user=context.decode("utf-8"), schema=dict(spec.schema()),
                  case_id=view.manifest.case_id)


@attrs.frozen
class RoundRecord:
    change: Change
    status: CaseStatus
    result_status: str
    reason: str
    message: str
    due_at: float | None


def round_change(spec: PhaseSpec, view: PackageView, step: RunRound, outcome: RoundOutcome,
                 request: DispatchRequest, *, now: float, started_at: str) -> RoundRecord:
    """The round record (and its request bodies) for what the gateway returned, with the
    durable status it leads to."""
    rev = view.manifest.analysis_revision
    kind = outcome.status.value
    path = round_path(spec.key, rev, step.series, step.round, kind)
    files: dict[str, BytesSource] = {}
    attempts = [_audit(spec, rev, a, files) for a in outcome.attempts]
    retry: dict[str, Any] | None = None
    unavailable = sum(r.outcome == "unavailable" for r in _series(spec, view, step.series))
    max_rounds = request.retry.max_rounds
    due: float | None = None
    if outcome.status is RoundStatus.UNAVAILABLE:
        unavailable += 1
        if unavailable < max_rounds:
            delay = due_delay(unavailable, request.retry)
            due = now + delay
            retry = {"max_rounds": max_rounds, "unavailable_rounds": unavailable,
                     "delay_s": delay, "due_at": iso_utc(due), "due_at_posix": due}
        else:
            retry = {"max_rounds": max_rounds, "unavailable_rounds": unavailable,
                     "blocked": True}
    answer = None
    content = outcome.content
    if content is None and outcome.status is RoundStatus.INVALID_ANSWER:
        content = invalid_content(outcome)
    if content is not None:
        raw = content.encode("utf-8")
        answer = {"content": content, "sha256": sha256_hex(raw), "bytes": len(raw)}
    doc = {"format": "viano-round/1", "phase": spec.phase, "analysis_revision": rev,
           "series": step.series, "round": step.round, "attempt_id": step.attempt_id,
           "attempt_hash": step.attempt_hash, "calls_started": step.calls_started,
           "inputs": pinned_inputs(view, spec, rev),
           "outcome": kind, "provider": outcome.provider, "answer": answer, "retry": retry,
           "attempts": attempts, "started_at": started_at, "finished_at": utc_now_iso()}
    files[path] = BytesSource.of(artifact_json(doc))
    change = remember_written(Change(files=files,
                                     pointers={f"{spec.pointer_prefix}_last_round": path}))
    why = "; ".join(f"{a.provider}: {a.detail}" + (f" ({a.error})" if a.error else "")
                    for a in outcome.attempts)
    return _round_result(spec, change, outcome.status, step, max_rounds, unavailable, due,
                         why)


def invalid_content(outcome: RoundOutcome) -> str | None:
    """What came back in a round the gateway classed invalid (prose around the JSON, two
    objects, a list, ...), so that the round record keeps it for people (``viano cat``)
    and the rejection can name it by hash: the gateway's answer content when it gives one,
    else the content read out of the last attempt's audit record — already secret-masked,
    and only when the record holds the whole response (not cut at the audit limit, not
    over max_output_bytes, an envelope that carries content). ``None`` otherwise: the
    audit record's response body is then all there is."""
    if outcome.content is not None:
        return outcome.content
    record = outcome.attempts[-1] if outcome.attempts else None
    if record is None or record.failure is not FailureClass.INVALID_ANSWER or \
            record.response_truncated:
        return None
    if record.kind == "fixture":
        return record.response_body
    try:
        return extract_content(record.kind, record.response_body.encode("utf-8"))
    except EnvelopeError:
        return None


def _round_result(spec: PhaseSpec, change: Change, kind: RoundStatus, step: RunRound,
                  max_rounds: int, unavailable: int, due: float | None,
                  why: str) -> RoundRecord:
    def status(value: str, reason: str, due_at: float | None = None) -> CaseStatus:
        return CaseStatus(status=value, phase=spec.phase, reason=reason, round=step.round,
                          max_rounds=max_rounds, due_at=due_at, attempt_id=step.attempt_id)

    if kind is RoundStatus.UNAVAILABLE and due is not None:
        return RoundRecord(change, status("RETRY_PENDING", "providers_unavailable", due),
                           RETRY_PENDING, "providers_unavailable",
                           f"no provider was available in round {step.round} of "
                           f"{max_rounds}; the next round is due at {iso_utc(due)}", due)
    if kind is RoundStatus.UNAVAILABLE:
        return RoundRecord(change, status("BLOCKED", "rounds_exhausted"), BLOCKED,
                           "rounds_exhausted",
                           f"round {step.round} was the last of {max_rounds} "
                           f"({unavailable} without an available provider); 'viano unblock' "
                           "allows a new series", None)
    if kind is RoundStatus.CONFIGURATION:
        return RoundRecord(change, status("ERROR", "provider_configuration"), ERROR,
                           "provider_configuration",
                           f"every provider refused the request ({why or 'no attempts'}): "
                           "fix the provider configuration; no retry is scheduled", None)
    return RoundRecord(change, status("RUNNING", "answer_checkpointed"), COMPLETED,
                       "answer_checkpointed", "the answer is checkpointed", None)


def _series(spec: PhaseSpec, view: PackageView, series: int) -> Sequence[Any]:
    base = phase_dir(spec.key, view.manifest.analysis_revision)
    current, rounds, _ = parse_rounds(sorted(view.manifest.paths_under(base)), base)
    return rounds if current == series else []


def _audit(spec: PhaseSpec, revision: int, record: AuditRecord,
           files: dict[str, BytesSource]) -> dict[str, Any]:
    """An audit record with its request body moved to requests/<sha>.json (the same body
    goes to every attempt of a round and every round of a phase: stored once)."""
    doc = record.to_json()
    body = doc.pop("request_body")
    if body:
        raw = body.encode("utf-8")
        sha = sha256_hex(raw)
        path = f"{phase_dir(spec.key, revision)}requests/{sha}.json"
        files[path] = BytesSource.of(raw)
        doc["request_body"] = {"path": path, "sha256": sha, "bytes": len(raw)}
    else:
        doc["request_body"] = None
    return doc


# -- judging the checkpointed answer ---------------------------------------------------

@attrs.frozen
class Verdict:
    change: Change
    status: CaseStatus
    result_status: str
    reason: str
    message: str


def judge_change(spec: PhaseSpec, view: PackageView, step: Judge, request: DispatchRequest
                 ) -> Verdict:
    """Accept the checkpointed answer (its artifacts and pointers together), or reject it:
    ``errors/<attempt-hash>.json`` and nothing else."""
    doc = step.document
    attempt_hash = str(doc.get("attempt_hash", ""))
    problems = _problems_of(spec, view, doc)
    if not problems:
        parsed = _parse_answer(doc)
        accepted = spec.accept(parsed, view, step.round.path, request)
        if isinstance(accepted, Accepted):
            files = {p: BytesSource.of(b) for p, b in accepted.files.items()}
            status = CaseStatus(status="READY" if accepted.more_work else "COMPLETED",
                                phase=spec.phase, reason=accepted.reason,
                                attempt_id=str(doc.get("attempt_id")))
            return Verdict(remember_written(Change(files=files, pointers=accepted.pointers)),
                           status, COMPLETED, accepted.reason, accepted.message)
        problems = [Problem(accepted.reason, "", accepted.message)]
    base = phase_dir(spec.key, view.manifest.analysis_revision)
    path = f"{base}errors/{attempt_hash}.json"
    errors = {"format": "viano-rejection/1", "phase": spec.phase,
              "analysis_revision": view.manifest.analysis_revision,
              "attempt_id": doc.get("attempt_id"), "attempt_hash": attempt_hash,
              "round": {"path": step.round.path, "sha256": view.sha(step.round.path)},
              "answer_sha256": (doc.get("answer") or {}).get("sha256"),
              "errors": [p.to_json() for p in problems]}
    reason = problems[0].rule if problems[0].rule == "limit_exceeded" else "invalid_answer"
    status = CaseStatus(status="ERROR", phase=spec.phase, reason=reason,
                        attempt_id=str(doc.get("attempt_id")))
    first = problems[0]
    return Verdict(remember_written(Change(
                       files={path: BytesSource.of(artifact_json(errors))},
                       pointers={f"{spec.pointer_prefix}_last_rejection": path})),
                   status, ERROR, reason,
                   f"the answer was rejected ({len(problems)} problem(s); first: {first.rule} "
                   f"at '{first.pointer or '/'}': {first.message}); see {path}. Correct it "
                   "with a new --attempt-id")


def _problems_of(spec: PhaseSpec, view: PackageView, doc: Mapping[str, Any]) -> list[Problem]:
    answer = doc.get("answer")
    if doc.get("outcome") != "answer" or not isinstance(answer, dict):
        detail = next((a.get("detail") for a in reversed(doc.get("attempts") or [])
                       if isinstance(a, dict)), "invalid_answer")
        if detail == "output_limit_exceeded":
            return [Problem("limit_exceeded", "", "the answer is longer than the pinned "
                                                  "max_output_bytes; nothing is truncated")]
        return [Problem("contracted_json", "", f"the content is not the contracted JSON "
                                               f"({detail})")]
    content = answer.get("content")
    if not isinstance(content, str) or sha256_hex(content.encode("utf-8")) != answer.get(
            "sha256"):
        raise HistoryProblem("the checkpointed answer does not match its recorded sha256")
    try:
        parsed = parse_contracted_json(content)
    except InvalidAnswer as exc:
        return [Problem("contracted_json", "", str(exc))]
    return spec.validate(parsed, view)


def _parse_answer(doc: Mapping[str, Any]) -> Any:
    return parse_contracted_json(doc["answer"]["content"])
