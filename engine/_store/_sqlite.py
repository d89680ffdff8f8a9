"""The embedded store: SQLite (WAL, synchronous=FULL) for metadata, blobs by sha256.

Tables (see ``_sqlite_schema``): ``blob_rows`` (content-addressed; small blobs inline,
large ones as files with ``data IS NULL``; appended by id, their sha256 index in the side
file ``blob-index.sqlite3``, see ``_sqlite_index``; a migrated store's older blobs stay in
``blobs``), ``generations`` (one row per immutable generation,
with the exact manifest bytes and their hash) and ``refs`` (the head generation and durable
status of each package; the case index and the work queue). One batch of requests is one
transaction; the "swap" of a generation is the compare-and-swap on ``refs.generation``
made under the write lock.

Opening never guesses: a store folder holds ``store.sqlite3`` and ``store-id`` (the id
``meta.store_id`` repeats), ``blobs/`` and ``locks/``. A read-only open never creates or
changes anything (not even a schema), and works on a store the user cannot write. A
0-byte, schema-less or foreign index, or an index missing beside blob files, is
``store_corrupt``; it is never initialised over. A new store is built under a temporary
name and linked into place, so it either exists complete or not at all (``_sqlite_open``:
opening, creating, migrating, the connections).

Blocking by design: the publisher actor calls :meth:`commit_batch` from its one worker
thread; readers use one connection per thread.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from .._errors import NotFound, StorageError, VianoError
from .._ids import Shard, validate_case_id
from . import _sqlite_chain as chain
from ._blobs import BlobFiles, read_stored, verified_stream
from ._common import (
    AWAITING_WHERE,
    DUE_WHERE,
    INLINE_THRESHOLD,
    REF_COLUMNS,
    Committed,
    Gate,
    Large,
    ManifestCache,
    check_generation,
    chunks,
    commit_each_alone,
    generation_row,
    guarded,
    head_from_row,
    plan_input,
    prepare_blobs,
    recheck_files,
    ref_from_row,
    ref_row,
    referenced_hashes,
    stored_bytes,
    stored_manifest,
    stored_size,
)
from ._crash import crash_point
from ._lock import flock_lease
from ._manifest import Manifest
from ._plan import BatchRows, GenerationRow, Head, PlanInput, plan_batch
from ._protocol import BlobInfo, CaseRef, StoreStats
from ._requests import Outcome, Request
from ._sources import read_text_file
from ._sqlite_index import (
    INDEX_FILES,
    IndexDamaged,
    attach_for_reading,
    attach_for_writing,
    discard,
    find,
    has_legacy_blobs,
    write_blobs,
)
from ._sqlite_open import (
    DB_NAME,
    ID_NAME,
    check_folder,
    connect,
    connect_reader,
    create_store,
    open_existing,
    translate,
)
from ._wal import Checkpointer

# What a commit counts toward the next checkpoint besides its blob and manifest bytes: each
# case row it rewrites dirties at least a page (a batch of status changes alone writes no
# blob, and counted as nothing its WAL grew without a checkpoint).
ROW_WAL_BYTES = 4096
_STORE_ENTRIES = frozenset({DB_NAME, ID_NAME, "blobs", "locks", f"{DB_NAME}-wal",
                            f"{DB_NAME}-shm", *INDEX_FILES})
log = logging.getLogger("viano.store")


def _blob_ok(key: bytes, data: bytes | None) -> int:
    """SQL function: does an inline row hold the bytes its key names? (the self-heal of
    a duplicate insert over a damaged row)"""
    return int(data is not None and hashlib.sha256(data).digest() == key)


class SqliteStore:
    """One store folder: ``store.sqlite3``, ``store-id``, ``blobs/``, ``locks/``."""

    kind = "sqlite"
    leases_block = False  # flock on a local file
    # 40 threads (trio's default) planning steps at once: 25 ms of CPU per case; 2: 16 ms
    # (bench/throughput.py, the GIL handed back and forth ~3,800 times per case).
    reader_threads = 2
    reads_block = False  # local pages
    repair_hint = "Restore store.sqlite3 (or the store-id file) from a backup"

    def __init__(self, root: Path, *, writable: bool, version: int,
                 inline_threshold: int = INLINE_THRESHOLD, immutable: bool = False):
        self.root = root
        self.db_path = root / DB_NAME
        self._blob_files = BlobFiles(root)
        self.inline_threshold = inline_threshold
        self._writable = writable
        self.version = version
        self._immutable = immutable
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._legacy_blobs: bool | None = None  # does the version-2 blobs table hold rows?
        self._commit_lock = threading.Lock()
        self._checkpointer = Checkpointer(self._connect_writer, self._commit_lock)
        self._cache = ManifestCache()
        self._committed = Committed()
        self._gate = Gate(str(root))
        self._locks = str(root / "locks")
        self._identity = _identity(self.db_path)

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | os.PathLike[str], *, write: bool, create: bool = True,
             inline_threshold: int = INLINE_THRESHOLD) -> SqliteStore:
        """Open the store at ``root``; ``write`` (with ``create``) creates it if absent and
        migrates an older version. See the module docstring for what is refused."""
        root = Path(root)
        try:
            db_exists = check_folder(root, write and create)
            if not db_exists:
                create_store(root)
            version, immutable = open_existing(root, write)
            return cls(root, writable=write, version=version,
                       inline_threshold=inline_threshold, immutable=immutable)
        except OSError as exc:
            raise StorageError(f"cannot open the store at {root}: {exc.strerror or exc}",
                               reason="store_unavailable",
                               hint="Check the path and its permissions.") from exc

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def blob_files(self) -> BlobFiles:
        return self._blob_files

    @property
    def _has_rows(self) -> bool:
        """Version 3 and later: blobs go to ``blob_rows``, indexed in the side file."""
        return self.version >= 3

    @property
    def _chained(self) -> bool:
        """Version 4 and later: a generation is found by its chain (``_sqlite_chain``)."""
        return self.version >= 4

    def _connect_writer(self) -> sqlite3.Connection:
        conn = connect(self.db_path, writer=True)
        if self._has_rows:
            try:
                # The id through this connection: a reader opened here would outlive the
                # writer at close, and the last connection's checkpoint would not run.
                store_id = self._meta_id_of(conn)
                if store_id is None:
                    raise StorageError(f"{self.db_path} has no store id",
                                       reason="store_corrupt", hint=self.repair_hint)
                with translate("open the blob index", write=True):
                    attach_for_writing(conn, self.root, store_id)
            except BaseException:
                conn.close()
                raise
        return conn

    @property
    def writer(self) -> sqlite3.Connection:
        """The one writing connection, made on first use. Only ever read under
        ``_commit_lock``: two first commits (or a commit and an ``exclusive``) on two
        threads made two writers, and the one overwritten stayed open after ``close``."""
        if not self._writable:
            raise StorageError(f"the store at {self.root} is open read-only",
                               reason="store_read_only",
                               hint="Run a command that writes with a store you can write.")
        if self._writer is None:
            self._gate.refuse_if_closed()
            self._writer = self._connect_writer()
            self._writer.create_function("viano_blob_ok", 2, _blob_ok, deterministic=True)
            # The checkpointer runs checkpoints; the writer never does (see _wal).
            self._writer.execute("PRAGMA wal_autocheckpoint=0")
        return self._writer

    @property
    def reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self._gate.refuse_if_closed()
            conn = connect_reader(self.db_path, immutable=self._immutable)
            self._local.conn = conn
            self._local.indexed = self._has_rows and attach_for_reading(
                conn, self.root, self._meta_id_of(conn), self._immutable)
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def close(self) -> None:
        """Wait for the operations in progress on other threads (closing a connection
        under a running statement crashes the interpreter), refuse new ones
        (``store_unavailable``), then close every connection."""
        self._gate.close()
        self._checkpointer.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        self._local = threading.local()

    # -- writing ---------------------------------------------------------------------

    @guarded
    def commit_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """Commit every acceptable request of the batch in one transaction.

        Returns one outcome per request, in order: its durable acknowledgement, or the
        reason it was refused. A refused request writes nothing; the others are unaffected
        (even by a value SQLite refuses: see :func:`commit_each_alone`).
        """
        return commit_each_alone(self._commit, requests, _value_error)

    def still_there(self) -> None:
        """Refuse to go on with a store whose database was removed or replaced since it
        was opened (``rm -r`` of the folder, another database file moved into its place):
        what this process wrote would go to the removed file, acknowledged and lost, and
        what it read would not be the store that is there now. A daemon went on so for as
        long as it ran. A copy over the file in place keeps its inode and is not seen:
        restore only a store nobody has open."""
        if _identity(self.db_path) != self._identity:
            raise StorageError(f"the store's database {self.db_path} was removed or replaced "
                               "while this process had it open; nothing more is written "
                               "to it", reason="store_replaced",
                               hint="Run the command again: it opens the store that is "
                                    "there now.")

    def _commit(self, requests: Sequence[Request]) -> list[Outcome]:
        self.still_there()
        refused: list[VianoError | None] = [None] * len(requests)
        inline: dict[str, bytes] = {}
        large: Large = {}
        for i, req in enumerate(requests):
            refused[i] = prepare_blobs(self._blob_files, self.inline_threshold, req, inline,
                                       large, i)
        crash_point("batch.blobs_ready")
        try:
            rows = self._transaction(requests, refused, inline, large)
        except IndexDamaged:
            self._replace_index()  # derived data: rebuilt from the rows, then once more
            rows = self._transaction(requests, refused, inline, large)
        self._committed.count(len(requests), rows, self._cache)
        self._checkpointer.committed(rows.bytes_written + ROW_WAL_BYTES * len(rows.refs))
        return rows.outcomes

    def _transaction(self, requests: Sequence[Request], refused: list[VianoError | None],
                     inline: dict[str, bytes], large: Large) -> BatchRows:
        with self._commit_lock, translate("commit a batch", write=True):
            conn = self.writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                recheck_files(self._blob_files, large, refused)
                plan, head_rows = self._plan_input(conn, requests, refused, inline)
                rows = plan_batch(plan)
                self._write(conn, rows, head_rows)
                crash_point("txn.before_commit")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return rows

    def _replace_index(self) -> None:
        log.warning("the blob index of %s is damaged; rebuilding it", self.root)
        with self._commit_lock, translate("rebuild the blob index", write=True):
            conn = self.writer
            conn.execute("DETACH DATABASE ix")
            discard(self.root)
            store_id = self._meta_id_of(conn)
            assert store_id is not None  # the writer was attached with it
            attach_for_writing(conn, self.root, store_id)

    def _plan_input(self, conn: sqlite3.Connection, requests: Sequence[Request],
                    refused: list[VianoError | None], inline: dict[str, bytes]
                    ) -> tuple[PlanInput, dict[str, tuple[int, int]]]:
        pkgs = sorted({r.package_id for r in requests})
        refs, head_rows, damaged, lost = chain.heads(conn, pkgs)
        heads: dict[str, Head] = {pkg: head_from_row(row) for pkg, row in refs.items()}
        owners: dict[str, str] = {}
        # Who owns a case matters only to a request whose package has no head (a new
        # package must not take a case another package holds): look up only those.
        cases = sorted({r.case_id for r in requests if r.package_id not in heads})
        for chunk in chunks(cases, 500):
            marks = ",".join("?" * len(chunk))
            for case, pkg in conn.execute(
                    f"SELECT case_id, package_id FROM refs WHERE case_id IN ({marks})", chunk):
                owners[case] = pkg
        for i, req in enumerate(requests):
            if refused[i] is None and req.package_id in damaged:
                refused[i] = StorageError(
                    f"case {req.case_id!r}: the index's row for its head names no row that "
                    "holds it", reason="store_corrupt", hint=self.repair_hint + ".")
            elif refused[i] is None and req.package_id in lost:
                refused[i] = StorageError(
                    f"package {req.package_id} already has generations, but the case index "
                    "has no row for it", reason="store_corrupt", hint="Run 'viano verify'.")
        return plan_input(requests, heads, owners, refused, inline, self.inline_threshold,
                          lambda pkg, gen: self._manifest(conn, pkg, gen),
                          lambda pkg: chain.history_hashes(conn, pkg)), head_rows

    def _write(self, conn: sqlite3.Connection, rows: BatchRows,
               head_rows: dict[str, tuple[int, int]]) -> None:
        if self._legacy_blobs is None:
            self._legacy_blobs = has_legacy_blobs(conn)
        # A writer is always at the current version.
        write_blobs(conn, rows.blobs, search_legacy=self._legacy_blobs)
        placed = chain.append(conn, rows, head_rows)

        def head_row(pkg: str, generation: int) -> int:
            # Written in this batch, or the head as it was (a status change alone).
            row_id = placed.get((pkg, generation))
            if row_id is None:
                row_id = chain.head_row(head_rows, pkg, generation)
            if row_id is None:
                raise StorageError(f"package {pkg}: no row for its new head",
                                   reason="internal_error")
            return row_id

        conn.executemany(
            "INSERT INTO refs (package_id, case_id, generation, phase, analysis_revision, "
            "updated_at, status, status_phase, reason, round, max_rounds, due_at, attempt_id, "
            "calls_started, head_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (package_id) DO UPDATE SET generation=excluded.generation, "
            "phase=excluded.phase, analysis_revision=excluded.analysis_revision, "
            "updated_at=excluded.updated_at, status=excluded.status, "
            "status_phase=excluded.status_phase, reason=excluded.reason, "
            "round=excluded.round, max_rounds=excluded.max_rounds, due_at=excluded.due_at, "
            "attempt_id=excluded.attempt_id, calls_started=excluded.calls_started, "
            "head_row=excluded.head_row",
            [(*ref_row(r.package_id, r.case_id, r.generation, r.phase, r.analysis_revision,
                       r.updated_at, r.status), head_row(r.package_id, r.generation))
             for r in rows.refs.values()])

    # -- leases and maintenance --------------------------------------------------------

    def check_lease(self, case_id: str) -> None:
        """A no-op: the lease is this process's own lock, held until it is given back."""

    @contextmanager
    def lease(self, case_id: str) -> Iterator[None]:
        """The case lease: a non-blocking ``flock`` on ``locks/<case>.lock``, released by
        the OS if the holder dies. Busy → :class:`CaseLocked` (DEFERRED)."""
        if not self._writable:
            raise StorageError(f"the store at {self.root} is open read-only",
                               reason="store_read_only")
        with flock_lease(self._locks, validate_case_id(case_id)):
            yield

    @contextmanager
    def exclusive(self) -> Iterator[_Exclusive]:
        """Hold the write lock against every commit, in every process (gc)."""
        with self._gate.use(), self._commit_lock, translate("lock the store", write=True):
            conn = self.writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield _Exclusive(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @guarded
    def index_problems(self) -> list[str]:
        """What makes the index unfit to judge the blobs by (verify and gc refuse then)."""
        with translate("inspect the index"):
            gens = self.reader.execute("SELECT 1 FROM generations LIMIT 1").fetchone()
            blob_rows = self.reader.execute("SELECT COUNT(*) FROM blobs").fetchone()[0]
            if self._has_rows:
                blob_rows += self.reader.execute(
                    "SELECT COUNT(*) FROM blob_rows").fetchone()[0]
        problems = []
        ours = self._meta_id()
        if ours is not None and not self._id_matches():
            problems.append("the index does not belong to this store folder (its store-id "
                            "differs from the folder's or the folder's is missing)")
        if gens:
            return problems
        if blob_rows:
            problems.append(f"the index has no generations but holds {blob_rows} blob(s): "
                            "it was emptied or replaced")
        if self._blob_files.has_any() and not self._id_matches():
            problems.append("blob files exist but the index is empty and does not belong to "
                            "them (store-id)")
        return problems

    @guarded
    def _meta_id(self) -> str | None:
        return self._meta_id_of(self.reader)

    @staticmethod
    def _meta_id_of(conn: sqlite3.Connection) -> str | None:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
        except sqlite3.Error:
            return None
        return None if row is None else str(row[0])

    def _id_matches(self) -> bool:
        ours = self._meta_id()
        try:
            return ours is not None and read_text_file(self.root / ID_NAME) == ours
        except (OSError, UnicodeDecodeError):
            return False

    def stats(self) -> StoreStats:
        return self._committed.stats()

    @property
    def transactions(self) -> int:
        return self._committed.transactions

    # -- reading ---------------------------------------------------------------------

    @guarded
    def _select_refs(self, where: str = "", args: Sequence[Any] = ()) -> list[CaseRef]:
        cols = REF_COLUMNS if self.version >= 2 else REF_COLUMNS.split(", status,")[0]
        with translate("read the case index"):
            rows = self.reader.execute(f"SELECT {cols} FROM refs {where}", args).fetchall()
        return [ref_from_row(r) for r in rows]

    def list_cases(self) -> list[CaseRef]:
        return self._select_refs("ORDER BY case_id")

    def case(self, case_id: str) -> CaseRef:
        rows = self._select_refs("WHERE case_id=?", (case_id,))
        if not rows:
            raise NotFound(f"no case {case_id!r} in {self.root}", reason="unknown_case")
        return rows[0]

    @contextmanager
    def read_transaction(self) -> Iterator[None]:
        """Every read inside sees one committed state of the store (verify's view)."""
        with self._gate.use():
            conn = self.reader
            if conn.in_transaction:
                yield
                return
            with translate("read the store"):
                conn.execute("BEGIN")
            try:
                yield
            finally:
                with translate("read the store"):
                    conn.execute("COMMIT")

    @guarded
    def head(self, case_id: str) -> tuple[CaseRef, Manifest]:
        """The case's index row and its head manifest. The row (generation and status
        together) is one statement, so one committed state; the manifest it names is an
        immutable row (a generation is never updated or deleted), usually cached, so it
        needs no read transaction around both (BEGIN and COMMIT were half of a head's
        cost, and every step of a case reads one)."""
        ref = self.case(case_id)
        return ref, self._manifest(self.reader, ref.package_id, ref.generation)

    def due_cases(self, now: float, limit: int, *, awaiting_confirmation: bool = False,
                  shard: Shard | None = None) -> list[CaseRef]:
        """Cases with work now, from the (status, due_at) index: READY, RUNNING (a dispatch
        that died or was cancelled mid-phase leaves that; one still running elsewhere holds
        the case's lease, so trying it costs a DEFERRED ``locked``), RETRY_PENDING whose due
        time has come, and, for a policy that confirms, interpretations awaiting
        confirmation. Overdue retries come first (oldest due first), then the rest, which
        count as due now. ``shard``: only the cases it holds."""
        part, part_args = _in_shard(shard)
        if self.version < 2:
            where = f"WHERE {part[5:]} " if part else ""
            return self._select_refs(f"{where}ORDER BY case_id LIMIT ?", (*part_args, limit))
        extra = AWAITING_WHERE if awaiting_confirmation else ""
        return self._select_refs(
            f"WHERE ({DUE_WHERE.format(now='?')}{extra}){part} "
            "ORDER BY COALESCE(due_at, ?), case_id LIMIT ?", (now, *part_args, now, limit))

    def claim_due(self, now: float, limit: int, *, skip: Collection[str] = (),
                  awaiting_confirmation: bool = False, shard: Shard | None = None
                  ) -> list[CaseRef]:
        """The due cases not in ``skip``: the case lease (``flock``) is taken at dispatch,
        and a case held by another process costs a DEFERRED ``locked`` there."""
        self.still_there()  # every pass of a batch or a daemon asks here first
        left_out = set(skip)
        refs = self.due_cases(now, limit + len(left_out),
                              awaiting_confirmation=awaiting_confirmation, shard=shard)
        return [r for r in refs if r.case_id not in left_out][:limit]

    @guarded
    def next_due(self, shard: Shard | None = None) -> float | None:
        """The earliest due time of a RETRY_PENDING case (of ``shard``), if any."""
        if self.version < 2:
            return None
        part, part_args = _in_shard(shard)
        with translate("read the case index"):
            # Numbers only: a damaged row's text or blob (verify names it) is no due time.
            row = self.reader.execute("SELECT MIN(due_at) FROM refs WHERE "
                                      "status='RETRY_PENDING' AND typeof(due_at) IN "
                                      f"('real', 'integer'){part}", part_args).fetchone()
        return None if row[0] is None else float(row[0])

    @guarded
    def status_counts(self) -> dict[tuple[str, str], int]:
        if self.version < 2:
            sql = "SELECT phase, 'READY', COUNT(*) FROM refs GROUP BY phase"
        else:
            sql = "SELECT phase, COALESCE(status, 'READY'), COUNT(*) FROM refs GROUP BY 1, 2"
        with translate("count cases"):
            return {(p, s): n for p, s, n in self.reader.execute(sql)}

    @guarded
    def generation_counts(self) -> dict[str, int]:
        with translate("count generations"):
            return chain.counts(self.reader)

    @guarded
    def generations(self, package_id: str) -> list[GenerationRow]:
        """The package's generations in order, as its chain links them (format 4; rows off
        the chain are what :meth:`generation_counts` shows to ``verify``)."""
        with translate("read generations"):
            if self._chained:
                return chain.history(self.reader, package_id)
            rows = self.reader.execute(
                "SELECT package_id, generation, parent, manifest_sha256, manifest, phase, "
                "created_at FROM generations WHERE package_id=? ORDER BY generation",
                (package_id,)).fetchall()
        return [generation_row(r) for r in rows]

    @guarded
    def stored_generations(self, package_id: str) -> list[GenerationRow]:
        with translate("read generations"):
            return chain.stored(self.reader, package_id)

    @guarded
    def manifest(self, package_id: str, generation: int) -> Manifest:
        """Generation ``generation`` of a package, its bytes checked against their hash."""
        return self._manifest(self.reader, package_id, generation)

    def _manifest(self, conn: sqlite3.Connection, package_id: str, generation: int
                  ) -> Manifest:
        key = (package_id, generation)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        check_generation(generation)
        with translate("read a manifest"):
            if self._chained:
                found = chain.find(conn, package_id, generation)  # a broken chain raises
                row = None if found is None else (found.manifest, found.manifest_sha256)
            else:
                row = conn.execute("SELECT manifest, manifest_sha256 FROM generations WHERE "
                                   "package_id=? AND generation=?", key).fetchone()
        manifest = stored_manifest(row, package_id, generation)
        self._cache.put(manifest)
        return manifest

    def _find(self, sha256: str, columns: str) -> Sequence[Any] | None:
        conn = self.reader
        return find(conn, bytes.fromhex(sha256), columns, has_rows=self._has_rows,
                    has_index=self._local.indexed)

    @guarded
    def blob_info(self, sha256: str) -> BlobInfo | None:
        with translate("read a blob"):
            row = self._find(sha256, "size, data IS NOT NULL")
        return None if row is None else BlobInfo(stored_size(row[0], sha256), bool(row[1]))

    @guarded
    def _stored(self, sha256: str) -> tuple[int, bytes | None]:
        with translate("read a blob"):
            row = self._find(sha256, "size, data")
        if row is None:
            raise StorageError(f"blob {sha256} is not in the store", reason="store_corrupt")
        return stored_size(row[0], sha256), stored_bytes(row[1])

    def read_blob(self, sha256: str) -> bytes:
        """The blob's bytes, checked against its name: a damaged blob is ``store_corrupt``,
        never served."""
        return read_stored(sha256, *self._stored(sha256), self._blob_files.open_regular)

    def open_blob(self, sha256: str) -> BinaryIO:
        """A stream of the blob that checks the bytes against the name as they are read:
        reading to the end of a damaged blob raises ``store_corrupt`` instead of ending."""
        size, data = self._stored(sha256)
        if data is not None:
            return verified_stream(io.BytesIO(data), sha256, len(data))
        return verified_stream(self._blob_files.open_regular(sha256, size), sha256, size)


class _Exclusive:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def referenced_hashes(self) -> set[str]:
        return referenced_hashes(self.conn.execute(
            "SELECT package_id, generation, manifest, manifest_sha256 FROM generations"))


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is now (device and inode), or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _value_error(exc: BaseException) -> bool:
    """A value SQLite cannot bind or store (an integer past 64 bits, a constraint)."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    return isinstance(cause, (OverflowError, UnicodeEncodeError, sqlite3.IntegrityError,
                              sqlite3.DataError, sqlite3.InterfaceError))


def _in_shard(shard: Shard | None) -> tuple[str, tuple[int, ...]]:
    """The due index's condition for ``shard`` (``viano_shard``: the reader connections'
    function, :func:`engine._ids.shard_of`), and its arguments."""
    if shard is None:
        return "", ()
    return " AND viano_shard(case_id, ?) = ?", (shard.count, shard.index)
