"""The LLM phases: the durable protocol they share (written once), case interpretation,
and the case operations between dispatches."""

import itertools
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import BinaryIO, cast

from .._errors import ImportRejected
from .._store import BlobSource, Manifest, PackageCheck, Store
from .._store._blobs import verified_stream
from .._store._sources import read_verified
from . import _hypotheses, _interpretation
from ._case import reading_bound as reading_bound
from ._history import history_problems as history_problems
from ._history import pointer_problems, stray_revisions
from ._hypotheses import HypothesesSpec as HypothesesSpec
from ._hypotheses import batch_problems as batch_problems
from ._hypotheses import hypothesis_policy as hypothesis_policy
from ._hypotheses import normalized as normalized
from ._hypotheses import validate_hypotheses as validate_hypotheses
from ._interpretation import InterpretationSpec as InterpretationSpec
from ._interpretation import interpretation_policy as interpretation_policy
from ._interpretation import interpretation_problems as interpretation_problems
from ._interpretation import validate_interpretation as validate_interpretation
from ._operations import REOPENED as REOPENED
from ._operations import confirm_change as confirm_change
from ._operations import person as person
from ._operations import reopen_change as reopen_change
from ._operations import unblock_change as unblock_change
from ._prompts import PromptText as PromptText
from ._prompts import load_prompt as load_prompt
from ._protocol import BLOCKED as BLOCKED
from ._protocol import COMPLETED as COMPLETED
from ._protocol import DEFERRED as DEFERRED
from ._protocol import ERROR as ERROR
from ._protocol import EXIT_CODES as EXIT_CODES
from ._protocol import RETRY_PENDING as RETRY_PENDING
from ._protocol import DispatchRequest as DispatchRequest
from ._protocol import DispatchResult as DispatchResult
from ._protocol import Enter as Enter
from ._protocol import Finish as Finish
from ._protocol import Judge as Judge
from ._protocol import PhaseState as PhaseState
from ._protocol import Refusal as Refusal
from ._protocol import RoundInfo as RoundInfo
from ._protocol import RunRound as RunRound
from ._protocol import Step as Step
from ._protocol import attempt_hash as attempt_hash
from ._protocol import decide as decide
from ._protocol import due_delay as due_delay
from ._protocol import phase_dir as phase_dir
from ._records import policy_like as policy_like
from ._report import report_document as report_document
from ._report import report_markdown as report_markdown
from ._revisions import revision_path, revision_record_problems
from ._runner import enter_change as enter_change
from ._runner import judge_change as judge_change
from ._runner import load_state as load_state
from ._runner import prompt_for as prompt_for
from ._runner import round_change as round_change
from ._runner import running as running
from ._spec import Accepted as Accepted
from ._spec import PhaseSpec as PhaseSpec
from ._spec import Problem as Problem
from ._spec import paths
from ._stats import provider_statistics as provider_statistics
from ._view import HistoryProblem as HistoryProblem
from ._view import PackageView as PackageView
from ._view import reserve_documents as reserve_documents
from ._view import store_errors_first as store_errors_first

INTERPRETATION_PHASE = _interpretation.PHASE
HYPOTHESES_PHASE = _hypotheses.PHASE
interpretation_paths = _interpretation.artifact_paths
hypotheses_paths = _hypotheses.artifact_paths
INTERPRETATION = InterpretationSpec()
HYPOTHESES = HypothesesSpec()
# In the order a case goes through them.
SPECS: dict[str, PhaseSpec] = {INTERPRETATION.phase: INTERPRETATION,
                               HYPOTHESES.phase: HYPOTHESES}


def _check_phases(store: Store, manifests: Sequence[Manifest]) -> list[str]:
    """verify's phase-level check: every phase's history of every revision audited (the
    layout, the pinned inputs derived again, each round's bindings, series and rejections,
    and the accepted artifacts re-derived from their answer), and the phases' pointers."""
    return _phase_problems(store.read_blob, store.open_blob, manifests)


