"""Batch planning: which requests of a group commit go in, and the rows they write.

A pure function. The backend reads what it needs inside its write transaction (the heads
and owners of the packages and cases named, their head manifests, existing histories for
imports), prepares the blobs (large ones written and fsynced, inline ones read and hashed
from the bytes that will be stored), and calls :func:`plan_batch`; it then writes the rows
that come out. Every SQL statement lives in the backend, so another backend (PostgreSQL)
reuses this unchanged.

Every check of a request happens before anything of it is staged, so a refused request
(stale parent, existing case, changed input, diverged history, a manifest that breaks the
successor rule) contributes nothing. A bug while planning one request fails that request
alone, as an internal error; the others of the batch are unaffected.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import attrs

from .._errors import (
    CaseExists,
    ChangeRejected,
    HistoryConflict,
    ImportRejected,
    StaleGeneration,
    StorageError,
    VianoError,
)
from ._manifest import Manifest, build_manifest, successor_violations
from ._requests import (
    CaseStatus,
    ImportRequest,
    Outcome,
    Published,
    PublishRequest,
    Request,
    StatusRequest,
)

log = logging.getLogger("viano.store")


# The rows are named tuples, not attrs classes: a batch makes several per publication,
# and a tuple's columns bind to SQL as they are.
class Head(NamedTuple):
    """A package's row in the case index as the transaction found it."""

    case_id: str
    generation: int
    status: CaseStatus | None


class GenerationRow(NamedTuple):
    """One generation as the store holds it, in its table's column order."""

    package_id: str
    generation: int
    parent: int | None
    manifest_sha256: str
    manifest: bytes
    phase: str
    created_at: str


class RefRow(NamedTuple):
    """The final state of one package's index row after the batch."""

    package_id: str
    case_id: str
    generation: int
    phase: str
    analysis_revision: int
    updated_at: str
    status: CaseStatus | None


@attrs.frozen
class PlanInput:
    requests: Sequence[Request]
    heads: Mapping[str, Head]                       # package_id -> head
    owners: Mapping[str, str]                       # case_id -> package_id
    parents: Mapping[str, Manifest]                 # package_id -> head manifest
    histories: Mapping[str, Sequence[str]]          # package_id -> manifest sha256 by gen
    refused: Sequence[VianoError | None]            # blob preparation errors, by request
    inline: Mapping[str, bytes]                     # verified inline blob bytes by sha256
    inline_threshold: int                           # larger blobs are files, written already
    now: str


@attrs.define
class BatchRows:
    outcomes: list[Outcome]
    blobs: dict[str, tuple[int, bytes | None]] = attrs.field(factory=dict)  # sha -> size, data
    generations: list[GenerationRow] = attrs.field(factory=list)
    refs: dict[str, RefRow] = attrs.field(factory=dict)
    new_manifests: list[Manifest] = attrs.field(factory=list)
    bytes_written: int = 0  # inline blob and manifest bytes, as they are added


@attrs.define
class _Staged:
    """What one request would add, applied only if the whole request is accepted."""

    manifests: list[Manifest] = attrs.field(factory=list)
    blobs: dict[str, tuple[int, bytes | None]] = attrs.field(factory=dict)
    status: CaseStatus | None = None
    keep_status: bool = True


