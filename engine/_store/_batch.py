"""Deciding, inside the write transaction, which requests of a batch commit.

Every check happens before any row of that request is added, so a refused request (stale
parent, existing case, history that diverged) contributes nothing; the rows of the
accepted ones are written with one ``executemany`` per table.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._canonical import sha256_hex, utc_now_iso
from .._errors import CaseExists, ImportRejected, StaleGeneration, VianoError
from ._manifest import Published, PublishRequest, build_manifest, encode_manifest
from ._sources import BlobSource, read_source

if TYPE_CHECKING:
    from ._sqlite import SqliteStore


@attrs.frozen
class ImportRequest:
    """Insert a whole validated history (``manifests`` in generation order) as it is.

    If the package already exists, its history must be a prefix of the imported one: the
    missing generations are appended (fast-forward); identical history is a no-op.
    """

    package_id: str
    case_id: str
    manifests: tuple[bytes, ...]
    blobs: Mapping[str, BlobSource]


Request = PublishRequest | ImportRequest
Outcome = Published | VianoError


class BatchPlan:
    """Decides, inside the write transaction, which requests of a batch commit."""

    def __init__(self, store: SqliteStore, conn: sqlite3.Connection,
                 requests: Sequence[Request], outcomes: list[Outcome | None]):
        self.store, self.conn, self.requests, self.outcomes = store, conn, requests, outcomes
        self.blob_rows: dict[str, tuple[str, int, bytes | None]] = {}
        self.gen_rows: list[tuple[Any, ...]] = []
        self.ref_rows: list[tuple[Any, ...]] = []
        self.new_manifests: list[tuple[tuple[str, int], dict[str, Any]]] = []
        self.heads: dict[str, tuple[str, int]] = {}    # package_id -> (case_id, generation)
        self.case_owner: dict[str, str] = {}           # case_id -> package_id
        self.bytes_written = 0

    def run(self) -> None:
        self._load_heads()
        now = utc_now_iso()
        for i, req in enumerate(self.requests):
            if self.outcomes[i] is not None:
                continue
            try:
                if isinstance(req, PublishRequest):
                    self.outcomes[i] = self._publish(req, now)
                else:
                    self.outcomes[i] = self._import(req, now)
            except VianoError as exc:
                self.outcomes[i] = exc
        self.bytes_written = sum(len(r[2]) for r in self.blob_rows.values() if r[2]) + sum(
            len(r[4]) for r in self.gen_rows)
        c = self.conn
        c.executemany("INSERT OR IGNORE INTO blobs (sha256, size, data) VALUES (?, ?, ?)",
                      [(bytes.fromhex(sha), size, data)
                       for sha, size, data in self.blob_rows.values()])
        c.executemany("INSERT INTO generations (package_id, generation, parent, manifest_sha256, "
                      "manifest, phase, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)", self.gen_rows)
        c.executemany("INSERT INTO refs (package_id, case_id, generation, phase, analysis_revision,"
                      " updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (package_id) DO UPDATE "
                      "SET generation=excluded.generation, phase=excluded.phase, "
                      "analysis_revision=excluded.analysis_revision, "
                      "updated_at=excluded.updated_at", self.ref_rows)

    def _load_heads(self) -> None:
        pkgs = sorted({r.package_id for r in self.requests})
        cases = sorted({r.case_id for r in self.requests})
        for chunk in _chunks(pkgs, 500):
            marks = ",".join("?" * len(chunk))
            for pkg, case, gen in self.conn.execute(
                    "SELECT package_id, case_id, generation FROM refs "
                    f"WHERE package_id IN ({marks})", chunk):
                self.heads[pkg] = (case, gen)
        for chunk in _chunks(cases, 500):
            marks = ",".join("?" * len(chunk))
            for case, pkg in self.conn.execute(
                    f"SELECT case_id, package_id FROM refs WHERE case_id IN ({marks})", chunk):
                self.case_owner[case] = pkg

    def _check_identity(self, package_id: str, case_id: str) -> tuple[str, int] | None:
        head = self.heads.get(package_id)
        owner = self.case_owner.get(case_id)
        if head is None and owner is not None:
            raise CaseExists(f"case {case_id!r} already exists (package {owner})")
        if head is not None and head[0] != case_id:
            raise StaleGeneration(f"package {package_id} belongs to case {head[0]!r}, "
                                  f"not {case_id!r}")
        return head

    def _publish(self, req: PublishRequest, now: str) -> Published:
        head = self._check_identity(req.package_id, req.case_id)
        current = head[1] if head else None
        if req.expected_generation is None and current is not None:
            raise CaseExists(f"case {req.case_id!r} already exists (package {req.package_id})")
        if current != req.expected_generation:
            raise StaleGeneration(
                f"case {req.case_id!r}: expected generation {req.expected_generation}, "
                f"the package is at {current}")
        parent = (self.store.cached_manifest(self.conn, req.package_id, current)
                  if current is not None else None)
        manifest = build_manifest(parent, req, now)
        for source in req.change.files.values():
            if source.sha256 not in self.blob_rows:
                inline = source.size <= self.store.inline_threshold
                self.blob_rows[source.sha256] = (
                    source.sha256, source.size, read_source(source) if inline else None)
        return self._add_generation(req.package_id, req.case_id, manifest,
                                    encode_manifest(manifest), now)

    def _add_generation(self, package_id: str, case_id: str, manifest: dict[str, Any],
                        raw: bytes, now: str) -> Published:
        digest = sha256_hex(raw)
        gen = manifest["package_generation"]
        self.gen_rows.append((package_id, gen, manifest["parent_generation"], digest, raw,
                              manifest["phase"], manifest["created_at"]))
        self.ref_rows.append((package_id, case_id, gen, manifest["phase"],
                              manifest["analysis_revision"], now))
        self.heads[package_id] = (case_id, gen)
        self.case_owner[case_id] = package_id
        self.new_manifests.append(((package_id, gen), manifest))
        return Published(package_id, case_id, gen, digest, manifest)

    def _import(self, req: ImportRequest, now: str) -> Published:
        head = self._check_identity(req.package_id, req.case_id)
        have = head[1] if head else 0
        if have > len(req.manifests):
            raise StaleGeneration(f"the store already has {have} generations of case "
                                  f"{req.case_id!r}, the export only {len(req.manifests)}")
        for gen in range(1, have + 1):
            ours = self.conn.execute(
                "SELECT manifest_sha256 FROM generations WHERE package_id=? AND generation=?",
                (req.package_id, gen)).fetchone()
            if ours is None or ours[0] != sha256_hex(req.manifests[gen - 1]):
                raise StaleGeneration(f"case {req.case_id!r} has a different history in this "
                                      f"store from generation {gen} on; nothing imported")
        new = [(raw, json.loads(raw)) for raw in req.manifests[have:]]
        missing = {e["sha256"] for _, m in new for e in m["files"].values()} - set(req.blobs)
        if missing:
            raise ImportRejected(f"the export lacks {len(missing)} blob(s) its manifests name")
        last: Published | None = None
        for raw, manifest in new:
            for entry in manifest["files"].values():
                sha = entry["sha256"]
                if sha not in self.blob_rows:
                    source = req.blobs[sha]
                    inline = source.size <= self.store.inline_threshold
                    self.blob_rows[sha] = (sha, source.size,
                                           read_source(source) if inline else None)
            last = self._add_generation(req.package_id, req.case_id, manifest, raw, now)
        if last is None:  # identical history: nothing to add
            raw = req.manifests[-1]
            return Published(req.package_id, req.case_id, len(req.manifests), sha256_hex(raw),
                             json.loads(raw))
        return last


def _chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