def import_problems(manifests: Sequence[Manifest], blobs: Mapping[str, BlobSource]
                    ) -> list[str]:
    """verify's phase-level check on a history about to be imported, its blobs read from
    the export (whole ones hashed again; excerpts read in place, as verify reads them from a
    store): a history that verify would report is refused before anything of it is
    written, as a local publication of it would have been. An export that changes while
    it is read is refused too (``input_changed``), never an internal error."""
    def read(sha: str) -> bytes:
        source = blobs.get(sha)
        with _export_read(f"blob {sha[:12]}…"):
            data = None if source is None else read_verified(source)
        if data is None:
            raise ImportRejected(f"blob {sha[:12]}… is not in the export as its hash says")
        return data

    def open_(sha: str) -> BinaryIO:
        source = blobs.get(sha)
        if source is None:
            raise ImportRejected(f"blob {sha[:12]}… is not in the export")
        with _export_read(f"blob {sha[:12]}…"):
            return verified_stream(cast(BinaryIO, _Guarded(source.open(), sha)), sha)

    with _export_read("a blob"):
        return _phase_problems(read, open_, manifests)


_CHANGED = (OSError, EOFError, zipfile.BadZipFile, zlib.error)


@contextmanager
def _export_read(what: str) -> Iterator[None]:
    try:
        yield
    except _CHANGED as exc:
        raise ImportRejected(f"{what} could not be read from the export as it was "
                             f"validated ({type(exc).__name__})", reason="input_changed",
                             hint="Do not modify the export while Viano reads it; run the "
                                  "command again.") from exc


class _Guarded:
    """A member stream whose read errors (the zip replaced meanwhile) are refusals."""

    def __init__(self, inner: BinaryIO, sha: str):
        self._inner, self._sha = inner, sha

    def read(self, n: int = -1) -> bytes:
        with _export_read(f"blob {self._sha[:12]}…"):
            return self._inner.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        with _export_read(f"blob {self._sha[:12]}…"):
            return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def close(self) -> None:
        self._inner.close()


def _phase_problems(read: Callable[[str], bytes], open_: Callable[[str], BinaryIO],
                    manifests: Sequence[Manifest]) -> list[str]:
    if not manifests:
        return []
    view = PackageView(manifests[-1], read, open_)
    out: list[str] = _intake_problems(view, manifests[0])
    if _made_by_intake(manifests[0], manifests[-1]):
        out += _revision_problems(view, manifests) + _phase_changes(manifests)
    for spec in SPECS.values():
        for rev in range(1, manifests[-1].analysis_revision + 1):
            out += [f"revision {rev}: {p}" for p in history_problems(spec, view, rev)]
        out += stray_revisions(spec, view) + pointer_problems(spec, view)
    return out


INTAKE_POINTERS = {"catalogue": "case/catalogue.json", "intake": "case/intake.json"}


def _intake_problems(view: PackageView, first: Manifest) -> list[str]:
    """The package begins as intake made it, and its originals are the ones its intake
    record lists: generation 1 is phase INTAKE at revision 1, holding only the originals
    (``inputs/``) and the two case documents its pointers name; the intake record names
    the package's own case (a history given another case id, every hash made to match,
    still says whose case it was), and it lists exactly the package's originals, with
    their hashes and sizes. An export could otherwise bring a case that verify passes and
    no phase can work on (no catalogue), or whose originals are not those of its record."""
    m = view.manifest
    out: list[str] = []
    if not _made_by_intake(first, m):
        return []  # a package of the store's own API (an embedding's, a benchmark's)
    if first.package_generation != 1:
        return [f"the history starts at generation {first.package_generation}"]
    if first.phase != "INTAKE" or first.analysis_revision != 1:
        out.append(f"generation 1 is phase {first.phase} at revision "
                   f"{first.analysis_revision}, not an intake (INTAKE, revision 1)")
    for where, manifest in (("generation 1", first), ("the head", m)):
        pointers = {k: manifest.pointers.get(k) for k in INTAKE_POINTERS}
        if pointers != INTAKE_POINTERS:
            out.append(f"{where} points catalogue and intake at {pointers}, not at "
                       f"{INTAKE_POINTERS}")
    extra = sorted(p for p in first.files
                   if not p.startswith("inputs/") and p not in INTAKE_POINTERS.values())
    if extra:
        out.append(f"generation 1 holds files intake never writes: {', '.join(extra[:5])}")
    path = INTAKE_POINTERS["intake"]
    try:
        record = view.read_object(path)
        catalogue = view.read_object(INTAKE_POINTERS["catalogue"])
    except HistoryProblem as exc:
        return [*out, str(exc)]
    if record.get("format") != "viano-intake/1":
        out.append(f"{path} is not an intake record (format {record.get('format')!r})")
    if catalogue.get("format") != "viano-catalogue/1" or \
            not isinstance(catalogue.get("sources"), list):
        out.append(f"{INTAKE_POINTERS['catalogue']} is not a catalogue with its sources")
    named = record.get("case_id")
    if named != m.case_id:
        out.append(f"{path} names case {named!r}, but the package is case {m.case_id!r}")
    listed: dict[str, tuple[object, object]] = {}
    inputs = record.get("inputs")
    for item in inputs if isinstance(inputs, list) else ():
        if isinstance(item, dict) and isinstance(item.get("input"), str):
            listed[item["input"]] = (item.get("sha256"), item.get("size"))
    if not isinstance(inputs, list) or len(listed) != len(inputs):
        out.append(f"{path} does not list its inputs one by one")
    held = {p: (m.files[p].sha256, m.files[p].size) for p in m.paths_under("inputs/")}
    if held != listed:
        unlisted = sorted(set(held) - set(listed))
        missing = sorted(set(listed) - set(held))
        other = sorted(p for p in set(held) & set(listed) if held[p] != listed[p])
        out.append(f"the package's originals are not those {path} lists (not listed: "
                   f"{unlisted[:3]}, missing: {missing[:3]}, other bytes: {other[:3]})")
    return out