class _Planner:
    def __init__(self, data: PlanInput):
        self.data = data
        self.heads: dict[str, Head] = dict(data.heads)
        self.owners: dict[str, str] = dict(data.owners)
        self.parents: dict[str, Manifest] = dict(data.parents)
        # Kept up to date as requests are applied, like the heads: a later request of the
        # batch is checked against the history an earlier one wrote.
        self.histories: dict[str, list[str]] = {k: list(v) for k, v in data.histories.items()}
        self.rows = BatchRows(outcomes=[])

    def run(self) -> BatchRows:
        for i, req in enumerate(self.data.requests):
            self.rows.outcomes.append(self._one(i, req))
        return self.rows

    def _one(self, i: int, req: Request) -> Outcome:
        refused = self.data.refused[i]
        if refused is not None:
            return refused
        try:
            if isinstance(req, PublishRequest):
                staged = self._publish(req)
            elif isinstance(req, StatusRequest):
                staged = self._status(req)
            else:
                staged = self._import(req)
            self._check_blobs(req, staged)
            head_manifest = staged.manifests[-1] if staged.manifests else \
                self.parents[req.package_id]
        except VianoError as exc:
            return exc
        except Exception as exc:
            log.exception("planning a %s for case %r failed", type(req).__name__, req.case_id)
            return StorageError(f"internal error while committing case {req.case_id!r} "
                                f"({type(exc).__name__}); nothing of it was written",
                                reason="internal_error",
                                hint="This is a bug in Viano; please report it.")
        return self._apply(req, staged, head_manifest)

    def _check_blobs(self, req: Request, staged: _Staged) -> None:
        for sha, (size, data) in staged.blobs.items():
            if size <= self.data.inline_threshold and data is None:
                raise StorageError(f"blob {sha[:12]}… of case {req.case_id!r} was not "
                                   "prepared for the transaction")

    def _identity(self, package_id: str, case_id: str) -> Head | None:
        head = self.heads.get(package_id)
        owner = self.owners.get(case_id)
        if head is None and owner is not None:
            raise CaseExists(f"case {case_id!r} already exists (package {owner})")
        if head is not None and head.case_id != case_id:
            raise HistoryConflict(f"package {package_id} belongs to case "
                                  f"{head.case_id!r}, not {case_id!r}",
                                  reason="package_mismatch",
                                  hint="The package id names another case: check which "
                                       "case this request or export is for ('viano show "
                                       "CASE --json' gives a case's package id).")
        return head

    def _expect(self, req: PublishRequest | StatusRequest) -> Manifest | None:
        head = self._identity(req.package_id, req.case_id)
        current = head.generation if head else None
        if req.expected_generation is None and current is not None:
            raise CaseExists(f"case {req.case_id!r} already exists (package {req.package_id})")
        if current != req.expected_generation:
            raise StaleGeneration(
                f"case {req.case_id!r}: expected generation {req.expected_generation}, "
                f"the package is at {current}")
        if current is None:
            return None
        parent = self.parents.get(req.package_id)
        if parent is None or parent.package_generation != current:
            raise StorageError(f"the head manifest of case {req.case_id!r} was not loaded")
        return parent

    def _publish(self, req: PublishRequest) -> _Staged:
        parent = self._expect(req)
        manifest = build_manifest(parent, req.package_id, req.case_id, req.change,
                                  self.data.now)
        staged = _Staged(manifests=[manifest], status=req.status,
                         keep_status=req.status is None)
        for source in req.change.files.values():
            staged.blobs[source.sha256] = (source.size, self.data.inline.get(source.sha256))
        return staged

    def _status(self, req: StatusRequest) -> _Staged:
        if self._expect(req) is None:
            raise StaleGeneration(f"case {req.case_id!r} has no generation to set a status on")
        return _Staged(status=req.status, keep_status=False)

    def _import(self, req: ImportRequest) -> _Staged:
        try:
            head = self._identity(req.package_id, req.case_id)
        except CaseExists as exc:  # import has no --case-id to choose another
            raise CaseExists(exc.message, hint="This store holds another package of that "
                             "case: import the export into another store, or look at the "
                             "case here with 'viano show'.") from exc
        have = head.generation if head else 0
        theirs = req.manifests
        if not theirs:
            raise ImportRejected(f"the export of case {req.case_id!r} has no generations")
        ours = self.histories.get(req.package_id, ())
        if len(ours) != have:
            raise StorageError(f"the history of case {req.case_id!r} was not loaded")
        # The shared generations first: a shorter export that differs is a divergence, not
        # an older copy of this history (which the older_history hint would say it is).
        for gen in range(1, min(have, len(theirs)) + 1):
            if ours[gen - 1] != theirs[gen - 1].sha256:
                raise HistoryConflict(f"case {req.case_id!r} has a different history in this "
                                      f"store from generation {gen} on; nothing imported")
        if have > len(theirs):
            raise HistoryConflict(f"the store already has {have} generations of case "
                                  f"{req.case_id!r}, the export only {len(theirs)}, the "
                                  "same as this store's first ones; nothing imported",
                                  reason="older_history",
                                  hint="This store is ahead: nothing to import. To move the "
                                       "newer history the other way, export it from here.")
        parent = self.parents.get(req.package_id) if have else None
        staged = _Staged(keep_status=False)
        for given in theirs[have:]:
            manifest = _as_parsed(given, req.case_id)
            problems = successor_violations(parent, manifest)
            if problems or (manifest.package_id, manifest.case_id) != (req.package_id,
                                                                       req.case_id):
                raise ImportRejected(f"generation {manifest.package_generation} of case "
                                     f"{req.case_id!r}: {'; '.join(problems) or 'wrong ids'}")
            for entry in manifest.files.values():
                if entry.sha256 not in req.blobs:
                    raise ImportRejected(f"the export lacks blob {entry.sha256[:12]}…")
                staged.blobs[entry.sha256] = (entry.size, self.data.inline.get(entry.sha256))
            staged.manifests.append(manifest)
            parent = manifest
        if staged.manifests:
            staged.status = CaseStatus(status="READY", phase=staged.manifests[-1].phase,
                                       reason="imported")
        else:
            staged.keep_status = True
        return staged

    def _apply(self, req: Request, staged: _Staged, manifest: Manifest) -> Published:
        """Add a fully checked request's rows. Nothing here refuses or raises."""
        rows = self.rows
        for sha, blob in staged.blobs.items():
            known = rows.blobs.get(sha)
            if known is None or known[1] is None:
                rows.blobs[sha] = blob
                rows.bytes_written += len(blob[1] or b"")
        for m in staged.manifests:
            rows.generations.append(GenerationRow(
                m.package_id, m.package_generation, m.parent_generation, m.sha256, m.raw,
                m.phase, m.created_at))
            rows.bytes_written += len(m.raw)
            rows.new_manifests.append(m)
            self.parents[m.package_id] = m
        head = self.heads.get(req.package_id)
        history = self.histories.get(req.package_id)
        if history is not None:
            history.extend(m.sha256 for m in staged.manifests)
        status = head.status if (staged.keep_status and head) else staged.status
        self.heads[req.package_id] = Head(req.case_id, manifest.package_generation, status)
        self.owners[req.case_id] = req.package_id
        if staged.manifests or not staged.keep_status:
            rows.refs[req.package_id] = RefRow(
                req.package_id, req.case_id, manifest.package_generation, manifest.phase,
                manifest.analysis_revision, self.data.now, status)
        return Published(req.package_id, req.case_id, manifest.package_generation, manifest,
                         status)


def _as_parsed(manifest: Manifest, case_id: str) -> Manifest:
    """An imported manifest as its own bytes say, with every check of a parse: a
    ``Manifest`` can be built by hand (the embedding API), with fields its ``raw`` does not
    hold or ids no parse accepts; what is stored is ``raw``, so ``raw`` decides."""
    try:
        parsed = Manifest.parse(manifest.raw, manifest.sha256)
    except (ChangeRejected, TypeError, ValueError) as exc:
        raise ImportRejected(f"generation {manifest.package_generation!r} of case "
                             f"{case_id!r} is not a valid manifest: {exc}") from exc
    if parsed != manifest:
        raise ImportRejected(f"generation {manifest.package_generation!r} of case "
                             f"{case_id!r}: its fields differ from its own bytes")
    return parsed


def plan_batch(data: PlanInput) -> BatchRows:
    """Decide every request of a batch: see the module docstring."""
    return _Planner(data).run()
