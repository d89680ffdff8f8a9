"""Hashing and the two JSON encodings Viano writes.

``canonical_json`` is the byte form that is hashed (manifests): sorted keys, no whitespace,
UTF-8. ``artifact_json`` is the human-readable form of package artifacts: field order as
built, two-space indent, trailing newline. Both are deterministic for the same value.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def artifact_json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def utc_now_iso() -> str:
    """Wall-clock time for artifacts only; scheduling never reads it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
