"""Portable packages: ``viano export`` and ``viano import``.

An export is a zip (stored, not deflated, so that its own ratio check never trips) holding
``viano-export.json`` (package id, case id, the generation list with manifest hashes),
``manifests/NNNNNN.json`` (the exact manifest bytes) and ``blobs/<sha256>`` (every blob any
generation names, once). Identity comes only from the manifests: the zip's file name and
the store's path play no part.

An import is untrusted input: it is read through the same limited archive scanner as
intake, every blob is hashed and compared with its name, every manifest with its recorded
hash, and the chain must be linear and consistent before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import attrs

from ._canonical import artifact_json, sha256_hex
from ._config import IntakeLimits
from ._errors import ChangeRejected, ImportRejected, InvalidCaseId
from ._ids import validate_case_id
from ._intake import archive_kind, scan_archive
from ._store import (
    CHUNK,
    PACKAGE_FORMAT,
    ImportRequest,
    SqliteStore,
    ZipMemberSource,
    validate_logical_path,
)

EXPORT_FORMAT = "viano-export/1"
INDEX = "viano-export.json"
_MANIFEST = re.compile(r"manifests/(\d{6})\.json")
_BLOB = re.compile(r"blobs/([0-9a-f]{64})")


@attrs.frozen
class ExportSummary:
    case_id: str
    package_id: str
    generations: int
    blobs: int
    path: str

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def export_package(store: SqliteStore, case_id: str, dest: Path) -> ExportSummary:
    ref = store.case(case_id)
    rows = store.generations(ref.package_id)
    index = {"format": EXPORT_FORMAT, "package_id": ref.package_id, "case_id": ref.case_id,
             "generations": [{"generation": r.generation, "manifest_sha256": r.manifest_sha256}
                             for r in rows]}
    blobs: dict[str, int] = {}
    for r in rows:
        for entry in json.loads(r.manifest)["files"].values():
            blobs[entry["sha256"]] = entry["size"]
    dest = dest.resolve()
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(INDEX, artifact_json(index))
            for r in rows:
                zf.writestr(f"manifests/{r.generation:06d}.json", bytes(r.manifest))
            for sha, size in sorted(blobs.items()):
                _write_blob(store, zf, sha, size)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ExportSummary(ref.case_id, ref.package_id, len(rows), len(blobs), str(dest))


def _write_blob(store: SqliteStore, zf: zipfile.ZipFile, sha: str, size: int) -> None:
    info = zipfile.ZipInfo(f"blobs/{sha}", date_time=(1980, 1, 1, 0, 0, 0))
    info.file_size = size
    path = store.blob_path(sha)
    with zf.open(info, "w", force_zip64=size > 2**31) as out:
        if path is None:
            out.write(store.read_blob(sha))
            return
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                out.write(chunk)


def read_export(path: Path, limits: IntakeLimits) -> ImportRequest:
    """Validate an export completely and return the request that imports it."""
    label = str(path)
    if not path.is_file():
        raise ImportRejected(f"{label}: no such file")
    if archive_kind(path) != "zip":
        raise ImportRejected(f"{label}: not a zip file")
    members = {m.name: m for m in scan_archive(path, "zip", limits, label)}
    if INDEX not in members or members[INDEX].size > 4 * 1024 * 1024:
        raise ImportRejected(f"{label}: {INDEX} is missing or too large")
    with zipfile.ZipFile(path) as zf:
        index = _json(zf.read(INDEX), f"{label}: {INDEX}")
        try:
            if index.get("format") != EXPORT_FORMAT:
                raise ImportRejected(f"{label}: format {index.get('format')!r} is not "
                                     f"{EXPORT_FORMAT!r}")
            package_id, case_id = index["package_id"], validate_case_id(index["case_id"])
            gens = index["generations"]
            manifests = tuple(zf.read(f"manifests/{g['generation']:06d}.json") for g in gens)
        except (KeyError, TypeError, InvalidCaseId) as exc:
            raise ImportRejected(f"{label}: {INDEX} is malformed ({exc!r})") from exc
    if not manifests:
        raise ImportRejected(f"{label}: the export has no generations")
    needed: dict[str, int] = {}
    for i, (g, raw) in enumerate(zip(gens, manifests, strict=True), start=1):
        _check_manifest(label, i, g, raw, package_id, case_id, needed)
    expected = {INDEX} | {f"manifests/{i:06d}.json" for i in range(1, len(gens) + 1)} | {
        f"blobs/{sha}" for sha in needed}
    extra = sorted(set(members) - expected)
    missing = sorted(expected - set(members))
    if extra or missing:
        raise ImportRejected(f"{label}: unexpected members {extra[:3]} / missing {missing[:3]}")
    blobs = {}
    for sha, size in needed.items():
        m = members[f"blobs/{sha}"]
        if m.sha256 != sha or m.size != size:
            raise ImportRejected(f"{label}: blob {sha[:12]}… does not match its content")
        blobs[sha] = ZipMemberSource(archive=path, member=m.name, sha256=sha, size=size)
    return ImportRequest(package_id=package_id, case_id=case_id, manifests=manifests,
                         blobs=blobs)


def _check_manifest(label: str, i: int, g: Any, raw: bytes, package_id: str, case_id: str,
                    needed: dict[str, int]) -> None:
    where = f"{label}: generation {i}"
    if not isinstance(g, dict) or g.get("generation") != i:
        raise ImportRejected(f"{where}: the generation list is not 1..N")
    if sha256_hex(raw) != g.get("manifest_sha256"):
        raise ImportRejected(f"{where}: manifest does not match its recorded sha256")
    m = _json(raw, where)
    expect = {"format": PACKAGE_FORMAT, "package_id": package_id, "case_id": case_id,
              "package_generation": i, "parent_generation": i - 1 if i > 1 else None}
    for key, value in expect.items():
        if m.get(key) != value:
            raise ImportRejected(f"{where}: {key} is {m.get(key)!r}, expected {value!r}")
    try:
        files = m["files"]
        for logical, entry in files.items():
            validate_logical_path(logical)
            sha, size = entry["sha256"], entry["size"]
            if not (isinstance(sha, str) and _BLOB.fullmatch(f"blobs/{sha}")) or \
                    type(size) is not int or size < 0 or needed.get(sha, size) != size:
                raise ImportRejected(f"{where}: file {logical!r} has a bad entry")
            needed[sha] = size
        for name, target in m["pointers"].items():
            if target not in files:
                raise ImportRejected(f"{where}: pointer {name!r} names a missing file")
        if not isinstance(m["phase"], str) or type(m["analysis_revision"]) is not int:
            raise ImportRejected(f"{where}: bad phase or analysis_revision")
        if not isinstance(m["created_at"], str):
            raise ImportRejected(f"{where}: bad created_at")
    except (KeyError, TypeError, AttributeError, ChangeRejected) as exc:
        raise ImportRejected(f"{where}: malformed manifest ({exc!r})") from exc


def _json(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImportRejected(f"{where}: not valid JSON") from exc
    if not isinstance(value, dict):
        raise ImportRejected(f"{where}: not a JSON object")
    return value
