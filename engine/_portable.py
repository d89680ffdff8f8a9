"""Portable packages: ``viano export`` and ``viano import``.

An export is a zip (stored, not deflated, so that its own ratio check never trips) holding
``viano-export.json`` (package id, case id, the generation list with manifest hashes),
``manifests/NNNNNN.json`` (the exact manifest bytes) and ``blobs/<sha256>`` (every blob any
generation names, once). Identity comes only from the manifests: the zip's file name and
the store's path play no part.

An export is written to a temporary file beside its destination and renamed into place; an
existing destination is refused unless ``force``, and a destination inside the store
folder always is (it could be the store's own index).

An import is untrusted input: it is read through the same limited archive scanner as
intake, its index through the strict JSON reader, every blob is hashed and compared with
its name, every manifest with its recorded hash, and every manifest must pass the same
rules a local publication does (``Manifest.parse``) and follow its parent by the same
successor rule (nothing removed, nothing write-once replaced) before anything is written.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import attrs

from ._canonical import artifact_json
from ._config import IntakeLimits
from ._errors import (
    ArchiveRejected,
    ChangeRejected,
    DestinationRejected,
    ImportRejected,
    InvalidCaseId,
)
from ._ids import validate_case_id
from ._intake import archive_kind, check_regular, scan_archive, unreadable
from ._json import UntrustedJson, loads_untrusted
from ._phases import import_problems
from ._store import (
    CHUNK,
    ImportRequest,
    Manifest,
    Store,
    ZipMemberSource,
    successor_violations,
    whole_history,
)
from ._store._blobs import fsync_dir
from ._store._common import parse_stored_manifest
from ._store._crash import crash_point
from ._store._manifest import MAX_REVISION
from ._store._sources import WouldWait, open_regular
from ._store._sqlite_open import enclosing_store

log = logging.getLogger("viano.export")

EXPORT_FORMAT = "viano-export/1"
INDEX = "viano-export.json"
MAX_INDEX_BYTES = 4 * 1024 * 1024
_SHA = re.compile(r"[0-9a-f]{64}")


@attrs.frozen
class ExportSummary:
    case_id: str
    package_id: str
    generations: int
    blobs: int
    path: str

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def check_destination(dest: Path, store_root: Path | None, *, force: bool) -> Path:
    """Where an export may go: refuses an existing file (unless ``force``), a directory, a
    missing folder, a name the file system cannot hold and any path inside the store."""
    try:
        return _check_destination(dest, store_root, force=force)
    except (OSError, RuntimeError, ValueError) as exc:  # loops, bad names, /proc, /sys …
        raise DestinationRejected(f"{_shown(dest)} cannot be used: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from exc


def _shown(path: Path) -> str:
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _check_destination(dest: Path, store_root: Path | None, *, force: bool) -> Path:
    target = dest.resolve(strict=False)
    inside = enclosing_store(target)
    if store_root is not None:
        root = store_root.resolve()
        if target == root or root in target.parents:
            inside = store_root
    if inside is not None:
        raise DestinationRejected(f"{dest} is inside the store folder {inside}",
                                  reason="destination_in_store",
                                  hint="Write the export outside every store folder.")
    if target.is_dir():
        raise DestinationRejected(f"{dest} is a directory", hint="Give a file name, for "
                                  "example BUG-20.zip.")
    if not target.parent.is_dir():
        raise DestinationRejected(f"the folder {dest.parent} does not exist",
                                  hint="Create the folder first, or choose another path.")
    if (target.exists() or target.is_symlink()) and not force:
        raise DestinationRejected(f"{dest} already exists", reason="destination_exists",
                                  hint="Choose a new file name, or pass --force to replace it.")
    if target.exists() and not target.is_file():
        raise DestinationRejected(f"{dest} is not a regular file")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise DestinationRejected(f"the folder {dest.parent} cannot be written")
    name_max = os.pathconf(target.parent, "PC_NAME_MAX")
    if len(os.fsencode(target.name)) > name_max:
        raise DestinationRejected(f"the file name is longer than {name_max} bytes")
    return target


def export_package(store: Store, case_id: str, dest: Path, *, force: bool = False,
                   store_root: Path | None = None) -> ExportSummary:
    target = check_destination(dest, store_root, force=force)
    ref, rows = whole_history(store, case_id)  # the whole history, 1 to the head, or nothing
    # From the rows read (one read each), checked as every manifest read is.
    manifests = [parse_stored_manifest(r.manifest, r.manifest_sha256, ref.package_id,
                                       r.generation) for r in rows]
    index = {"format": EXPORT_FORMAT, "package_id": ref.package_id, "case_id": ref.case_id,
             "generations": [{"generation": m.package_generation,
                              "manifest_sha256": m.sha256} for m in manifests]}
    blobs: dict[str, int] = {}
    for m in manifests:
        for entry in m.files.values():
            blobs[entry.sha256] = entry.size
    _remove_abandoned(target.parent)
    tmp = target.with_name(f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as raw:
            # Held until the rename: another export removes only a temporary file whose
            # lock it can take (no writer) and that has not changed for a while.
            fcntl.flock(raw.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody has it
            with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED,
                                 allowZip64=True) as zf:
                zf.writestr(INDEX, artifact_json(index))
                for m in manifests:
                    zf.writestr(f"manifests/{m.package_generation:06d}.json", m.raw)
                for sha, size in sorted(blobs.items()):
                    _write_blob(store, zf, sha, size)
            raw.flush()
            os.fsync(raw.fileno())
            crash_point("export.written")
            os.replace(tmp, target)
        fsync_dir(target.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DestinationRejected(f"the export could not be written to {_shown(dest)}: "
                                  f"{exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ExportSummary(ref.case_id, ref.package_id, len(rows), len(blobs), str(target))


TMP_PREFIX = ".viano-export-"
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"[0-9]{1,10}-[0-9a-f]{8}\.tmp")
# An export holds an exclusive flock on its temporary file until it renames it, and writes
# it continuously. One that is unlocked and unchanged for this long has no writer. The age
# is the guard where locks do not reach across hosts (some shared folders): generous, as it
# compares a file server's clock with this host's.
ABANDONED_AFTER_S = 900.0


def _remove_abandoned(folder: Path) -> list[Path]:
    """Remove the temporary files that exports killed mid-write left in ``folder``: named
    as an export names them, regular, unchanged for ``ABANDONED_AFTER_S``, and with no
    writer (their flock can be taken: a writer holds it from before its first byte until
    its rename, in whatever process, PID namespace or host shares the folder). Best effort:
    a file that cannot be checked or removed is left for the next export."""
    removed: list[Path] = []
    try:
        names = [p for p in folder.iterdir() if _TMP_NAME.fullmatch(p.name)]
    except OSError:
        return removed
    for path in names:
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # a link, a device, anything not a file: never opened
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue  # gone meanwhile, a symbolic link, or not ours to read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < ABANDONED_AFTER_S:
                continue
            try:
                # Shared: it conflicts with the writer's exclusive lock, and a read-only
                # descriptor may take it even where flock is a POSIX lock (NFS).
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                continue  # a writer holds it
            # Still the file that was checked (not replaced since by a new export's).
            if os.stat(path, follow_symlinks=False).st_ino == st.st_ino:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d temporary file(s) of killed exports in %s", len(removed), folder)
    return removed


def _write_blob(store: Store, zf: zipfile.ZipFile, sha: str, size: int) -> None:
    info = zipfile.ZipInfo(f"blobs/{sha}", date_time=(1980, 1, 1, 0, 0, 0))
    info.file_size = size
    with zf.open(info, "w", force_zip64=size > 2**31) as out, store.open_blob(sha) as f:
        while chunk := f.read(CHUNK):
            out.write(chunk)


def import_limits(limits: IntakeLimits) -> IntakeLimits:
    """The limits an export is read within. It is a zip that Viano wrote with every member
    stored, never deflated, so no member may hold more bytes than it takes in the file
    (a compression ratio of 1): every byte read is a byte of the file itself, which bounds
    the whole read, and no size limit of the configuration applies on top of that. A size
    limit could only refuse what this store wrote under the same configuration (a case of
    many attachments is larger than any one of them). The count of members stays limited,
    as at intake: zipfile holds the whole central directory in memory."""
    return attrs.evolve(limits, max_member_bytes=2**62, max_total_bytes=2**62,
                        max_compression_ratio=1.0)


def read_export(path: Path, limits: IntakeLimits) -> ImportRequest:
    """Validate an export completely and return the request that imports it: its
    structure, every manifest and blob, and its phases' histories as verify audits them."""
    request = read_export_structure(path, limits)
    problems = import_problems(request.manifests, request.blobs)
    if problems:
        raise ImportRejected(f"{path}: the history fails verify's phase checks "
                             f"({len(problems)}): {'; '.join(problems[:3])}",
                             hint="Nothing was imported. Export the case again from a store "
                                  "where 'viano verify' passes.")
    return request


