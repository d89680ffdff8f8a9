"""Analysis revisions: each after the first is opened by ``reopen``, which writes its
record. What the head shows of that (the records and the ``revision`` pointer) is checked
before every dispatch and by verify; verify also checks, generation by generation, that
only a reopen raised the revision (``engine._phases._revision_problems``)."""

from __future__ import annotations

from ._records import recorded_at_ok, recorded_by_ok
from ._view import HistoryProblem, PackageView

REVISIONS = "analysis/revisions/"


def revision_path(revision: int) -> str:
    return f"{REVISIONS}{revision:04d}.json"


def revision_record_problems(view: PackageView) -> list[str]:
    """What of the head's revision records is not as reopen leaves it: one record per
    revision after the first, each the record reopen writes, no other, and the
    ``revision`` pointer on the current one. A generation published through the store's
    API that only raised the revision (no reopen, no record) got a second hypothesis
    batch and allocation in the process that published it; verify alone saw it."""
    m = view.manifest
    out: list[str] = []
    wanted = {revision_path(r): r for r in range(2, m.analysis_revision + 1)}
    stray = sorted(p for p in m.paths_under(REVISIONS) if p not in wanted)
    if stray:
        out.append(f"{', '.join(stray[:3])} {'is' if len(stray) == 1 else 'are'} no record "
                   f"of a revision reopened before revision {m.analysis_revision}")
    pointer = m.pointers.get("revision")
    expected = revision_path(m.analysis_revision) if m.analysis_revision > 1 else None
    if pointer != expected:
        out.append(f"the revision pointer is {pointer!r}, not {expected!r}")
    for path, rev in wanted.items():
        if path not in m.files:
            out.append(f"revision {rev} has no record of its reopening ({path})")
            continue
        try:
            doc = view.read_object(path)
        except HistoryProblem as exc:
            out.append(str(exc))
            continue
        fields = {"format": "viano-revision/1", "analysis_revision": rev,
                  "previous_revision": rev - 1}
        wrong = [k for k, v in fields.items() if doc.get(k) != v or type(doc.get(k)) is not
                 type(v)]
        wrong += [k for k in ("previous_phase", "reason") if not isinstance(doc.get(k), str)]
        wrong += [] if recorded_by_ok(doc.get("reopened_by")) else ["reopened_by"]
        wrong += [] if recorded_at_ok(doc.get("reopened_at")) else ["reopened_at"]
        if wrong:
            out.append(f"{path} is not the record reopen writes ({', '.join(wrong)})")
    return out
