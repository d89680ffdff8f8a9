"""Package manifests and the changes that produce the next generation.

A manifest is the whole identity of a generation: package id, case id, generation number,
parent, phase, revision, pointers, and every logical file with its sha256 and size. Its
canonical JSON is hashed and stored; ``viano show`` prints it. A new manifest is its
parent's with the change applied: files not named in the change keep their exact entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from .._errors import ChangeRejected
from .._ids import validate_case_id
from ._sources import BlobSource

PACKAGE_FORMAT = "viano-case-package/1"
_PHASE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_POINTER = re.compile(r"[a-z][a-z0-9_]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_logical_path(path: str) -> str:
    """A logical path is relative, '/'-separated, with no empty, '.' or '..' segment."""
    if not path or len(path) > 1024 or path.startswith("/") or "\\" in path:
        raise ChangeRejected(f"logical path {path!r} is not valid")
    if _CONTROL.search(path):
        raise ChangeRejected(f"logical path {path!r} contains control characters")
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        raise ChangeRejected(f"logical path {path!r} has an empty, '.' or '..' segment")
    return path


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
            if _POINTER.fullmatch(name) is None:
                raise ChangeRejected(f"pointer name {name!r} is not valid")
        if self.phase is not None and _PHASE.fullmatch(self.phase) is None:
            raise ChangeRejected(f"phase {self.phase!r} is not valid")
        if self.analysis_revision is not None and (
                type(self.analysis_revision) is not int or self.analysis_revision < 1):
            raise ChangeRejected(f"analysis_revision {self.analysis_revision!r} is not valid")


@attrs.frozen
class PublishRequest:
    """Publish ``change`` on top of ``expected_generation`` (``None``: create the package)."""

    package_id: str
    case_id: str
    expected_generation: int | None
    change: Change

    def __attrs_post_init__(self) -> None:
        validate_case_id(self.case_id)
        if self.expected_generation is None and self.change.phase is None:
            raise ChangeRejected("creating a package needs a phase")


@attrs.frozen
class Published:
    """The durable acknowledgement of one publication or import."""

    package_id: str
    case_id: str
    generation: int
    manifest_sha256: str
    manifest: Mapping[str, Any]


def build_manifest(parent: Mapping[str, Any] | None, request: PublishRequest,
                   created_at: str) -> dict[str, Any]:
    """The manifest of the generation that ``request`` creates on top of ``parent``."""
    change = request.change
    files: dict[str, Any] = dict(parent["files"]) if parent else {}
    for path, source in change.files.items():
        files[path] = {"sha256": source.sha256, "size": source.size}
    pointers: dict[str, str] = dict(parent["pointers"]) if parent else {}
    pointers.update(change.pointers)
    for name, target in pointers.items():
        if target not in files:
            raise ChangeRejected(f"pointer {name!r} names {target!r}, which is not in the package")
    generation = (parent["package_generation"] + 1) if parent else 1
    revision = change.analysis_revision or (parent["analysis_revision"] if parent else 1)
    return {
        "format": PACKAGE_FORMAT,
        "package_id": request.package_id,
        "case_id": request.case_id,
        "package_generation": generation,
        "parent_generation": parent["package_generation"] if parent else None,
        "analysis_revision": revision,
        "phase": change.phase or (parent["phase"] if parent else ""),
        "created_at": created_at,
        "pointers": pointers,
        "files": files,
    }


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The canonical bytes of a manifest: sorted keys, no whitespace, UTF-8 — the same bytes
    as ``canonical_json`` for a manifest's value types (strings, ints, null), 16x faster,
    which is a tenth of a publication's CPU. The stored bytes are what ``verify`` hashes;
    they are never re-encoded."""
    return orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS)
