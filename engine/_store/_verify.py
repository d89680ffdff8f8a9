"""``viano verify``: recompute every hash and check every invariant of the store.

Checked per package: generations 1..N are contiguous, and every generation row the store
holds for the package is among them (the SQLite store finds them by their chain); each
manifest's bytes hash to the recorded sha256, are canonical and pass every rule a local
publication must (``Manifest.parse``); each generation is a valid successor of its parent
(no file or pointer removed, no write-once file replaced, ids and revision consistent);
the ref points at the last generation with its phase and revision; every file names a blob
whose recomputed sha256 and size match. Each blob is hashed once however many generations
share it, and a bad blob is reported once for each case that references it. Phase-level
checks (the interpretation's bindings, the hypothesis registry) are passed in by the
caller.

A damaged generation never stops the check: it is reported and the rest goes on. Orphan
blob files and leftover temporary files are counted (only crashes leave them; ``gc``
removes both); a damaged package's rows, on its chain or not, count as referencing what
they name, as they do for gc. A store whose index is missing or empty while blobs exist is
refused (``store_corrupt``): judging the blobs by it would call them all orphans.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from .._errors import ChangeRejected, StorageError, VianoError
from ._common import status_problem
from ._manifest import Manifest, successor_violations
from ._plan import GenerationRow
from ._protocol import CaseRef, Store
from ._sources import CHUNK

# A phase-level check: given the store and a package's manifests (in generation order),
# the violations it finds.
PackageCheck = Callable[[Store, Sequence[Manifest]], list[str]]


@attrs.frozen
class Violation:
    case_id: str
    what: str

    def to_json(self) -> dict[str, str]:
        return {"case_id": self.case_id, "violation": self.what}


@attrs.frozen
class VerifyReport:
    cases: int
    generations: int
    blobs_checked: int
    orphan_blob_files: int
    temporary_files: int
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def cases_affected(self) -> list[str]:
        return sorted({v.case_id for v in self.violations})

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "cases": self.cases, "generations": self.generations,
                "blobs_checked": self.blobs_checked,
                "orphan_blob_files": self.orphan_blob_files,
                "temporary_files": self.temporary_files,
                "cases_affected": self.cases_affected,
                "violations": [v.to_json() for v in self.violations]}


@attrs.define
class _Need:
    size: int
    where: str
    cases: set[str] = attrs.field(factory=set)


def verify_store(store: Store, case_ids: Iterable[str] | None = None,
                 progress: Callable[[int], None] | None = None,
                 checks: Sequence[PackageCheck] = ()) -> VerifyReport:
    """Verify the store as one committed state (a read transaction), so that publications
    going on meanwhile are either wholly seen or not at all."""
    with store.read_transaction():
        return _verify(store, case_ids, progress, checks)


def refuse_unfit_index(store: Store) -> None:
    """Refuse (``store_corrupt``) a store whose index does not fit its blobs or whose
    schema is not the one it made: verify and gc judge by it, so they say what is wrong
    with it before anything else reads it."""
    problems = store.index_problems()
    if problems:
        raise StorageError(f"{store.location}: {'; '.join(problems)}", reason="store_corrupt",
                           hint=f"{store.repair_hint}; verify and gc refuse to judge blobs "
                                "by an index that does not fit them.")


def _verify(store: Store, case_ids: Iterable[str] | None,
            progress: Callable[[int], None] | None,
            checks: Sequence[PackageCheck]) -> VerifyReport:
    refuse_unfit_index(store)
    violations: list[Violation] = []
    refs: dict[str, CaseRef] = {}
    damaged_refs: set[str] = set()  # the case ids of ref rows whose package id is damaged
    wanted = set(case_ids) if case_ids is not None else None
    for r in store.list_cases():
        # A damaged row (a flipped bit can change a column's type) is named, not sorted
        # beside the others: comparing None or bytes with text failed as internal_error.
        if type(r.package_id) is str and type(r.case_id) is str:
            refs[r.package_id] = r
            continue
        if type(r.case_id) is str:
            damaged_refs.add(r.case_id)
        if wanted is None or r.case_id in wanted:  # a whole-store check, or this case's
            violations.append(Violation(_shown(r.case_id), f"a ref row is damaged: package "
                                        f"id {r.package_id!r}, case id {r.case_id!r}"))
    for row in refs.values():
        problem = None if row.status is None else status_problem(row.status)
        if problem and (wanted is None or row.case_id in wanted):
            violations.append(Violation(row.case_id, f"the index's status row is damaged: "
                                                     f"{problem}"))
    if wanted is not None:
        known = {r.case_id for r in refs.values()}
        violations += [Violation(c, "no such case") for c in sorted(wanted - known)]
    counts = store.generation_counts()
    for pkg in [k for k in counts if type(k) is not str]:
        n = counts.pop(pkg)
        if wanted is None:  # no case of its own can be named
            violations.append(Violation(f"(package {pkg!r})", f"{n} generation rows have a "
                                        "damaged package id"))
    packages = sorted(counts)
    dangling: dict[str, tuple[str, Violation]] = {}  # by case: its ref's package, rowless
    for pkg in sorted(set(refs) - set(packages)):
        if wanted is not None and refs[pkg].case_id not in wanted:
            continue  # another case's (``verify CASE`` reported it for every case asked)
        said = Violation(refs[pkg].case_id, f"ref names package {pkg} which has no "
                                            "generations")
        dangling[refs[pkg].case_id] = (pkg, said)
        violations.append(said)
    needed: dict[str, _Need] = {}
    referenced: set[str] = set()
    n_cases = n_gens = 0
    for pkg in packages:
        ref = refs.get(pkg)
        case_id = ref.case_id if ref else f"(package {pkg})"
        try:
            rows = store.generations(pkg)
        except StorageError as exc:  # a chain that cannot be followed (format 4)
            if wanted is None or case_id in wanted:
                n_cases += 1
                violations.append(Violation(case_id, exc.message))
            referenced |= _stored_references(store, pkg)
            continue
        if wanted is not None and case_id not in wanted:
            referenced |= _references(rows)
            continue
        n_cases += 1
        n_gens += len(rows)
        found, manifests = _check_chain(pkg, case_id, rows, ref, needed)
        owner = manifests[-1].case_id if ref is None and manifests else None
        if owner is not None and (owner in damaged_refs or owner in dangling):
            # The package of a ref row reported above (damaged, or naming another package,
            # as a damaged id read back as text does): one problem of that case, said once.
            found = [v for v in found if v != _NO_REF.format(pkg=pkg)]
            if owner in dangling:
                named, said = dangling.pop(owner)
                violations.remove(said)
                found.insert(0, f"its ref row names package {named!r}, not its package "
                                f"{pkg}")
            case_id = owner
        if ref is not None and counts[pkg] != len(rows):
            # Rows the package's chain does not reach from its head (format 4): a broken
            # link, or rows added beside the chain.
            found.append(f"{counts[pkg] - len(rows)} of the package's {counts[pkg]} "
                         "generation rows are not on its chain from the head")
            referenced |= _stored_references(store, pkg)
        violations += [Violation(case_id, v) for v in found]
        for check in checks:
            try:
                violations += [Violation(case_id, v) for v in check(store, manifests)]
            except VianoError as exc:
                violations.append(Violation(case_id, f"phase check failed: {exc.message}"))
        if progress:
            progress(1)
    violations += _check_blobs(store, needed)
    referenced |= set(needed)
    orphans = sum(1 for sha, _ in store.blob_files.iter_files() if sha not in referenced)
    temporary = sum(1 for _ in store.blob_files.iter_tmp())
    return VerifyReport(n_cases, n_gens, len(needed), orphans, temporary, tuple(violations))


_NO_REF = "package {pkg} has generations but no ref"


def _shown(case_id: object) -> str:
    return case_id if type(case_id) is str else f"(damaged case id {case_id!r})"


def _stored_references(store: Store, pkg: str) -> set[str]:
    """What a damaged package's rows reference, on its chain or not: its blob files are
    the case's (gc keeps them), not orphans."""
    try:
        return _references(store.stored_generations(pkg))
    except StorageError:  # the violation is reported already; the count may be high
        return set()


