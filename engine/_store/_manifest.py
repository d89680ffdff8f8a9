"""Package manifests, the changes that produce the next generation, and the rules between them.

A manifest is the whole identity of a generation: package id, case id, generation number,
parent, phase, revision, pointers, and every logical file with its sha256 and size. Its
canonical bytes are hashed and stored; ``viano show`` prints it. A new manifest is its
parent's with a :class:`Change` applied.

One set of rules decides what a generation may be, wherever a generation comes from — a
local publication (:func:`build_manifest`), an imported export, or the store as ``viano
verify`` reads it (:meth:`Manifest.parse` and :func:`successor_violations`):

- every field has its exact type and form (identifiers are strings, revisions positive
  integers, phases and pointer names from their alphabets, logical paths relative);
- the bytes are canonical, so one value has exactly one stored form;
- a generation keeps every file and pointer of its parent: files are only ever added or
  replaced, never removed, and nothing under ``inputs/``, ``case/`` or ``analysis/`` is ever
  replaced (originals and analysis artifacts are write-once);
- the revision never decreases; package id and case id never change.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

import attrs
import orjson

from .._canonical import sha256_hex
from .._errors import ChangeRejected
from .._ids import CASE_ID, validate_case_id
from .._json import UntrustedJson, loads_untrusted
from ._sources import BlobSource

PACKAGE_FORMAT = "viano-case-package/1"
PHASE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
POINTER = re.compile(r"[a-z][a-z0-9_]{0,63}")
PACKAGE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")
TIMESTAMP = re.compile(r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T"
                       r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?Z")


def is_timestamp(value: str) -> bool:
    """A UTC timestamp as Viano writes them: ASCII digits (``\\d`` took any script's),
    and a real date and time (``9999-99-99T99:99:99Z`` matched the old pattern). The
    pattern checks the ranges; the calendar only a 29th to 31st (a manifest is parsed on
    every cache miss)."""
    if TIMESTAMP.fullmatch(value) is None:
        return False
    if value[8:10] < "29":
        return True
    try:
        datetime(int(value[0:4]), int(value[5:7]), int(value[8:10]))
    except ValueError:
        return False
    return True
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
WRITE_ONCE_PREFIXES = ("inputs/", "case/", "analysis/")
V = TypeVar("V")
_KEYS = frozenset({"format", "package_id", "case_id", "package_generation", "parent_generation",
                   "analysis_revision", "phase", "created_at", "pointers", "files"})


def validate_logical_path(path: str) -> str:
    """A logical path is relative, '/'-separated UTF-8, with no empty, '.' or '..' segment."""
    if type(path) is not str:  # a subclass could answer the checks below as it likes
        raise ChangeRejected(f"logical path {path!r} is not valid")
    if len(path) <= _REMEMBERED_PATH:
        _remembered_check(path)
    else:
        _check_path(path)
    return path


# The last analysis revision a change may make or an import bring: a revision's artifacts
# live under four-digit folders (analysis/<phase>/0001/), so a larger one could be written
# but never audited.
MAX_REVISION = 9999
_REMEMBERED_PATH = 256  # longer paths are checked every time: 8192 of them stay < 3 MB


def _check_path(path: str) -> None:
    if not path or len(path) > 1024 or path.startswith("/") or "\\" in path:
        raise ChangeRejected(f"logical path {path!r} is not valid")
    if _CONTROL.search(path):
        raise ChangeRejected(f"logical path {path!r} contains control characters")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ChangeRejected(f"logical path {path!r} is not UTF-8 text") from exc
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        raise ChangeRejected(f"logical path {path!r} has an empty, '.' or '..' segment")


# A path that passed is remembered (the same few paths are published again and again); a
# refusal is not (an exception is never cached).
_remembered_check = functools.lru_cache(maxsize=8192)(_check_path)


def is_write_once(path: str) -> bool:
    return path.startswith(WRITE_ONCE_PREFIXES)


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(mapping, types.MappingProxyType):  # built here, over a dict nobody holds
        return mapping
    return types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True, slots=True)
class FileEntry:
    """A file of a manifest."""

    sha256: str
    size: int


@attrs.frozen
class Manifest:
    """One generation's manifest, parsed and checked. ``raw`` is the exact stored bytes."""

    package_id: str
    case_id: str
    package_generation: int
    parent_generation: int | None
    analysis_revision: int
    phase: str
    created_at: str
    pointers: Mapping[str, str] = attrs.field(converter=_frozen)
    files: Mapping[str, FileEntry] = attrs.field(converter=_frozen)
    raw: bytes = attrs.field(eq=False, repr=False)
    sha256: str = attrs.field(eq=False)
    # ``files`` as plain JSON objects, for encoding a child: a publication encodes its
    # whole file list, which grows with the package, and orjson writes dicts eight times
    # faster than dataclasses (7 us for 17 files). Derived, never passed in: built with
    # the manifest by build_manifest (from its parent's) or on first use, and only used
    # while ``files`` is the very mapping it was made from (attrs.evolve makes another).
    _wire: tuple[Mapping[str, FileEntry], dict[str, Mapping[str, Any]]] | None = attrs.field(
        init=False, default=None, eq=False, repr=False)

    def _wire_files(self) -> dict[str, Mapping[str, Any]]:
        wire = self._wire
        if wire is None or wire[0] is not self.files:
            wire = (self.files, {p: {"sha256": e.sha256, "size": e.size}
                                 for p, e in self.files.items()})
            object.__setattr__(self, "_wire", wire)
        return wire[1]

    @classmethod
    def parse(cls, raw: bytes, expected_sha256: str | None = None) -> Manifest:
        """Check ``raw`` completely; :class:`ChangeRejected` names the first problem."""
        if expected_sha256 is not None and sha256_hex(raw) != expected_sha256:
            raise ChangeRejected("the manifest bytes do not match their recorded sha256")
        try:
            doc = loads_untrusted(raw, max_depth=8)
        except UntrustedJson as exc:
            raise ChangeRejected(f"the manifest is not acceptable JSON ({exc})") from exc
        manifest = cls.from_json(doc, raw=raw)
        if encode_manifest(doc) != raw:
            raise ChangeRejected("the manifest bytes are not in canonical form")
        return manifest

    @classmethod
    def from_json(cls, doc: Any, *, raw: bytes | None = None) -> Manifest:
        if not isinstance(doc, dict):
            raise ChangeRejected("a manifest must be a JSON object")
        if set(doc) != _KEYS:
            extra, missing = sorted(set(doc) - _KEYS), sorted(_KEYS - set(doc))
            raise ChangeRejected(f"manifest keys: unknown {extra}, missing {missing}")
        if doc["format"] != PACKAGE_FORMAT:
            raise ChangeRejected(f"manifest format {doc['format']!r} is not {PACKAGE_FORMAT!r}")
        _check_str(doc, "package_id", PACKAGE_ID)
        _check_str(doc, "case_id", CASE_ID)
        _check_str(doc, "phase", PHASE)
        if not isinstance(doc["created_at"], str) or not is_timestamp(doc["created_at"]):
            raise ChangeRejected(f"manifest created_at {doc['created_at']!r} is not valid")
        gen = _check_int(doc, "package_generation")
        # Up to 2**62 when read: a store written before the limit stays readable (verify
        # reports what its layout cannot hold); new revisions stop at MAX_REVISION.
        revision = _check_int(doc, "analysis_revision")
        parent = doc["parent_generation"]
        if parent != (gen - 1 if gen > 1 else None) or type(parent) not in (int, type(None)):
            raise ChangeRejected(f"parent_generation {parent!r} does not precede {gen}")
        files = _check_files(doc["files"])
        pointers = _check_pointers(doc["pointers"], files)
        body = raw if raw is not None else encode_manifest(doc)
        return cls(package_id=doc["package_id"], case_id=doc["case_id"],
                   package_generation=gen, parent_generation=parent,
                   analysis_revision=revision, phase=doc["phase"],
                   created_at=doc["created_at"], pointers=pointers, files=files, raw=body,
                   sha256=sha256_hex(body))

    @property
    def generation(self) -> int:
        return self.package_generation

    def to_json(self) -> dict[str, Any]:
        return {"format": PACKAGE_FORMAT, "package_id": self.package_id,
                "case_id": self.case_id, "package_generation": self.package_generation,
                "parent_generation": self.parent_generation,
                "analysis_revision": self.analysis_revision, "phase": self.phase,
                "created_at": self.created_at, "pointers": dict(self.pointers),
                "files": {p: dict(e) for p, e in self._wire_files().items()}}

    def entry(self, path: str) -> FileEntry | None:
        return self.files.get(path)

    def paths_under(self, prefix: str) -> Iterator[str]:
        return (p for p in self.files if p.startswith(prefix))


def _check_str(doc: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = doc[key]
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ChangeRejected(f"manifest {key} {value!r} is not valid")
    return value


def _check_int(doc: dict[str, Any], key: str) -> int:
    value = doc[key]
    if type(value) is not int or value < 1 or value > 2**62:
        raise ChangeRejected(f"manifest {key} {value!r} is not a positive integer")
    return value


def _check_files(files: Any) -> dict[str, FileEntry]:
    if not isinstance(files, dict):
        raise ChangeRejected("manifest files must be an object")
    out = {}
    for path, entry in files.items():
        validate_logical_path(path)
        if not isinstance(entry, dict) or set(entry) != {"sha256", "size"}:
            raise ChangeRejected(f"file {path!r} must have exactly sha256 and size")
        sha, size = entry["sha256"], entry["size"]
        if not isinstance(sha, str) or SHA256.fullmatch(sha) is None:
            raise ChangeRejected(f"file {path!r} has a bad sha256")
        if type(size) is not int or size < 0 or size > 2**62:
            raise ChangeRejected(f"file {path!r} has a bad size")
        out[path] = FileEntry(sha, size)
    return out


def _check_pointers(pointers: Any, files: Mapping[str, FileEntry]) -> dict[str, str]:
    if not isinstance(pointers, dict):
        raise ChangeRejected("manifest pointers must be an object")
    for name, target in pointers.items():
        if POINTER.fullmatch(name) is None:
            raise ChangeRejected(f"pointer name {name!r} is not valid")
        if not isinstance(target, str) or target not in files:
            raise ChangeRejected(f"pointer {name!r} names {target!r}, which is not in the "
                                 "package")
    return dict(pointers)


def successor_violations(parent: Manifest | None, child: Manifest) -> list[str]:
    """Why ``child`` may not follow ``parent`` (empty when it may)."""
    out: list[str] = []
    if parent is None:
        if child.package_generation != 1:
            out.append(f"generation {child.package_generation} has no parent")
        return out
    if child.package_generation != parent.package_generation + 1:
        out.append(f"generation {child.package_generation} does not follow "
                   f"{parent.package_generation}")
    if (child.package_id, child.case_id) != (parent.package_id, parent.case_id):
        out.append("package id or case id changed")
    if child.analysis_revision < parent.analysis_revision:
        out.append(f"analysis_revision went back from {parent.analysis_revision} to "
                   f"{child.analysis_revision}")
    removed = sorted(set(parent.files) - set(child.files))
    if removed:
        out.append(f"removes file(s) {', '.join(removed[:5])}")
    dropped = sorted(set(parent.pointers) - set(child.pointers))
    if dropped:
        out.append(f"removes pointer(s) {', '.join(dropped[:5])}")
    rewritten = sorted(p for p, e in parent.files.items()
                       if is_write_once(p) and p in child.files and child.files[p] != e)
    if rewritten:
        out.append(f"replaces write-once file(s) {', '.join(rewritten[:5])}")
    return out


@attrs.frozen
class Change:
    """What a publication changes: files added or replaced, pointers set, phase, revision.

    There is deliberately no way to remove a file or a pointer: history is append-only and
    a later phase cannot silently discard what an earlier one declared.
    """

    files: Mapping[str, BlobSource] = attrs.field(factory=dict)
    pointers: Mapping[str, str] = attrs.field(factory=dict)
    phase: str | None = None
    analysis_revision: int | None = None

    def __attrs_post_init__(self) -> None:
        for path in self.files:
            validate_logical_path(path)
        for name in self.pointers:
            if not isinstance(name, str) or POINTER.fullmatch(name) is None:
                raise ChangeRejected(f"pointer name {name!r} is not valid")
        if self.phase is not None and (not isinstance(self.phase, str)
                                       or PHASE.fullmatch(self.phase) is None):
            raise ChangeRejected(f"phase {self.phase!r} is not valid")
        if self.analysis_revision is not None and (
                type(self.analysis_revision) is not int
                or not 1 <= self.analysis_revision <= MAX_REVISION):
            raise ChangeRejected(f"analysis_revision {self.analysis_revision!r} is not valid "
                                 f"(1 to {MAX_REVISION})")


def build_manifest(parent: Manifest | None, package_id: str, case_id: str, change: Change,
                   created_at: str) -> Manifest:
    """The manifest of the generation that ``change`` creates on top of ``parent``.

    Refuses (``ChangeRejected``) anything :func:`successor_violations` would report. Only
    what is new is checked here — the parent passed these checks when it was made or read,
    and the change's paths when it was built — which keeps a publication cheap (checking
    every path of every manifest again was a third of the publisher's CPU)."""
    if not isinstance(package_id, str) or PACKAGE_ID.fullmatch(package_id) is None:
        raise ChangeRejected(f"package id {package_id!r} is not valid")
    if parent is None:
        validate_case_id(case_id)
    elif (parent.package_id, parent.case_id) != (package_id, case_id):
        raise ChangeRejected("package id or case id differs from the parent's")
    # A mapping proxy's copy() is its dict's copy(); dict(proxy) goes key by key (it was
    # a tenth of the publisher's CPU).
    files: dict[str, FileEntry] = _copy(parent.files) if parent else {}
    wire: dict[str, Mapping[str, Any]] = parent._wire_files().copy() if parent else {}
    for path, source in change.files.items():
        sha, size = source.sha256, source.size
        if not isinstance(sha, str) or SHA256.fullmatch(sha) is None or \
                type(size) is not int or not 0 <= size <= 2**62:
            raise ChangeRejected(f"{path}: the source has a bad sha256 or size")
        old = files.get(path)
        if old is not None and is_write_once(path) and (old.sha256, old.size) != (sha, size):
            raise ChangeRejected(f"{path} is write-once and already in the package")
        files[path] = FileEntry(sha, size)
        wire[path] = {"sha256": sha, "size": size}
    pointers: dict[str, str] = _copy(parent.pointers) if parent else {}
    pointers.update(change.pointers)
    for name, target in change.pointers.items():
        if target not in files:
            raise ChangeRejected(f"pointer {name!r} names {target!r}, which is not in the "
                                 "package")
    revision = change.analysis_revision or (parent.analysis_revision if parent else 1)
    if parent is not None and revision < parent.analysis_revision:
        raise ChangeRejected(f"analysis_revision cannot go back from "
                             f"{parent.analysis_revision} to {revision}")
    phase = change.phase or (parent.phase if parent else None)
    if phase is None:
        raise ChangeRejected("creating a package needs a phase")
    if not is_timestamp(created_at):
        raise ChangeRejected(f"created_at {created_at!r} is not a UTC timestamp")
    generation = (parent.package_generation + 1) if parent else 1
    parent_gen = parent.package_generation if parent else None
    raw = encode_manifest({
        "format": PACKAGE_FORMAT, "package_id": package_id, "case_id": case_id,
        "package_generation": generation, "parent_generation": parent_gen,
        "analysis_revision": revision, "phase": phase, "created_at": created_at,
        "pointers": pointers, "files": wire})
    manifest = Manifest(package_id=package_id, case_id=case_id,
                        package_generation=generation, parent_generation=parent_gen,
                        analysis_revision=revision, phase=phase, created_at=created_at,
                        pointers=types.MappingProxyType(pointers),
                        files=types.MappingProxyType(files), raw=raw, sha256=sha256_hex(raw))
    object.__setattr__(manifest, "_wire", (manifest.files, wire))
    return manifest


def _copy(mapping: Mapping[str, V]) -> dict[str, V]:
    copy = getattr(mapping, "copy", None)
    out = copy() if copy is not None else None
    return out if type(out) is dict else dict(mapping)


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a manifest: sorted keys, no whitespace, UTF-8 — the same bytes
    as ``canonical_json`` for a manifest's value types (strings, ints, null), 16x faster,
    which is a tenth of a publication's CPU. The stored bytes are what ``verify`` hashes;
    they are never re-encoded."""
    return orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS)