def _revision_problems(view: PackageView, manifests: Sequence[Manifest]) -> list[str]:
    """Every analysis revision after the first was made by ``reopen``: in the generation
    that raised the revision by one, which added its record, and no other record is
    there (the head's part: :func:`revision_record_problems`). An import could otherwise
    plant a later revision's record (the case could then never be reopened: the path is
    write-once), raise the revision with no record, or point ``revision`` anywhere; verify
    passed them all."""
    out = revision_record_problems(view)
    for parent, child in itertools.pairwise(manifests):
        rev = child.analysis_revision
        if rev == parent.analysis_revision:
            continue
        path = revision_path(rev)
        if rev != parent.analysis_revision + 1 or path in parent.files or \
                path not in child.files or child.phase != REOPENED:
            out.append(f"generation {child.package_generation} raised the revision from "
                       f"{parent.analysis_revision} to {rev} without reopening it")
    return out


OWN_PHASES = frozenset({"INTAKE", REOPENED, *SPECS})


def _phase_changes(manifests: Sequence[Manifest]) -> list[str]:
    """A generation changes the case's phase to one of Viano's own only as the phases do:
    it enters a phase (writing that phase's policy for its revision), or it reopens the
    case (checked with the revisions). An import could set the head's phase to INTAKE on
    a finished case, or flip it with nothing else changed, and verify passed it (status
    then said INTAKE). A phase of another name is an embedding's (the store's API takes
    any), and a store written so before stays valid."""
    out: list[str] = []
    for parent, child in itertools.pairwise(manifests):
        if child.phase == parent.phase or child.phase not in OWN_PHASES:
            continue
        if child.phase == REOPENED:
            if child.analysis_revision == parent.analysis_revision:
                out.append(f"generation {child.package_generation} is REOPENED without a "
                           "new revision")
            continue
        spec = SPECS.get(child.phase)
        policy = paths(spec, child.analysis_revision)["policy"] if spec else None
        if policy is None or policy in parent.files or policy not in child.files:
            out.append(f"generation {child.package_generation} changed the phase from "
                       f"{parent.phase} to {child.phase} without entering it")
    return out


def _made_by_intake(first: Manifest, head: Manifest) -> bool:
    """Whether a package says it is a case that intake made and the phases work on: it has
    an intake pointer, one of intake's two case documents, or a phase's artifact. A
    package published through the store's own API with none of those (an embedding's, a
    benchmark's) is the store's business only; the phases refuse to work on it
    (``unsupported_history``)."""
    return any(k in mf.pointers for mf in (first, head) for k in INTAKE_POINTERS) or \
        any(p in head.files for p in INTAKE_POINTERS.values()) or \
        any(p.startswith("analysis/") for p in head.files)


PHASE_CHECKS: Sequence[PackageCheck] = (_check_phases,)
