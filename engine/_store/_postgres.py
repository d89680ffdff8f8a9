"""The multi-host store: PostgreSQL for metadata and small blobs, a shared folder (the blob
root) for large blobs.

The same rows as the SQLite store (see ``_pg_schema``), the same batch planning
(``_plan``), the same blob protocol (``_blobs``: temp → fsync → rename → fsync of the
folder, before the transaction that references the file) and the same gc protocol, with
the write lock being a transaction-scoped advisory lock: every commit, in every worker on
every host, takes it, so a batch's compare-and-swap on the head generations and gc's view
of the references are as exact as under SQLite's one writer. Leases are rows
(``_pg_leases``).

psycopg 3 is used synchronously on worker threads, as the SQLite store is: the publisher's
one thread has its own connection; readers borrow one from a small pool (``POOL_SIZE``), so
the connections a worker needs do not grow with the cases it has in flight.

The URL is any libpq URI (``postgresql://user:pw@host:5432/db``, or the Unix-socket form
``postgresql://user@/db?host=/socket/dir``). Its password never reaches a message, a log
or ``location``.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .._errors import (
    ConfigError,
    NotFound,
    StaleGeneration,
    StorageError,
    VianoError,
)
from .._ids import SHARD_SQL, Shard, validate_case_id
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
    commit_each_alone,
    generation_row,
    guarded,
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
from ._manifest import Manifest
from ._pg_leases import CLAIM, CLAIM_ATTEMPTS, FENCE, Leases
from ._pg_open import (
    NO_DATABASE,
    blob_root_problem,
    claim_blob_root,
    conninfo,
    display_url,
    driver,
    open_schema,
    translate,
)
from ._pg_schema import CURRENT_VERSION, schema_problems
from ._plan import BatchRows, GenerationRow, Head, PlanInput, plan_batch
from ._protocol import BlobInfo, CaseRef, StoreStats
from ._requests import Outcome, Request
from ._sources import read_text_file

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

log = logging.getLogger("viano.store")


_GONE: dict[str, threading.Event] = {}  # a store's pool name -> its database is gone
_POOL_NAME = re.compile(r"error connecting in '([^']+)'")


class _QuietPool(logging.Filter):
    """psycopg_pool warns about every broken connection it drops and every reconnection
    that fails; the store reports the failure itself (store_unavailable, with a hint), so
    those lines are noise to a user (a database dropped mid-batch gave one per attempt).
    A reconnection refused because the database no longer exists marks its store's
    database gone: its reads then fail at once as no_store, not each after the pool's
    30 s wait."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "discarding closed connection" in message:
            return False
        failed = _POOL_NAME.match(message)
        if failed is None:
            return True
        if NO_DATABASE.search(message):
            gone = _GONE.get(failed.group(1))
            if gone is not None:
                gone.set()
        return False


logging.getLogger("psycopg.pool").addFilter(_QuietPool())

POOL_SIZE = 8
POOL_WAIT_S = 30.0  # how long a read waits for a pooled connection (a server restart)
POOL_STEP_S = 0.5
LEASE_S = 30.0
WRITE_LOCK = 0x5649414E4F01  # pg_advisory_xact_lock key: every commit and gc take it


