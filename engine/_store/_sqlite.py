"""The embedded store: SQLite (WAL, synchronous=FULL) for metadata, blobs by sha256.

Tables: ``blobs`` (content-addressed; small blobs inline, large ones as files with
``data IS NULL``), ``generations`` (one row per immutable generation, with the exact
manifest bytes and their hash) and ``refs`` (the head generation of each package; it is also
the case index). One batch of requests is one transaction; the "swap" of a generation is
the compare-and-swap on ``refs.generation`` made under the write lock.

Blocking by design: the publisher actor calls :meth:`commit_batch` from its one worker
thread, and the CLI's read commands call the readers directly.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from .._errors import (
    NotFound,
    StorageError,
    VianoError,
)
from ._batch import BatchPlan, Outcome, Request
from ._blobs import BlobFiles
from ._crash import crash_point
from ._manifest import PublishRequest
from ._sources import BlobSource

STORE_FORMAT = "viano-store/1"
# Blobs up to this size live inside SQLite; larger ones are fsynced files. Measured by
# bench/blob_threshold.py on these machines: see the README's benchmark section.
INLINE_THRESHOLD = 256 * 1024
PAGE_SIZE = 32 * 1024
WAL_SIZE_LIMIT = 64 * 1024 * 1024
WAL_RESTART_BYTES = 64 * 1024 * 1024
CACHE_KIB = 65536  # per connection; the 2 MiB default holds only 62 pages of 32 KiB

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (
    sha256 BLOB PRIMARY KEY, size INTEGER NOT NULL, data BLOB);  -- 32 raw bytes: half the
                                                                 -- index of hex text
CREATE TABLE IF NOT EXISTS generations (
    package_id TEXT NOT NULL, generation INTEGER NOT NULL, parent INTEGER,
    manifest_sha256 TEXT NOT NULL, manifest BLOB NOT NULL,
    phase TEXT NOT NULL, created_at TEXT NOT NULL,
    PRIMARY KEY (package_id, generation));
CREATE TABLE IF NOT EXISTS refs (
    package_id TEXT PRIMARY KEY, case_id TEXT NOT NULL UNIQUE, generation INTEGER NOT NULL,
    phase TEXT NOT NULL, analysis_revision INTEGER NOT NULL, updated_at TEXT NOT NULL);
"""


@attrs.frozen
class CaseRef:
    case_id: str
    package_id: str
    generation: int
    phase: str
    analysis_revision: int
    updated_at: str


@attrs.frozen
class GenerationRow:
    package_id: str
    generation: int
    parent: int | None
    manifest_sha256: str
    manifest: bytes
    phase: str
    created_at: str




