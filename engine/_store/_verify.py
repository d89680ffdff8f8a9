"""``viano verify``: recompute every hash and check every invariant of the store.

Checked per package: generations 1..N are contiguous with parent = N-1; each manifest's
bytes hash to the recorded sha256 and carry the same package id, case id and format; the ref
points at the last generation with its phase and revision; every pointer names a file of its
manifest; every file names a blob whose recomputed sha256 and size match. Each blob is hashed
once however many generations share it. Orphan blob files are not violations (only a crash
leaves them; ``gc`` removes them) but are counted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from ._manifest import PACKAGE_FORMAT
from ._sources import CHUNK
from ._sqlite import SqliteStore


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
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "cases": self.cases, "generations": self.generations,
                "blobs_checked": self.blobs_checked,
                "orphan_blob_files": self.orphan_blob_files,
                "violations": [v.to_json() for v in self.violations]}


def verify_store(store: SqliteStore, case_ids: Iterable[str] | None = None,
                 progress: Callable[[int], None] | None = None) -> VerifyReport:
    refs = {r.package_id: r for r in store.list_cases()}
    wanted = set(case_ids) if case_ids is not None else None
    violations: list[Violation] = []
    if wanted is not None:
        known = {r.case_id for r in refs.values()}
        violations += [Violation(c, "no such case") for c in sorted(wanted - known)]
    packages = store.all_package_ids()
    for pkg in refs:
        if pkg not in packages:
            violations.append(Violation(refs[pkg].case_id, f"ref names package {pkg} "
                                                           "which has no generations"))
    needed: dict[str, tuple[int, str]] = {}
    n_cases = n_gens = 0
    for pkg in packages:
        ref = refs.get(pkg)
        case_id = ref.case_id if ref else f"(package {pkg})"
        if wanted is not None and case_id not in wanted:
            continue
        n_cases += 1
        rows = store.generations(pkg)
        n_gens += len(rows)
        violations += _check_chain(store, pkg, case_id, rows, ref, needed)
        if progress:
            progress(1)
    violations += _check_blobs(store, needed)
    # Every manifest was just read unless the check was limited to some cases.
    referenced = set(needed) if wanted is None else store.referenced_hashes()
    orphans = sum(1 for sha, _ in store.blob_files.iter_files() if sha not in referenced)
    return VerifyReport(n_cases, n_gens, len(needed), orphans, tuple(violations))


def _check_chain(store: SqliteStore, pkg: str, case_id: str, rows: list[Any], ref: Any,
                 needed: dict[str, tuple[int, str]]) -> list[Violation]:
    out: list[Violation] = []

    def bad(what: str) -> None:
        out.append(Violation(case_id, what))

    if ref is None:
        bad(f"package {pkg} has generations but no ref")
    for expected_gen, row in enumerate(rows, start=1):
        g = row.generation
        if g != expected_gen:
            bad(f"generation {expected_gen} is missing (found {g})")
        if row.parent != (g - 1 if g > 1 else None):
            bad(f"generation {g} has parent {row.parent}")
        raw = bytes(row.manifest)
        if hashlib.sha256(raw).hexdigest() != row.manifest_sha256:
            bad(f"generation {g}: manifest bytes do not match their sha256")
        try:
            m = json.loads(raw)
        except ValueError:
            bad(f"generation {g}: manifest is not JSON")
            continue
        expect = {"format": PACKAGE_FORMAT, "package_id": pkg, "package_generation": g,
                  "parent_generation": row.parent, "phase": row.phase,
                  "created_at": row.created_at}
        if ref is not None:
            expect["case_id"] = ref.case_id
        for key, value in expect.items():
            if m.get(key) != value:
                bad(f"generation {g}: manifest {key} is {m.get(key)!r}, expected {value!r}")
        files = m.get("files", {})
        for name, target in m.get("pointers", {}).items():
            if target not in files:
                bad(f"generation {g}: pointer {name!r} names missing file {target!r}")
        for path, entry in files.items():
            prev = needed.setdefault(entry["sha256"], (entry["size"], f"{path} (gen {g})"))
            if prev[0] != entry["size"]:
                bad(f"generation {g}: {path} size {entry['size']} disagrees with {prev[1]}")
    if ref is not None and rows:
        last = json.loads(bytes(rows[-1].manifest))
        if ref.generation != rows[-1].generation:
            bad(f"ref points at generation {ref.generation}, last is {rows[-1].generation}")
        if ref.phase != last.get("phase") or ref.analysis_revision != last.get(
                "analysis_revision"):
            bad("ref phase/revision disagree with the last manifest")
    return out


def _check_blobs(store: SqliteStore, needed: dict[str, tuple[int, str]]) -> list[Violation]:
    out: list[Violation] = []
    for sha, (size, where) in sorted(needed.items()):
        row = store.blob_row(sha)
        if row is None:
            out.append(Violation("*", f"blob {sha} for {where} is missing"))
            continue
        h = hashlib.sha256()
        actual = 0
        if row[1] is not None:
            h.update(row[1])
            actual = len(row[1])
        else:
            path = store.blob_files.path_for(sha)
            if not path.is_file():
                out.append(Violation("*", f"blob file {sha} for {where} is missing"))
                continue
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                    actual += len(chunk)
        if h.hexdigest() != sha or actual != size or row[0] != size:
            out.append(Violation("*", f"blob {sha} for {where} is corrupt "
                                      f"(recomputed {h.hexdigest()[:12]}…, {actual} bytes)"))
    return out
