"""The SQLite store's blob index: sha256 → row id, in a side file with small pages.

Why a second file: a group commit inserts a few hundred random sha256 keys. In the store's
own file (32 KiB pages, which suit the inline blobs) every insert dirtied its own index leaf
once the index outgrew a batch, so at 10 GB a publication wrote ~115 KiB of WAL for ~17 KiB
of data, and the publication rate fell to 0.60× its start (bench/store_sustained.py). The
data now goes to ``blob_rows``, appended by integer id and indexed by nothing there; the
index is ``keys (sha256, id)`` in ``blob-index.sqlite3`` with 1 KiB pages.

The main file stays the truth; the index is derived from it, so no atomicity across the two
files is needed (SQLite gives none across WAL databases):

- the index records the last row id it covers (``state.covered``), in the same transaction
  as its keys;
- every write transaction first repairs the index (:func:`catch_up`): rows past ``covered``
  (their main-file commit landed, the index's did not) are indexed, and entries past the
  main file's last id (the reverse) are dropped;
- a lookup joins the entry with its row and compares the row's own sha256, so an entry that
  names a reused or damaged row is never served; a key found nowhere in the index is looked
  for among the rows past ``covered`` (normally none) and in the version-2 ``blobs`` table,
  which a migrated store keeps as it is (the migration copies nothing);
- an index file that is missing, unreadable, or another store's is rebuilt from the rows by
  the next writer. Readers that cannot attach one look through the rows themselves.

So the index is written with ``synchronous=NORMAL``: what a power loss takes from it, the
next write transaction puts back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._errors import StorageError

INDEX_NAME = "blob-index.sqlite3"
INDEX_PAGE_SIZE = 1024
INDEX_CACHE_KIB = 32768  # a 10 GB store's index is ~90 MB; its upper levels stay cached
INDEX_FILES = (INDEX_NAME, f"{INDEX_NAME}-wal", f"{INDEX_NAME}-shm")
_SCHEMA = ("CREATE TABLE keys (sha256 BLOB PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID",
           "CREATE TABLE state (key TEXT PRIMARY KEY, value NOT NULL)")
log = logging.getLogger("viano.store")


def attach_for_writing(conn: sqlite3.Connection, root: Path, store_id: str) -> None:
    """Attach the index as ``ix`` to a writer connection, building it if it is missing,
    not an index, or another store's."""
    path = root / INDEX_NAME
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise StorageError(f"{path} is not a regular file", reason="store_corrupt",
                           hint=f"Remove {path}: the next write rebuilds the blob index from "
                                "the store.")
    problem = _unfit(path, store_id)
    if problem is not None:
        if path.exists():
            log.warning("rebuilding the blob index of %s (%s)", root, problem)
        for name in INDEX_FILES:
            (root / name).unlink(missing_ok=True)
        _build(path, store_id)
    # Bound as bytes: a folder name need not be UTF-8 (SQLite reads the blob as the name).
    conn.execute("ATTACH DATABASE ? AS ix", (os.fsencode(path),))
    conn.execute("PRAGMA ix.journal_mode=WAL")
    conn.execute("PRAGMA ix.synchronous=NORMAL")
    conn.execute(f"PRAGMA ix.cache_size=-{INDEX_CACHE_KIB}")
    conn.execute("PRAGMA ix.journal_size_limit=67108864")


def attach_for_reading(conn: sqlite3.Connection, root: Path, store_id: str | None,
                       immutable: bool) -> bool:
    """Attach the index read-only if it is there and this store's; False if not (the
    reader then looks through the rows)."""
    path = root / INDEX_NAME
    if store_id is None or _unfit(path, store_id) is not None:
        return False  # checked first without attaching: attaching creates -wal and -shm
    # Like the main file: in a folder the reader cannot write, a WAL database without its
    # -wal file is read as immutable (SQLite cannot create the -shm there).
    tries = [immutable] if immutable else [False] + (
        [] if Path(f"{path}-wal").exists() else [True])
    for frozen in tries:
        uri = f"file:{quote(os.fsencode(path))}?mode=ro" + ("&immutable=1" if frozen else "")
        try:
            conn.execute("ATTACH DATABASE ? AS ix", (uri,))
            conn.execute("SELECT value FROM ix.state WHERE key='covered'").fetchone()
            return True
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("DETACH DATABASE ix")
    return False