class SqliteStore:
    """One store directory: ``store.sqlite3``, ``blobs/``, ``locks/``."""

    def __init__(self, root: Path, *, inline_threshold: int = INLINE_THRESHOLD):
        self.root = root
        self.db_path = root / "store.sqlite3"
        self.blob_files = BlobFiles(root)
        self.inline_threshold = inline_threshold
        self._local = threading.local()
        self._writer: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._page_size: int | None = None
        self._manifest_cache: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self.transactions = 0
        self.bytes_committed = 0  # blob and manifest bytes, for checkpoint pacing

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | Path, *, create: bool, **kw: Any) -> SqliteStore:
        root = Path(root)
        db = root / "store.sqlite3"
        if not db.is_file():
            if not create:
                raise NotFound(f"no store at {root}", reason="no_store",
                               hint="Create one with 'viano intake' or pass --store PATH.")
            root.mkdir(parents=True, exist_ok=True)
        store = cls(root, **kw)
        store._init_schema()
        return store

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False,
                                   timeout=30.0)
            # Takes effect only when the database is created. 32 KiB pages hold a whole
            # 2-8 KiB blob without overflow chains: 1.7x the publication rate of 4 KiB
            # pages in bench/store.py (medians of 3, see the README).
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.db_path}: {exc}",
                               reason="store_unavailable") from exc
        return conn

    def _init_schema(self) -> None:
        conn = self.writer
        with _translate("initialise the store"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                row = conn.execute("SELECT value FROM meta WHERE key='format'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO meta VALUES ('format', ?)", (STORE_FORMAT,))
                elif row[0] != STORE_FORMAT:
                    raise StorageError(f"{self.root} has format {row[0]!r}, expected "
                                       f"{STORE_FORMAT!r}", reason="store_format",
                                       hint="Use a Viano version that reads this format.")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @property
    def writer(self) -> sqlite3.Connection:
        if self._writer is None:
            self._writer = self._connect()
        return self._writer

    @property
    def reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def move_checkpoints_off_the_commit_path(self) -> None:
        """Stop the writer from checkpointing inside COMMIT; the caller then runs
        :meth:`checkpoint` in the background. With the default auto-checkpoint almost
        every group commit also copied its pages into the database file and fsynced it
        on the critical path (measured: +28% publications/s without)."""
        self.writer.execute("PRAGMA wal_autocheckpoint=0")

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """A checkpoint on its own connection; returns SQLite's (busy, wal frames, frames
        checkpointed).

        PASSIVE copies the bulk of the WAL into the database without blocking anyone, but
        never catches a busy writer's tail, so alone it never lets the WAL restart: it grew
        to 2.6 GB in 12 s and throughput fell from 6,400 to 2,900 publications/s as page
        lookups searched a growing WAL index. RESTART, run while no commit is in flight (the
        publisher holds it off), copies the little that is left and makes the next commit
        start the WAL afresh. A reader elsewhere holding an old snapshot makes RESTART give
        up after 200 ms (``busy`` = 1) rather than stall the publisher."""
        if mode not in ("PASSIVE", "RESTART"):
            raise ValueError(f"unsupported checkpoint mode {mode!r}")
        if self._checkpointer is None:
            self._checkpointer = self._connect()
        conn = self._checkpointer
        with _translate("checkpoint the write-ahead log"):
            if mode == "PASSIVE":
                row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            else:
                conn.execute("PRAGMA busy_timeout=200")
                try:
                    row = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                finally:
                    conn.execute("PRAGMA busy_timeout=30000")
        return int(row[0]), int(row[1]), int(row[2])

    def wal_needs_restart(self, wal_frames: int) -> bool:
        """From the frame count a checkpoint reported: the WAL's logical length. The file
        size would not do, since ``journal_size_limit`` keeps the file that large after a
        restart."""
        return wal_frames * self.page_size > WAL_RESTART_BYTES

    @property
    def page_size(self) -> int:
        if self._page_size is None:
            self._page_size = int(self.writer.execute("PRAGMA page_size").fetchone()[0])
        return self._page_size

    def wal_bytes(self) -> int:
        try:
            return (self.root / "store.sqlite3-wal").stat().st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- writing ---------------------------------------------------------------------

    def commit_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """Commit every valid request of the batch in one transaction.

        Returns one outcome per request, in order: its durable acknowledgement, or the
        reason it was refused (stale parent, existing case, changed input). A refused
        request writes nothing; the others are unaffected. Large blobs are written and
        fsynced before the transaction starts.
        """
        outcomes: list[Outcome | None] = [None] * len(requests)
        for i, req in enumerate(requests):
            try:
                self._write_large_blobs(req)
            except VianoError as exc:
                outcomes[i] = exc
        conn = self.writer
        with _translate("commit a batch"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                plan = BatchPlan(self, conn, requests, outcomes)
                plan.run()
                crash_point("txn.before_commit")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        self.transactions += 1
        self.bytes_committed += plan.bytes_written
        crash_point("txn.after_commit")
        for key, manifest in plan.new_manifests:
            self._cache_manifest(key, manifest)
        return [o if o is not None else StorageError("request produced no outcome")
                for o in outcomes]

    def _write_large_blobs(self, req: Request) -> None:
        sources: Iterable[BlobSource] = (
            req.change.files.values() if isinstance(req, PublishRequest) else req.blobs.values())
        for source in sources:
            if source.size > self.inline_threshold:
                with _translate("write a blob file"):
                    self.blob_files.write(source)

    def _cache_manifest(self, key: tuple[str, int], manifest: dict[str, Any]) -> None:
        self._manifest_cache[key] = manifest
        self._manifest_cache.move_to_end(key)
        while len(self._manifest_cache) > 4096:
            self._manifest_cache.popitem(last=False)

    def cached_manifest(self, conn: sqlite3.Connection, package_id: str,
                        generation: int) -> dict[str, Any]:
        key = (package_id, generation)
        cached = self._manifest_cache.get(key)
        if cached is not None:
            return cached
        row = conn.execute("SELECT manifest FROM generations WHERE package_id=? AND generation=?",
                           key).fetchone()
        if row is None:
            raise StorageError(f"generation {generation} of package {package_id} is missing")
        manifest: dict[str, Any] = json.loads(row[0])
        self._cache_manifest(key, manifest)
        return manifest

    # -- reading ---------------------------------------------------------------------

    def list_cases(self) -> list[CaseRef]:
        with _translate("list cases"):
            rows = self.reader.execute(
                "SELECT case_id, package_id, generation, phase, analysis_revision, updated_at "
                "FROM refs ORDER BY case_id").fetchall()
        return [CaseRef(*r) for r in rows]

    def case(self, case_id: str) -> CaseRef:
        with _translate("read a case"):
            row = self.reader.execute(
                "SELECT case_id, package_id, generation, phase, analysis_revision, updated_at "
                "FROM refs WHERE case_id=?", (case_id,)).fetchone()
        if row is None:
            raise NotFound(f"no case {case_id!r} in {self.root}", reason="unknown_case")
        return CaseRef(*row)

    def generations(self, package_id: str) -> list[GenerationRow]:
        with _translate("read generations"):
            rows = self.reader.execute(
                "SELECT package_id, generation, parent, manifest_sha256, manifest, phase, "
                "created_at FROM generations WHERE package_id=? ORDER BY generation",
                (package_id,)).fetchall()
        return [GenerationRow(*r) for r in rows]

    def all_package_ids(self) -> list[str]:
        with _translate("list packages"):
            rows = self.reader.execute(
                "SELECT DISTINCT package_id FROM generations ORDER BY package_id").fetchall()
        return [r[0] for r in rows]

    def manifest_bytes(self, package_id: str, generation: int) -> bytes:
        with _translate("read a manifest"):
            row = self.reader.execute(
                "SELECT manifest FROM generations WHERE package_id=? AND generation=?",
                (package_id, generation)).fetchone()
        if row is None:
            raise NotFound(f"package {package_id} has no generation {generation}",
                           reason="unknown_generation",
                           hint="Run 'viano log CASE' to list its generations.")
        return bytes(row[0])

    def manifest(self, case_id: str, generation: int | None = None) -> dict[str, Any]:
        ref = self.case(case_id)
        result: dict[str, Any] = json.loads(
            self.manifest_bytes(ref.package_id, generation or ref.generation))
        return result

    def blob_row(self, sha256: str) -> tuple[int, bytes | None] | None:
        with _translate("read a blob"):
            row = self.reader.execute("SELECT size, data FROM blobs WHERE sha256=?",  # key
                                      (bytes.fromhex(sha256),)).fetchone()
        return None if row is None else (row[0], None if row[1] is None else bytes(row[1]))

    def read_blob(self, sha256: str) -> bytes:
        row = self.blob_row(sha256)
        if row is None:
            raise StorageError(f"blob {sha256} is not in the store")
        if row[1] is not None:
            return row[1]
        return self.blob_files.open(sha256).read_bytes()

    def blob_path(self, sha256: str) -> Path | None:
        """The file holding a large blob, or ``None`` if it is stored inline."""
        row = self.blob_row(sha256)
        if row is None:
            raise StorageError(f"blob {sha256} is not in the store")
        return self.blob_files.open(sha256) if row[1] is None else None

    def referenced_hashes(self, conn: sqlite3.Connection | None = None) -> set[str]:
        conn = conn or self.reader
        refs: set[str] = set()
        for (raw,) in conn.execute("SELECT manifest FROM generations"):
            refs.update(e["sha256"] for e in json.loads(raw)["files"].values())
        return refs


@contextmanager
def _translate(doing: str) -> Iterator[None]:
    """Translate sqlite3/OS errors at the storage boundary."""
    try:
        yield
    except VianoError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise StorageError(f"could not {doing}: {exc}", reason="store_unavailable",
                           hint="Check that the store path is writable and the disk is not "
                                "full, then run the command again.") from exc