def read_export_structure(path: Path, limits: IntakeLimits) -> ImportRequest:
    """Everything :func:`read_export` checks but the phases' histories: what the store's
    own rules accept (tests use it to put a history in a store that only the phase checks
    would refuse, to test the checks that follow)."""
    check_regular(path)
    try:
        return _read_structure(path, limits)
    except WouldWait as exc:  # regular to stat, a stream when read (/proc/kmsg)
        raise unreadable(path, exc) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        # check_regular opened it: what fails now was replaced or changed meanwhile.
        raise ImportRejected(f"{path}: the export could not be read as it was checked "
                             f"({type(exc).__name__}: {exc})", reason="input_changed",
                             hint="Do not modify the export while Viano reads it; run the "
                                  "command again.") from exc


def _read_structure(path: Path, limits: IntakeLimits) -> ImportRequest:
    label = str(path)
    if archive_kind(path) != "zip":
        raise ImportRejected(f"{label}: not a zip file")
    try:
        scanned = scan_archive(path, "zip", import_limits(limits), label)
    except ArchiveRejected as exc:
        # An export is a zip Viano wrote: a member it cannot hold (unsafe, encrypted,
        # compressed, damaged) says the file is not one, or was changed; only the count of
        # its members is a limit of this configuration. A damaged zip (truncated, say) is
        # invalid_export, as any other file that is not an export is.
        many = exc.reason == "limit_exceeded" and "max_members" in exc.message
        generic = exc.reason in ("limit_exceeded", "corrupt_archive") and not many
        raise ArchiveRejected(exc.message, reason="invalid_export" if generic else exc.reason,
                              hint=(
            "The export has more files than this configuration allows; raise "
            "[intake.limits] max_members if you trust it. Nothing was imported."
            if many else
            "This file is not an export Viano wrote (its members are stored, never "
            "compressed), or it was changed after; nothing was imported. Export the case "
            "again from its store.")) from exc
    members = {m.name: m for m in scanned}
    if INDEX not in members or members[INDEX].size > MAX_INDEX_BYTES:
        raise ImportRejected(f"{label}: {INDEX} is missing or too large")
    with open_regular(path) as raw, zipfile.ZipFile(raw) as zf:
        # What the scan passes over (directory entries) an export never holds either.
        listed = zf.namelist()
        package_id, case_id, gens = _parse_index(zf.read(INDEX), label)
        missing = [f"manifests/{g:06d}.json" for g, _ in gens
                   if f"manifests/{g:06d}.json" not in members]
        if missing:
            raise ImportRejected(f"{label}: missing {missing[:3]}")
        manifests = [_parse_manifest(zf.read(f"manifests/{g:06d}.json"), sha, label, g)
                     for g, sha in gens]
    needed: dict[str, int] = {}
    previous: Manifest | None = None
    for m in manifests:
        where = f"{label}: generation {m.package_generation}"
        if (m.package_id, m.case_id) != (package_id, case_id):
            raise ImportRejected(f"{where}: package or case id differs from {INDEX}")
        problems = successor_violations(previous, m)
        if problems:
            raise ImportRejected(f"{where}: {'; '.join(problems)}")
        for entry in m.files.values():
            if needed.setdefault(entry.sha256, entry.size) != entry.size:
                raise ImportRejected(f"{where}: blob {entry.sha256[:12]}… has two sizes")
        previous = m
    expected = {INDEX} | {f"manifests/{g:06d}.json" for g, _ in gens} | {
        f"blobs/{sha}" for sha in needed}
    extra = sorted(set(listed) - expected)
    absent = sorted(expected - set(members))
    if extra or absent:
        raise ImportRejected(f"{label}: unexpected members {extra[:3]} / missing {absent[:3]}")
    blobs = {}
    for sha, size in needed.items():
        member = members[f"blobs/{sha}"]
        if member.sha256 != sha or member.size != size:
            raise ImportRejected(f"{label}: blob {sha[:12]}… does not match its content")
        blobs[sha] = ZipMemberSource(archive=path, member=member.name, sha256=sha, size=size)
    return ImportRequest(package_id=package_id, case_id=case_id, manifests=tuple(manifests),
                         blobs=blobs)