def _unfit(path: Path, store_id: str) -> str | None:
    """Why the file at ``path`` cannot serve as this store's index (None: it can). Read
    as immutable, which creates nothing beside it: the store id and the schema never
    change once the file is in place."""
    if path.is_symlink() or not path.is_file():
        return "missing" if not path.exists() else "not a regular file"
    try:
        conn = sqlite3.connect(f"file:{quote(os.fsencode(path))}?mode=ro&immutable=1",
                               uri=True, isolation_level=None)
        try:
            row = conn.execute("SELECT value FROM state WHERE key='store_id'").fetchone()
            conn.execute("SELECT sha256, id FROM keys LIMIT 1").fetchall()
            covered = conn.execute("SELECT value FROM state WHERE key='covered'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"unreadable: {exc}"
    if row is None or row[0] != store_id:
        return "another store's"
    if covered is None or type(covered[0]) is not int:
        return "no coverage mark"
    return None


def _build(path: Path, store_id: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    for name in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        name.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size={INDEX_PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.executemany("INSERT INTO state VALUES (?, ?)",
                         [("store_id", store_id), ("covered", 0)])
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=DELETE")  # no -wal to move beside it
    finally:
        conn.close()
    os.replace(tmp, path)  # covers nothing yet: the next write transaction fills it


def catch_up(conn: sqlite3.Connection) -> int:
    """Inside a write transaction: make the index cover exactly the rows there are.
    Returns the last row id (the next rows are numbered after it)."""
    top = conn.execute("SELECT coalesce(max(id), 0) FROM blob_rows").fetchone()[0]
    covered = conn.execute("SELECT value FROM ix.state WHERE key='covered'").fetchone()[0]
    if covered == top:
        return int(top)
    if covered > top:  # the index's commit landed and the main file's did not
        conn.execute("DELETE FROM ix.keys WHERE id > ?", (top,))
    else:  # the reverse (or a rebuilt index): index the rows past the mark
        log.info("indexing blob rows %d..%d", covered + 1, top)
        conn.execute("INSERT OR REPLACE INTO ix.keys (sha256, id) SELECT sha256, id FROM "
                     "blob_rows WHERE id > ?", (covered,))
    _set_covered(conn, top)
    return int(top)


def _set_covered(conn: sqlite3.Connection, top: int) -> None:
    conn.execute("UPDATE ix.state SET value=? WHERE key='covered'", (top,))


def write_blobs(conn: sqlite3.Connection, blobs: dict[str, tuple[int, bytes | None]],
                chunk: int = 500) -> None:
    """Inside a write transaction, after :func:`catch_up`: add the blobs not stored yet.
    A blob already stored is never overwritten, unless its row is damaged (its bytes no
    longer hash to its key): then the verified bytes heal it."""
    top = catch_up(conn)
    keys = [bytes.fromhex(sha) for sha in blobs]
    indexed: dict[bytes, int] = {}
    legacy: set[bytes] = set()
    for part in _chunks(keys, chunk):
        marks = ",".join("?" * len(part))
        indexed.update(conn.execute(
            f"SELECT k.sha256, k.id FROM ix.keys k JOIN blob_rows r ON r.id = k.id AND "
            f"r.sha256 = k.sha256 WHERE k.sha256 IN ({marks})", part).fetchall())
        rest = [k for k in part if k not in indexed]
        if rest:
            legacy.update(r[0] for r in conn.execute(
                f"SELECT sha256 FROM blobs WHERE sha256 IN ({','.join('?' * len(rest))})",
                rest))
    new: list[tuple[int, bytes, int, bytes | None]] = []
    heal_rows: list[tuple[int, bytes | None, int]] = []
    heal_legacy: list[tuple[int, bytes | None, bytes]] = []
    for key, (size, data) in zip(keys, blobs.values(), strict=True):
        if key in indexed:
            if data is not None:
                heal_rows.append((size, data, indexed[key]))
        elif key in legacy:
            if data is not None:
                heal_legacy.append((size, data, key))
        else:
            top += 1
            new.append((top, key, size, data))
    if new:
        conn.executemany("INSERT INTO blob_rows (id, sha256, size, data) VALUES (?, ?, ?, ?)",
                         new)
        conn.executemany("INSERT OR REPLACE INTO ix.keys (sha256, id) VALUES (?, ?)",
                         [(key, i) for i, key, _, _ in new])
        _set_covered(conn, top)
    if heal_rows:
        conn.executemany("UPDATE blob_rows SET size=?, data=? WHERE id=? AND NOT "
                         "viano_blob_ok(sha256, data)", heal_rows)
    if heal_legacy:
        conn.executemany("UPDATE blobs SET size=?, data=? WHERE sha256=? AND NOT "
                         "viano_blob_ok(sha256, data)", heal_legacy)


def find(conn: sqlite3.Connection, key: bytes, columns: str, *, has_rows: bool,
         has_index: bool) -> Sequence[Any] | None:
    """One blob's ``columns`` (of ``size`` and ``data``), wherever it is stored."""
    if has_index:
        row = conn.execute(f"SELECT {_qualified(columns, 'r')} FROM ix.keys k JOIN blob_rows "
                           "r ON r.id = k.id AND r.sha256 = k.sha256 WHERE k.sha256=?",
                           (key,)).fetchone()
        if row is not None:
            return tuple(row)
    row = conn.execute(f"SELECT {columns} FROM blobs WHERE sha256=?", (key,)).fetchone()
    if row is not None or not has_rows:
        return None if row is None else tuple(row)
    covered = 0
    if has_index:
        mark = conn.execute("SELECT value FROM ix.state WHERE key='covered'").fetchone()
        covered = mark[0] if mark is not None and type(mark[0]) is int else 0
    row = conn.execute(f"SELECT {columns} FROM blob_rows WHERE id > ? AND sha256=? LIMIT 1",
                       (covered, key)).fetchone()
    return None if row is None else tuple(row)


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _chunks(items: Sequence[bytes], n: int) -> Iterable[Sequence[bytes]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
