"""Case operations a person (or a policy) performs between dispatches: confirm an
interpretation, reopen a case in a new analysis revision, unblock a phase whose rounds are
exhausted. Each is one generation, refused (``PhaseRefused``, nothing written) when the
durable state does not allow it."""

from __future__ import annotations

from .._canonical import artifact_json, utc_now_iso
from .._errors import PhaseRefused, UsageError
from .._store import BytesSource, CaseStatus, Change
from .._store._manifest import MAX_REVISION
from .._text import is_blank, is_utf8
from ._interpretation import PHASE as INTERPRETATION_PHASE
from ._interpretation import artifact_paths, confirmation_bytes, interpretation_problems
from ._protocol import blocked_series, exhausted_by, parse_rounds, phase_dir
from ._records import person
from ._revisions import revision_path
from ._spec import PhaseSpec
from ._view import PackageView, remember_written

REOPENED = "REOPENED"


def _reason(text: str) -> str:
    if is_blank(text) or len(text) > 4096 or not is_utf8(text):
        raise UsageError("--reason must be a non-blank text of at most 4096 characters")
    return text


def confirm_change(view: PackageView, by: str) -> tuple[Change, CaseStatus] | None:
    """Confirm the current revision's accepted interpretation, binding its hash; ``None``
    if it is confirmed already (confirming again changes nothing)."""
    rev = view.manifest.analysis_revision
    p = artifact_paths(rev)
    if not view.has(p["interpretation"]):
        raise PhaseRefused(f"revision {rev} of case {view.manifest.case_id!r} has no accepted "
                           "interpretation to confirm", reason="no_interpretation",
                           hint=f"Run 'viano interpret {view.manifest.case_id}' first.")
    problems = interpretation_problems(view, rev)
    if problems:
        raise PhaseRefused(f"the interpretation of revision {rev} does not verify: "
                           f"{'; '.join(problems)}", reason="interpretation_mismatch",
                           hint="Run 'viano verify' on the case.")
    if view.has(p["confirmation"]):
        return None
    sha = view.sha(p["interpretation"])
    assert sha is not None
    change = remember_written(Change(files={p["confirmation"]: BytesSource.of(
        confirmation_bytes(rev, p["interpretation"], sha, person(by)))},
        pointers={"interpretation_confirmation": p["confirmation"]}))
    return change, CaseStatus(status="READY", phase=view.manifest.phase, reason="confirmed")


def reopen_change(view: PackageView, reason: str, by: str) -> tuple[Change, CaseStatus]:
    """A new analysis revision: everything earlier stays, byte for byte; the new revision
    needs its own interpretation and confirmation, and gets fresh budgets."""
    _reason(reason)
    m = view.manifest
    new = m.analysis_revision + 1
    if new > MAX_REVISION:
        raise PhaseRefused(f"case {m.case_id!r} is at analysis revision "
                           f"{m.analysis_revision}, the last there can be",
                           reason="revision_limit",
                           hint="Nothing was written. Take the case in again as a new case "
                                "(viano intake) to analyse it afresh.")
    path = revision_path(new)
    doc = {"format": "viano-revision/1", "analysis_revision": new,
           "previous_revision": m.analysis_revision, "previous_phase": m.phase,
           "reason": reason, "reopened_by": person(by), "reopened_at": utc_now_iso()}
    change = Change(files={path: BytesSource.of(artifact_json(doc))},
                    pointers={"revision": path}, phase=REOPENED, analysis_revision=new)
    return remember_written(change), CaseStatus(status="READY", phase=REOPENED, reason="reopened")


def unblock_change(view: PackageView, spec: PhaseSpec, by: str, *,
                   max_rounds: int | None = None) -> tuple[Change, CaseStatus]:
    """After BLOCKED rounds_exhausted: allow a new series of rounds, recorded (who, when,
    after which series).

    A series is exhausted when its last round says so (it was blocked by the limit of its
    time), or when ``max_rounds`` — the configured limit, lowered since — is no more than
    its unavailable rounds: dispatch then answers BLOCKED too, and the unblock records the
    limit it went by, which the history audit checks against the rounds."""
    m = view.manifest
    base = phase_dir(spec.key, m.analysis_revision)
    series, rounds, _ = parse_rounds(sorted(m.paths_under(base)), base)
    last = view.read_object(rounds[-1].path) if rounds else {}
    blocked = blocked_series(last if isinstance(last, dict) else None)
    by_limit = not blocked and max_rounds is not None and exhausted_by(max_rounds, rounds)
    if not (blocked or by_limit):
        raise PhaseRefused(f"case {m.case_id!r} has no exhausted series of rounds in "
                           f"{spec.phase}", reason="not_blocked",
                           hint="Only a phase whose rounds are exhausted can be unblocked. A "
                                "case BLOCKED calls_unrecorded needs no unblock: run 'viano "
                                "interpret CASE' or 'viano hypothesize CASE' again.")
    path = f"{base}unblocks/{series + 1:04d}.json"
    doc: dict[str, object] = {
        "format": "viano-unblock/1", "phase": spec.phase,
        "analysis_revision": m.analysis_revision, "series": series + 1,
        "after_series": series, "after_rounds": len(rounds),
        "unblocked_by": person(by), "unblocked_at": utc_now_iso()}
    if by_limit:
        doc["exhausted_by_max_rounds"] = max_rounds
    change = Change(files={path: BytesSource.of(artifact_json(doc))})
    return remember_written(change), CaseStatus(status="READY", phase=spec.phase,
                                                reason="unblocked")


__all__ = ["INTERPRETATION_PHASE", "REOPENED", "confirm_change", "person", "reopen_change",
           "unblock_change"]