def _parse_index(raw: bytes, label: str) -> tuple[str, str, list[tuple[int, str]]]:
    where = f"{label}: {INDEX}"
    try:
        index = loads_untrusted(raw, max_depth=8)
    except UntrustedJson as exc:
        raise ImportRejected(f"{where}: {exc}") from exc
    if not isinstance(index, dict) or set(index) != {"format", "package_id", "case_id",
                                                     "generations"}:
        raise ImportRejected(f"{where}: must be an object with exactly format, package_id, "
                             "case_id and generations")
    if index["format"] != EXPORT_FORMAT:
        raise ImportRejected(f"{where}: format {index['format']!r} is not {EXPORT_FORMAT!r}")
    package_id = index["package_id"]
    if not isinstance(package_id, str) or not package_id:
        raise ImportRejected(f"{where}: package_id must be a string")
    try:
        case_id = validate_case_id(index["case_id"])
    except InvalidCaseId as exc:
        raise ImportRejected(f"{where}: {exc.message}") from exc
    gens = index["generations"]
    if not isinstance(gens, list) or not gens:
        raise ImportRejected(f"{where}: generations must be a non-empty list")
    out = []
    for i, g in enumerate(gens, start=1):
        if not isinstance(g, dict) or set(g) != {"generation", "manifest_sha256"} or \
                type(g["generation"]) is not int or g["generation"] != i or \
                not isinstance(g["manifest_sha256"], str) or \
                _SHA.fullmatch(g["manifest_sha256"]) is None:
            raise ImportRejected(f"{where}: entry {i} of generations is not "
                                 f'{{"generation": {i}, "manifest_sha256": "<hex>"}}')
        out.append((i, g["manifest_sha256"]))
    return package_id, case_id, out


def _parse_manifest(raw: bytes, sha: str, label: str, gen: int) -> Manifest:
    try:
        manifest = Manifest.parse(raw, sha)
    except ChangeRejected as exc:
        raise ImportRejected(f"{label}: generation {gen}: {exc.message}") from exc
    if manifest.package_generation != gen:
        raise ImportRejected(f"{label}: manifests/{gen:06d}.json holds generation "
                             f"{manifest.package_generation}")
    if manifest.analysis_revision > MAX_REVISION:
        raise ImportRejected(f"{label}: generation {gen}: analysis_revision "
                             f"{manifest.analysis_revision} is past the last, {MAX_REVISION}")
    return manifest