def _references(rows: Sequence[GenerationRow]) -> set[str]:
    out: set[str] = set()
    for row in rows:
        try:
            out.update(e.sha256 for e in Manifest.parse(row.manifest).files.values())
        except ChangeRejected:
            continue
    return out


def _check_chain(pkg: str, case_id: str, rows: Sequence[GenerationRow], ref: CaseRef | None,
                 needed: dict[str, _Need]) -> tuple[list[str], list[Manifest]]:
    out: list[str] = []
    manifests: list[Manifest] = []
    if ref is None:
        out.append(_NO_REF.format(pkg=pkg))
    previous: Manifest | None = None
    for expected_gen, row in enumerate(rows, start=1):
        g = row.generation
        if g != expected_gen:
            out.append(f"generation {expected_gen} is missing (found {g})")
        try:
            m = Manifest.parse(row.manifest, row.manifest_sha256)
        except ChangeRejected as exc:
            out.append(f"generation {g}: {exc.message}")
            previous = None
            continue
        manifests.append(m)
        row_fields = {"package_id": pkg, "package_generation": g, "parent_generation":
                      row.parent, "phase": row.phase, "created_at": row.created_at}
        for key, value in row_fields.items():
            if getattr(m, key) != value:
                out.append(f"generation {g}: manifest {key} is {getattr(m, key)!r}, the "
                           f"index says {value!r}")
        if ref is not None and m.case_id != ref.case_id:
            out.append(f"generation {g}: manifest case_id is {m.case_id!r}")
        if previous is not None or g == 1:
            out += [f"generation {g}: {v}" for v in successor_violations(previous, m)]
        for path, entry in m.files.items():
            need = needed.setdefault(entry.sha256, _Need(entry.size, f"{path} (gen {g})"))
            need.cases.add(case_id)
            if need.size != entry.size:
                out.append(f"generation {g}: {path} size {entry.size} disagrees with "
                           f"{need.where}")
        previous = m
    if ref is not None and rows:
        if ref.generation != rows[-1].generation:
            out.append(f"ref points at generation {ref.generation}, the last is "
                       f"{rows[-1].generation}")
        if manifests and manifests[-1].package_generation == rows[-1].generation and (
                ref.phase != manifests[-1].phase
                or ref.analysis_revision != manifests[-1].analysis_revision):
            out.append("ref phase/revision disagree with the last manifest")
    return out, manifests


def _check_blobs(store: Store, needed: dict[str, _Need]) -> list[Violation]:
    out: list[Violation] = []

    def bad(need: _Need, what: str) -> None:
        out.extend(Violation(c, f"{what} ({need.where})") for c in sorted(need.cases))

    for sha, need in sorted(needed.items()):
        try:
            info = store.blob_info(sha)
            if info is None:
                bad(need, f"blob {sha} is missing")
                continue
            h = hashlib.sha256()
            actual = 0
            with store.open_blob(sha) as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                    actual += len(chunk)
        except StorageError as exc:
            what = "missing" if "missing" in exc.message else (
                "corrupt" if exc.reason == "store_corrupt" else "unreadable")
            bad(need, f"blob {sha} is {what}: {exc.message}")
            continue
        if h.hexdigest() != sha or actual != need.size or info.size != need.size:
            bad(need, f"blob {sha} is corrupt (recomputed {h.hexdigest()[:12]}…, {actual} "
                      "bytes)")
    return out