class PostgresStore:
    """One store: a PostgreSQL database (its ``viano_*`` tables) and a blob root."""

    kind = "postgresql"
    leases_block = True  # a round trip to the database
    reader_threads = 8  # each read waits a round trip, without the GIL
    reads_block = True  # a round trip to the database
    repair_hint = ("Mount the store's own shared blob folder at [store] blob_root, or "
                   "restore the database from a backup")

    def __init__(self, url: str, blob_root: Path, *, writable: bool, meta: dict[str, str],
                 inline_threshold: int, lease_s: float):
        pg, pool_driver = driver()
        self._psycopg = pg
        self.url = url
        self._display = display_url(url)
        self.blob_root = blob_root
        self._blob_files = BlobFiles(blob_root)
        self._writable = writable
        self.meta = meta
        # Read-only, an unmounted blob root still lets the index be read; its file blobs
        # then say why they cannot be (not "missing": they are elsewhere).
        self._root_problem = blob_root_problem(blob_root, meta)
        self.inline_threshold = inline_threshold
        self.version = CURRENT_VERSION
        self._gate = Gate(self._display)
        self._cache = ManifestCache()
        self._local = threading.local()
        self._commit_lock = threading.Lock()
        self._writer: psycopg.Connection[Any] | None = None
        self._committed = Committed()
        self.statements = 0  # sent to the server, by every connection: round trips
        self._count_lock = threading.Lock()
        store = self

        class Counting(pg.Cursor):  # type: ignore[misc, name-defined]
            def execute(self, *a: Any, **kw: Any) -> Any:
                store.count(1)
                return super().execute(*a, **kw)

            def executemany(self, *a: Any, **kw: Any) -> Any:
                store.count(1)  # pipelined: one round trip for the batch
                return super().executemany(*a, **kw)

        self._cursor = Counting
        self._pool_name = name = f"viano-{uuid.uuid4().hex[:8]}"
        self._gone = _GONE[name] = threading.Event()
        self._pool_timeout = pool_driver.PoolTimeout
        self._pool: psycopg_pool.ConnectionPool[Any] = pool_driver.ConnectionPool(
            conninfo(pg, url, writable), min_size=1, max_size=POOL_SIZE,
            kwargs={"autocommit": True, "cursor_factory": Counting}, open=False,
            name=name)
        with translate(self._display, "connect to the store"):
            self._pool.open(wait=True, timeout=30.0)
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Leases use their own pooled connection, never a read transaction's.
        self.leases = Leases(self._pool.connection, holder, lease_s)

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, write: bool, create: bool = True,
             inline_threshold: int = INLINE_THRESHOLD, blob_root: str | None = None,
             lease_s: float = LEASE_S) -> PostgresStore:
        """Open the store at ``url``; ``write`` (with ``create``) creates its schema in an
        empty database. A read-only open creates and changes nothing."""
        psycopg, _ = driver()
        shown = display_url(url)
        if not blob_root:
            raise ConfigError(f"a PostgreSQL store ({shown}) needs a blob root for its large "
                              "blobs, and none is configured",
                              hint="Set [store] blob_root in the config to a folder every "
                                   "worker can reach (a shared mount).")
        root = Path(blob_root)
        with translate(shown, "connect to the store"):
            conn = psycopg.connect(conninfo(psycopg, url, write), autocommit=True)
        try:
            with translate(shown, "open the store"):
                meta = open_schema(conn, shown, write=write, create=create, blob_root=root)
                meta = claim_blob_root(conn, root, meta, write=write)
        finally:
            conn.close()
        return cls(url, root, writable=write, meta=meta, inline_threshold=inline_threshold,
                   lease_s=lease_s)

    @property
    def location(self) -> str:
        return self._display

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def blob_files(self) -> BlobFiles:
        return self._blob_files

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """This thread's read transaction's connection, else one from the pool."""
        conn = getattr(self._local, "txn", None)
        if conn is not None:
            yield conn
            return
        conn = self._getconn()
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    def _getconn(self) -> Any:
        """A pooled connection, waiting up to POOL_WAIT_S for one in short steps, so that a
        database found gone meanwhile (the pool's reconnection says so) ends the wait."""
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            if self._gone.is_set():
                raise self._no_database()
            left = deadline - time.monotonic()
            try:
                return self._pool.getconn(timeout=max(0.01, min(POOL_STEP_S, left)))
            except self._pool_timeout:
                if left <= POOL_STEP_S:
                    if self._gone.is_set():
                        raise self._no_database() from None
                    raise

    def _no_database(self) -> NotFound:
        return NotFound(f"no store at {self._display}: the database does not exist (it "
                        "was dropped while this process used it)", reason="no_store",
                        hint="Restore or recreate the database, then run the command again.")

    def count(self, statements: int) -> None:
        with self._count_lock:
            self.statements += statements

    def _require_writable(self) -> None:
        if not self._writable:
            raise StorageError(f"the store at {self._display} is open read-only",
                               reason="store_read_only",
                               hint="Run a command that writes with a store you can write.")

    def _writer_conn(self) -> Any:
        if self._writer is None or self._writer.closed:
            self._gate.refuse_if_closed()
            self._writer = self._psycopg.connect(conninfo(self._psycopg, self.url, True),
                                                 autocommit=True, cursor_factory=self._cursor)
        return self._writer

    def close(self) -> None:
        """Wait for the operations in progress, give back this handle's leases, close every
        connection."""
        self._gate.close()
        if self._writable:
            self.leases.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._pool.close()
        _GONE.pop(self._pool_name, None)

    # -- writing ---------------------------------------------------------------------

    @guarded
    def commit_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """Commit every acceptable request of the batch in one transaction (see the
        SQLite store's: the same contract). A value the database refuses (one that
        every check before let through) fails the transaction; then each request is
        committed alone, so only the one that holds it is refused."""
        self._require_writable()
        return commit_each_alone(self._commit, requests, self._value_error)

    def _value_error(self, exc: BaseException) -> bool:
        cause = exc.__cause__ if isinstance(exc, StorageError) else exc
        return isinstance(cause, (self._psycopg.DataError, self._psycopg.IntegrityError,
                                  UnicodeEncodeError, OverflowError))

    def _commit(self, requests: Sequence[Request]) -> list[Outcome]:
        refused: list[VianoError | None] = [None] * len(requests)
        inline: dict[str, bytes] = {}
        large: Large = {}
        for i, req in enumerate(requests):
            refused[i] = prepare_blobs(self._blob_files, self.inline_threshold, req, inline,
                                       large, i)
        crash_point("batch.blobs_ready")
        with self._commit_lock, translate(self._display, "commit a batch"):
            conn = self._writer_conn()
            self.count(2)  # BEGIN and COMMIT
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                    recheck_files(self._blob_files, large, refused)
                    self._fence(conn, requests, refused)
                    rows = plan_batch(self._plan_input(conn, requests, refused, inline))
                    self._write(conn, rows)
                    crash_point("txn.before_commit")
            except self._psycopg.OperationalError:
                conn.close()  # a connection that failed mid-transaction is not reused
                raise
        self._committed.count(len(requests), rows, self._cache)
        return rows.outcomes

    def _fence(self, conn: Any, requests: Sequence[Request],
               refused: list[VianoError | None]) -> None:
        """A request for a case that another worker holds the lease on, or whose lease
        this worker has marked lost (another took it over, and may since have given it
        back), writes nothing: this worker's lease expired while it stalled."""
        cases = sorted({r.case_id for i, r in enumerate(requests) if refused[i] is None})
        if not cases:
            return
        taken = {r[0] for r in conn.execute(FENCE, {"cases": cases,
                                                    "me": self.leases.holder,
                                                    "held": self.leases.held})}
        taken.update(c for c in cases if self.leases.is_lost(c))
        for i, req in enumerate(requests):
            if refused[i] is None and req.case_id in taken:
                refused[i] = StaleGeneration(
                    f"case {req.case_id!r} is leased by another worker (this worker's lease "
                    "expired); nothing of this request was written", reason="lease_lost",
                    hint="Nothing to do: the worker that holds the case carries it on.")

    def _plan_input(self, conn: Any, requests: Sequence[Request],
                    refused: list[VianoError | None], inline: dict[str, bytes]) -> PlanInput:
        pkgs = {r.package_id for r in requests}
        cases = {r.case_id for r in requests}
        heads: dict[str, Head] = {}
        owners: dict[str, str] = {}
        for row in conn.execute(f"SELECT {REF_COLUMNS} FROM viano_refs WHERE package_id = "
                                "ANY(%s) OR case_id = ANY(%s)", (sorted(pkgs), sorted(cases))):
            ref = ref_from_row(row)
            if ref.package_id in pkgs:
                heads[ref.package_id] = Head(ref.case_id, ref.generation, ref.status)
            owners[ref.case_id] = ref.package_id
        return plan_input(requests, heads, owners, refused, inline, self.inline_threshold,
                          lambda pkg, gen: self._manifest(conn, pkg, gen),
                          lambda pkg: [r[0] for r in conn.execute(
                              "SELECT manifest_sha256 FROM viano_generations WHERE "
                              "package_id=%s ORDER BY generation", (pkg,))])

    def _write(self, conn: Any, rows: BatchRows) -> None:
        with conn.cursor() as cur:
            if rows.blobs:
                # A duplicate never overwrites a sound row; a damaged one (its bytes no
                # longer hash to its key) is healed by the verified bytes.
                cur.executemany(
                    "INSERT INTO viano_blobs AS b (sha256, size, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sha256) DO UPDATE SET size=excluded.size, "
                    "data=excluded.data WHERE excluded.data IS NOT NULL AND NOT "
                    "(b.data IS NOT NULL AND sha256(b.data) = b.sha256)",
                    [(bytes.fromhex(sha), size, data)
                     for sha, (size, data) in rows.blobs.items()])
            if rows.generations:
                cur.executemany(
                    "INSERT INTO viano_generations (package_id, generation, parent, "
                    "manifest_sha256, manifest, phase, created_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)", rows.generations)
            if rows.refs:
                cur.executemany(
                    "INSERT INTO viano_refs (package_id, case_id, generation, phase, "
                    "analysis_revision, updated_at, status, status_phase, reason, round, "
                    "max_rounds, due_at, attempt_id, calls_started) VALUES (%s, %s, %s, %s, "
                    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (package_id) DO UPDATE SET generation=excluded.generation, "
                    "phase=excluded.phase, analysis_revision=excluded.analysis_revision, "
                    "updated_at=excluded.updated_at, status=excluded.status, "
                    "status_phase=excluded.status_phase, reason=excluded.reason, "
                    "round=excluded.round, max_rounds=excluded.max_rounds, "
                    "due_at=excluded.due_at, attempt_id=excluded.attempt_id, "
                    "calls_started=excluded.calls_started",
                    [ref_row(r.package_id, r.case_id, r.generation, r.phase,
                             r.analysis_revision, r.updated_at, r.status)
                     for r in rows.refs.values()])

    # -- leases and maintenance --------------------------------------------------------

    @contextmanager
    def lease(self, case_id: str) -> Iterator[None]:
        """The case's lease row, held (and renewed) for the block. Held by another worker
        (and not expired) → :class:`CaseLocked` (DEFERRED), at once."""
        self._require_writable()
        with self._gate.use(), translate(self._display, "take a case lease"):
            held = self.leases.hold(validate_case_id(case_id))
            held.__enter__()
        try:
            yield
        except BaseException as exc:
            if not held.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            held.__exit__(None, None, None)

    def claim_due(self, now: float, limit: int, *, skip: Collection[str] = (),
                  awaiting_confirmation: bool = False, shard: Shard | None = None
                  ) -> list[CaseRef]:
        """Up to ``limit`` due cases, each leased to this worker in the same statement
        (``FOR UPDATE SKIP LOCKED``): workers claiming at once get disjoint cases, and
        a claim that lost rows to another's (committed between its snapshot and its row
        locks) is made again, so an empty answer means no due case is free."""
        if not self._writable or limit <= 0:
            skipped = set(skip)
            due = self.due_cases(now, max(limit, 0) + len(skipped),
                                 awaiting_confirmation=awaiting_confirmation, shard=shard)
            return [r for r in due if r.case_id not in skipped][:max(limit, 0)]
        where = DUE_WHERE.format(now="%(now)s") + (AWAITING_WHERE if awaiting_confirmation
                                                   else "")
        if shard is not None:  # numbers only: nothing a user typed reaches the text
            where = f"({where}) AND {SHARD_SQL % (shard.count, shard.index)}"
        sql = CLAIM.format(where=where, columns=REF_COLUMNS)
        refs: list[CaseRef] = []
        left_out = set(skip)
        started = time.monotonic()  # before the server set any expiry
        try:
            self._claim(sql, now, limit, refs, left_out)
        except BaseException:
            self._give_back([r.case_id for r in refs])  # what earlier attempts claimed
            raise
        self.leases.claimed([r.case_id for r in refs], at=started)
        return refs

    def _claim(self, sql: str, now: float, limit: int, refs: list[CaseRef],
               left_out: set[str]) -> None:
        with self._gate.use(), translate(self._display, "claim due cases"), \
                self._connection() as conn:
            for _attempt in range(CLAIM_ATTEMPTS):
                rows = conn.execute(sql, {"now": now, "skip": sorted(left_out),
                                          "limit": limit - len(refs),
                                          "me": self.leases.holder,
                                          "lease": self.leases.lease_s}).fetchall()
                got = [ref_from_row(r[1:15]) for r in rows if r[1] is not None]
                refs.extend(got)
                left_out.update(r.case_id for r in got)
                considered = rows[0][0] if rows else 0
                if len(got) == considered or len(refs) >= limit:
                    break  # nothing was lost to another worker's claim meanwhile

    def _give_back(self, case_ids: list[str]) -> None:
        if not case_ids:
            return
        try:
            with self._pool.connection() as conn:
                conn.execute("DELETE FROM viano_leases WHERE holder = %s AND case_id = "
                             "ANY(%s)", (self.leases.holder, case_ids))
        except Exception as exc:  # they expire by themselves
            log.warning("could not give back %d claim(s) (%s)", len(case_ids),
                        type(exc).__name__)

    @contextmanager
    def exclusive(self) -> Iterator[_Exclusive]:
        """Hold the write lock against every commit of every worker (gc)."""
        self._require_writable()
        with self._gate.use(), self._commit_lock, translate(self._display, "lock the store"):
            conn = self._writer_conn()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                yield _Exclusive(conn)

    @guarded
    def index_problems(self) -> list[str]:
        """What makes the index unfit to judge the blobs by (verify and gc refuse then)."""
        with translate(self._display, "inspect the index"), self._connection() as conn:
            problems = schema_problems(conn)
            if problems:  # the counts below may not even be possible
                return problems
            gens = conn.execute("SELECT COUNT(*) FROM viano_generations").fetchone()[0]
            blob_rows = conn.execute("SELECT COUNT(*) FROM viano_blobs").fetchone()[0]
        wrong_root = blob_root_problem(self.blob_root, self.meta)
        if wrong_root is not None:
            problems.append(wrong_root.message)
        elif not self._id_matches():
            problems.append(f"the blob root {self.blob_root} has no store-id file")
        if not gens and blob_rows:
            problems.append(f"the index has no generations but holds {blob_rows} blob(s): "
                            "it was emptied or replaced")
        return problems

    def _id_matches(self) -> bool:
        try:
            return read_text_file(self.blob_root / "store-id") == self.meta["store_id"]
        except (OSError, UnicodeDecodeError):
            return False

    def stats(self) -> StoreStats:
        return self._committed.stats()

    # -- reading ---------------------------------------------------------------------

    @guarded
    def _select_refs(self, where: str = "", args: Sequence[Any] = ()) -> list[CaseRef]:
        with translate(self._display, "read the case index"), self._connection() as conn:
            rows = conn.execute(f"SELECT {REF_COLUMNS} FROM viano_refs {where}",
                                args).fetchall()
        return [ref_from_row(r) for r in rows]

    def list_cases(self) -> list[CaseRef]:
        return self._select_refs("ORDER BY case_id")

    def case(self, case_id: str) -> CaseRef:
        rows = self._select_refs("WHERE case_id=%s", (case_id,))
        if not rows:
            raise NotFound(f"no case {case_id!r} in {self._display}", reason="unknown_case")
        return rows[0]

    @contextmanager
    def read_transaction(self) -> Iterator[None]:
        """Every read inside sees one committed state of the store (a REPEATABLE READ
        transaction on one connection: verify's view)."""
        with self._gate.use():
            if getattr(self._local, "txn", None) is not None:
                yield
                return
            with translate(self._display, "read the store"):
                cm = self._pool.connection()
                conn = cm.__enter__()
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._local.txn = conn
            try:
                yield
            finally:
                self._local.txn = None
                try:
                    with translate(self._display, "read the store"):
                        conn.execute("COMMIT")
                finally:
                    cm.__exit__(None, None, None)

    @guarded
    def check_lease(self, case_id: str) -> None:
        """Refuse the next step of a case whose lease this worker lost (one round trip
        only when the lease was last known ours more than lease_s / 2 ago)."""
        if not self.leases.still_held(case_id):
            raise StaleGeneration(f"case {case_id!r}: this worker's lease was taken over "
                                  "while it stalled; it takes no further step",
                                  reason="lease_lost",
                                  hint="Nothing to do: the worker that holds the case "
                                       "carries it on.")

    @guarded
    def head(self, case_id: str) -> tuple[CaseRef, Manifest]:
        """The case's index row and its head manifest. No transaction is needed for the
        pair to agree: the row (generation and status) is read in one statement, and a
        generation's manifest never changes once written (one round trip when the
        manifest is cached, as a case actor's head mostly is)."""
        self.check_lease(case_id)
        ref = self.case(case_id)
        with self._connection() as conn:
            return ref, self._manifest(conn, ref.package_id, ref.generation)

    def due_cases(self, now: float, limit: int, *, awaiting_confirmation: bool = False,
                  shard: Shard | None = None) -> list[CaseRef]:
        """The due index, read only (see the SQLite store's; :meth:`claim_due` is what
        the workers use)."""
        extra = AWAITING_WHERE if awaiting_confirmation else ""
        part, part_args = _in_shard(shard)
        return self._select_refs(f"WHERE ({DUE_WHERE.format(now='%s')}{extra}){part} "
                                 "ORDER BY COALESCE(due_at, %s), case_id LIMIT %s",
                                 (now, *part_args, now,
                                  None if limit < 0 else limit))  # as SQLite's

    @guarded
    def next_due(self, shard: Shard | None = None) -> float | None:
        part, part_args = _in_shard(shard)
        with translate(self._display, "read the case index"), self._connection() as conn:
            row = conn.execute("SELECT MIN(due_at) FROM viano_refs WHERE "
                               f"status='RETRY_PENDING'{part}", part_args).fetchone()
        return None if row[0] is None else float(row[0])

    @guarded
    def status_counts(self) -> dict[tuple[str, str], int]:
        with translate(self._display, "count cases"), self._connection() as conn:
            return {(p, s): n for p, s, n in conn.execute(
                "SELECT phase, COALESCE(status, 'READY'), COUNT(*) FROM viano_refs "
                "GROUP BY 1, 2")}

    @guarded
    def generation_counts(self) -> dict[str, int]:
        with translate(self._display, "count generations"), self._connection() as conn:
            rows = conn.execute("SELECT package_id, COUNT(*) FROM viano_generations "
                                "GROUP BY package_id").fetchall()
        return {r[0]: r[1] for r in rows}

    @guarded
    def generations(self, package_id: str) -> list[GenerationRow]:
        with translate(self._display, "read generations"), self._connection() as conn:
            rows = conn.execute(
                "SELECT package_id, generation, parent, manifest_sha256, manifest, phase, "
                "created_at FROM viano_generations WHERE package_id=%s ORDER BY generation",
                (package_id,)).fetchall()
        return [generation_row(r) for r in rows]

    @guarded
    def stored_generations(self, package_id: str) -> list[GenerationRow]:
        """Every row is on the package's history here: (package_id, generation) is the
        table's key."""
        return self.generations(package_id)

    @guarded
    def manifest(self, package_id: str, generation: int) -> Manifest:
        with self._connection() as conn:
            return self._manifest(conn, package_id, generation)

    def _manifest(self, conn: Any, package_id: str, generation: int) -> Manifest:
        key = (package_id, generation)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        check_generation(generation)
        with translate(self._display, "read a manifest"):
            row = conn.execute("SELECT manifest, manifest_sha256 FROM viano_generations "
                               "WHERE package_id=%s AND generation=%s", key).fetchone()
        manifest = stored_manifest(row, package_id, generation)
        self._cache.put(manifest)
        return manifest

    @guarded
    def blob_info(self, sha256: str) -> BlobInfo | None:
        with translate(self._display, "read a blob"), self._connection() as conn:
            row = conn.execute("SELECT size, data IS NOT NULL FROM viano_blobs WHERE "
                               "sha256=%s", (bytes.fromhex(sha256),)).fetchone()
        return None if row is None else BlobInfo(stored_size(row[0], sha256), bool(row[1]))

    @guarded
    def _stored(self, sha256: str) -> tuple[int, bytes | None]:
        with translate(self._display, "read a blob"), self._connection() as conn:
            row = conn.execute("SELECT size, data FROM viano_blobs WHERE sha256=%s",
                               (bytes.fromhex(sha256),)).fetchone()
        if row is None:
            raise StorageError(f"blob {sha256} is not in the store", reason="store_corrupt")
        return stored_size(row[0], sha256), stored_bytes(row[1])

    def read_blob(self, sha256: str) -> bytes:
        size, data = self._stored(sha256)
        return read_stored(sha256, size, data, self._open_file)

    def _open_file(self, sha256: str, size: int) -> BinaryIO:
        if self._root_problem is not None:
            raise self._root_problem
        return self._blob_files.open_regular(sha256, size)

    def open_blob(self, sha256: str) -> BinaryIO:
        size, data = self._stored(sha256)
        if data is not None:
            return verified_stream(io.BytesIO(data), sha256, len(data))
        return verified_stream(self._open_file(sha256, size), sha256, size)


class _Exclusive:
    def __init__(self, conn: Any):
        self.conn = conn

    def referenced_hashes(self) -> set[str]:
        with self.conn.cursor(name="viano_gc_refs") as cur:  # server-side: streamed
            cur.execute("SELECT package_id, generation, manifest, manifest_sha256 FROM "
                        "viano_generations")
            return referenced_hashes(cur)


def _in_shard(shard: Shard | None) -> tuple[str, tuple[int, ...]]:
    """The due index's condition for ``shard`` (SHARD_SQL: what ``shard_of`` computes)."""
    if shard is None:
        return "", ()
    return f" AND {SHARD_SQL}", (shard.count, shard.index)
