"""The SQLite store's schema, its versions and the migrations between them.

The version lives in ``meta.format`` (``viano-store/N``). A store of an older version is
migrated the first time it is opened for writing, in one transaction (SQLite's DDL is
transactional, so a crash leaves the old version intact); opened read-only, an older store
is read as it is. A newer version than this code knows is refused (``store_format``).

Version history:

1. ``meta``, ``blobs`` (raw 32-byte sha256 keys; inline data or NULL for a file),
   ``generations`` (exact manifest bytes and their hash) and ``refs`` (the head of each
   package; also the case index).
2. The durable case status in ``refs`` (status, its phase, reason, round, max_rounds,
   due_at as POSIX seconds, attempt_id, calls_started), indexed by (status, due_at) for
   the work queue; ``meta.store_id``, which the ``store-id`` file beside the blobs repeats.
3. ``blob_rows`` (id, sha256, size, data): new blobs are appended here by integer id, with
   no index in this file; their sha256 index is the side file ``blob-index.sqlite3`` (see
   ``_sqlite_index``). The version-2 ``blobs`` table stays as it is and is still read, so
   the migration copies nothing.
4. ``generations`` without its (package_id, generation) primary-key index: each
   package a group commit published inserted at its own leaf of that index, and once the
   index outgrew a batch every publication dirtied a whole 16 KiB page of it (257 of a
   batch's ~590 pages of WAL at 1.8 GB, bench/store_sustained.py). A generation is found
   by its chain instead: ``refs.head_row`` names the head's row (``generations.id``) and
   each row's ``parent_row`` its parent's (0 for a generation 1; NOT NULL, so a writer of
   format 3 still running cannot add a row off the chain), so rows are only ever appended.
   A partial unique index holds one entry per package, for its generation 1. The migration
   rebuilds the table once (the old rowids become the ids) and fills both columns.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

FORMAT_PREFIX = "viano-store/"
CURRENT_VERSION = 4

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE blobs (sha256 BLOB PRIMARY KEY, size INTEGER NOT NULL, data BLOB);
CREATE TABLE generations (
    package_id TEXT NOT NULL, generation INTEGER NOT NULL, parent INTEGER,
    manifest_sha256 TEXT NOT NULL, manifest BLOB NOT NULL,
    phase TEXT NOT NULL, created_at TEXT NOT NULL,
    PRIMARY KEY (package_id, generation));
CREATE TABLE refs (
    package_id TEXT PRIMARY KEY, case_id TEXT NOT NULL UNIQUE, generation INTEGER NOT NULL,
    phase TEXT NOT NULL, analysis_revision INTEGER NOT NULL, updated_at TEXT NOT NULL)
"""

_V2_COLUMNS = (
    ("status", "TEXT"), ("status_phase", "TEXT"), ("reason", "TEXT"), ("round", "INTEGER"),
    ("max_rounds", "INTEGER"), ("due_at", "REAL"), ("attempt_id", "TEXT"),
    ("calls_started", "INTEGER NOT NULL DEFAULT 0"),
)


def _to_v2(conn: sqlite3.Connection, store_id: str) -> None:
    for name, kind in _V2_COLUMNS:
        conn.execute(f"ALTER TABLE refs ADD COLUMN {name} {kind}")
    # Every case of a version-1 store is at intake: it has work to do.
    conn.execute("UPDATE refs SET status='READY', status_phase=phase")
    conn.execute("CREATE INDEX refs_due ON refs (status, due_at)")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('store_id', ?)", (store_id,))


def _to_v3(conn: sqlite3.Connection, _store_id: str) -> None:
    conn.execute("CREATE TABLE blob_rows (id INTEGER PRIMARY KEY, sha256 BLOB NOT NULL, "
                 "size INTEGER NOT NULL, data BLOB)")


def _to_v4(conn: sqlite3.Connection, _store_id: str) -> None:
    # Both columns are filled from the old table while its index is still there.
    conn.execute("ALTER TABLE refs ADD COLUMN head_row INTEGER")
    conn.execute("UPDATE refs SET head_row = (SELECT g.rowid FROM generations g WHERE "
                 "g.package_id = refs.package_id AND g.generation = refs.generation)")
    conn.execute(
        "CREATE TABLE chained (id INTEGER PRIMARY KEY, package_id TEXT NOT NULL, "
        "generation INTEGER NOT NULL, parent INTEGER, manifest_sha256 TEXT NOT NULL, "
        "manifest BLOB NOT NULL, phase TEXT NOT NULL, created_at TEXT NOT NULL, "
        "parent_row INTEGER NOT NULL)")
    conn.execute(
        "INSERT INTO chained SELECT g.rowid, g.package_id, g.generation, g.parent, "
        "g.manifest_sha256, g.manifest, g.phase, g.created_at, COALESCE((SELECT p.rowid "
        "FROM generations p WHERE p.package_id = g.package_id AND p.generation = g.parent),"
        " 0) FROM generations g ORDER BY g.rowid")
    conn.execute("DROP TABLE generations")
    conn.execute("ALTER TABLE chained RENAME TO generations")
    conn.execute("CREATE UNIQUE INDEX generations_first ON generations (package_id) "
                 "WHERE generation = 1")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection, str], None]] = {
    1: _to_v2, 2: _to_v3, 3: _to_v4}


def create_current(conn: sqlite3.Connection, store_id: str) -> None:
    """Build a new store: version 1, then every migration, so that a new store and a
    migrated one have exactly the same schema."""
    for stmt in _V1.strip().split(";"):
        conn.execute(stmt)
    conn.execute("INSERT INTO meta VALUES ('format', ?)", (f"{FORMAT_PREFIX}1",))
    migrate(conn, 1, store_id)


def migrate(conn: sqlite3.Connection, version: int, store_id: str) -> None:
    """Bring a store from ``version`` to the current one (inside the caller's transaction)."""
    while version < CURRENT_VERSION:
        MIGRATIONS[version](conn, store_id)
        version += 1
        conn.execute("UPDATE meta SET value=? WHERE key='format'", (f"{FORMAT_PREFIX}{version}",))


def parse_version(value: str) -> int | None:
    if not value.startswith(FORMAT_PREFIX):
        return None
    tail = value[len(FORMAT_PREFIX):]
    return int(tail) if tail.isdigit() else None
