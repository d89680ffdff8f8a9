"""The SQLite store's blob index: sha256 → row id, in a side file with small pages.

Why a second file: a group commit inserts a few hundred random sha256 keys. In the store's
own file (32 KiB pages then; 16 KiB in stores made since) every insert dirtied its own index
leaf once the index outgrew a batch, so at 10 GB a publication wrote ~115 KiB of WAL for
~17 KiB of data, and the publication rate fell to 0.60× its start (bench/store_sustained.py). The
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
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
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
    with _index_lock(root):  # one check-and-rebuild at a time, across processes
        problem = _unfit(path, store_id, immutable=False)
        if problem is not None:
            if path.exists():
                log.warning("rebuilding the blob index of %s (%s)", root, problem)
            for leftover in root.glob(f".{INDEX_NAME}.*"):
                leftover.unlink(missing_ok=True)  # a crashed builder's: we hold the lock
            for name in INDEX_FILES:
                (root / name).unlink(missing_ok=True)
            _build(path, store_id)
    # Bound as bytes: a folder name need not be UTF-8 (SQLite reads the blob as the name).
    conn.execute("ATTACH DATABASE ? AS ix", (os.fsencode(path),))
    conn.execute("PRAGMA ix.journal_mode=WAL")
    conn.execute("PRAGMA ix.synchronous=NORMAL")
    conn.execute(f"PRAGMA ix.cache_size=-{INDEX_CACHE_KIB}")
    conn.execute("PRAGMA ix.journal_size_limit=67108864")


@contextlib.contextmanager
def _index_lock(root: Path) -> Iterator[None]:
    (root / "locks").mkdir(exist_ok=True)
    fd = os.open(root / "locks" / ".index", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def rebuild(conn: sqlite3.Connection) -> None:
    """Inside a write transaction: index every row again (the index was found wrong)."""
    log.warning("the blob index disagrees with the rows; indexing them all again")
    conn.execute("DELETE FROM ix.keys")
    _set_covered(conn, 0)
    catch_up(conn)


def attach_for_reading(conn: sqlite3.Connection, root: Path, store_id: str | None,
                       immutable: bool) -> bool:
    """Attach the index read-only if it is there and this store's; False if not (the
    reader then looks through the rows)."""
    path = root / INDEX_NAME
    if store_id is None or _unfit(path, store_id, immutable=True) is not None:
        return False  # checked first without attaching: attaching creates -wal and -shm
    # Like the main file: in a folder the reader cannot write, a WAL database without a
    # -wal holding frames is read as immutable (SQLite cannot create the -shm there).
    wal = Path(f"{path}-wal")
    quiet = not wal.exists() or wal.stat().st_size == 0
    tries = ([True] if quiet else []) if immutable else [False] + ([True] if quiet else [])
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


def _unfit(path: Path, store_id: str, *, immutable: bool) -> str | None:
    """Why the file at ``path`` cannot serve as this store's index (None: it can). A
    reader reads it as immutable, which creates nothing beside it (the store id and the
    schema never change once the file is in place; a torn read only makes it look through
    the rows); a writer, which may delete what it finds unfit, reads it as it is."""
    if path.is_symlink() or not path.is_file():
        return "missing" if not path.exists() else "not a regular file"
    try:
        conn = sqlite3.connect(f"file:{quote(os.fsencode(path))}?mode=ro"
                               + ("&immutable=1" if immutable else ""),
                               uri=True, isolation_level=None, timeout=30.0)
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
    mark = conn.execute("SELECT value FROM ix.state WHERE key='covered'").fetchone()
    covered = mark[0] if mark is not None and type(mark[0]) is int and mark[0] >= 0 else 0
    if covered > top:  # the index's commit landed and the main file's did not
        conn.execute("DELETE FROM ix.keys WHERE id > ?", (top,))
        covered = top
    if covered and not _agrees_at(conn, covered):
        # Another history of this store (an index restored from elsewhere): start again.
        conn.execute("DELETE FROM ix.keys")
        covered = 0
    if covered < top:  # the main file's commit landed and the index's did not, or a rebuild
        log.info("indexing blob rows %d..%d", covered + 1, top)
        conn.execute("INSERT OR REPLACE INTO ix.keys (sha256, id) SELECT sha256, id FROM "
                     "blob_rows WHERE id > ?", (covered,))
    if mark is None or mark[0] != top:
        _set_covered(conn, top)
    return int(top)


def _agrees_at(conn: sqlite3.Connection, row_id: int) -> bool:
    """Does the index hold the row at ``row_id`` under that id (the history check)?"""
    row = conn.execute("SELECT 1 FROM blob_rows r JOIN ix.keys k ON k.sha256 = r.sha256 "
                       "WHERE r.id = ? AND k.id = r.id", (row_id,)).fetchone()
    return row is not None


def _set_covered(conn: sqlite3.Connection, top: int) -> None:
    conn.execute("INSERT OR REPLACE INTO ix.state (key, value) VALUES ('covered', ?)", (top,))


class IndexDamaged(StorageError):
    """The index file itself is damaged (SQLite: malformed); the writer replaces it."""

    def __init__(self, exc: sqlite3.DatabaseError):
        super().__init__(f"the blob index is damaged ({exc})", reason="store_corrupt",
                         hint=f"Remove {INDEX_NAME} from the store folder: the next write "
                              "rebuilds it from the store.")


def _damage(exc: sqlite3.DatabaseError) -> bool:
    """A damaged file, as opposed to a busy or failing one (those are the store's)."""
    return not isinstance(exc, sqlite3.OperationalError) or "malformed" in str(exc)


def discard(root: Path) -> None:
    """Remove the index files (the writer found them damaged and rebuilds them)."""
    with _index_lock(root):
        for name in INDEX_FILES:
            (root / name).unlink(missing_ok=True)


def write_blobs(conn: sqlite3.Connection, blobs: dict[str, tuple[int, bytes | None]],
                chunk: int = 500, *, search_legacy: bool = True) -> None:
    """Inside a write transaction: add the blobs not stored yet. A blob already stored is
    never overwritten, unless its row is damaged (its bytes no longer hash to its key):
    then the verified bytes heal it. Raises :class:`IndexDamaged` for a damaged index.

    ``search_legacy=False`` says the version-2 ``blobs`` table is empty (:func:`has_legacy_blobs`),
    so it is not searched: it stays empty, as nothing of version 3 adds to it."""
    try:
        _write_blobs(conn, blobs, chunk, search_legacy)
    except sqlite3.DatabaseError as exc:
        if _damage(exc) and _index_is_damaged(conn):
            raise IndexDamaged(exc) from exc
        raise


def _index_is_damaged(conn: sqlite3.Connection) -> bool:
    try:
        return bool(conn.execute("PRAGMA ix.quick_check(1)").fetchone()[0] != "ok")
    except sqlite3.DatabaseError:
        return True


def has_legacy_blobs(conn: sqlite3.Connection) -> bool:
    """Does the version-2 ``blobs`` table (kept as it was by the migration) hold a row?"""
    return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM blobs)").fetchone()[0])


def _write_blobs(conn: sqlite3.Connection, blobs: dict[str, tuple[int, bytes | None]],
                 chunk: int, search_legacy: bool) -> None:
    top = catch_up(conn)
    keys = [bytes.fromhex(sha) for sha in blobs]
    indexed = _indexed(conn, keys, chunk)
    if indexed is None:  # an entry names a row that does not hold its key
        rebuild(conn)
        top = catch_up(conn)
        indexed = _indexed(conn, keys, chunk) or {}
    legacy: set[bytes] = set()
    for part in _chunks(keys, chunk) if search_legacy else ():
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
        # In key order, so that neighbouring keys are inserted into the same index pages.
        conn.executemany("INSERT OR REPLACE INTO ix.keys (sha256, id) VALUES (?, ?)",
                         sorted((key, i) for i, key, _, _ in new))
        _set_covered(conn, top)
    if heal_rows:
        conn.executemany("UPDATE blob_rows SET size=?, data=? WHERE id=? AND NOT "
                         "viano_blob_ok(sha256, data)", heal_rows)
    if heal_legacy:
        conn.executemany("UPDATE blobs SET size=?, data=? WHERE sha256=? AND NOT "
                         "viano_blob_ok(sha256, data)", heal_legacy)


def _indexed(conn: sqlite3.Connection, keys: Sequence[bytes], chunk: int
             ) -> dict[bytes, int] | None:
    """The row ids of the keys the index holds; None if an entry names a row that does
    not hold its key (the index is wrong: it must not decide what is new)."""
    found: dict[bytes, int] = {}
    for part in _chunks(keys, chunk):
        marks = ",".join("?" * len(part))
        for key, row_id, row_key in conn.execute(
                f"SELECT k.sha256, k.id, r.sha256 FROM ix.keys k LEFT JOIN blob_rows r ON "
                f"r.id = k.id WHERE k.sha256 IN ({marks})", part):
            if row_key != key:
                return None
            found[key] = row_id
    return found


def find(conn: sqlite3.Connection, key: bytes, columns: str, *, has_rows: bool,
         has_index: bool) -> Sequence[Any] | None:
    """One blob's ``columns`` (of ``size`` and ``data``), wherever it is stored. One read
    transaction, so the index and the rows are read as of one moment; an index that is
    wrong or damaged only makes this look through the rows."""
    begun = not conn.in_transaction
    if begun:
        conn.execute("BEGIN")
    try:
        return _find(conn, key, columns, has_rows, has_index)
    finally:
        if begun and conn.in_transaction:
            conn.execute("COMMIT")


def _find(conn: sqlite3.Connection, key: bytes, columns: str, has_rows: bool,
          has_index: bool) -> Sequence[Any] | None:
    covered = 0
    if has_index:
        try:
            row = conn.execute(f"SELECT {_qualified(columns, 'r')} FROM ix.keys k JOIN "
                               "blob_rows r ON r.id = k.id AND r.sha256 = k.sha256 WHERE "
                               "k.sha256=?", (key,)).fetchone()
            if row is not None:
                return tuple(row)
            mark = conn.execute("SELECT value FROM ix.state WHERE key='covered'").fetchone()
            covered = mark[0] if mark is not None and type(mark[0]) is int else 0
        except sqlite3.DatabaseError as exc:
            if not _damage(exc):
                raise  # busy, I/O: the store's trouble, not the index's
            log.warning("the blob index cannot be read (%s); looking through the rows", exc)
    row = conn.execute(f"SELECT {columns} FROM blobs WHERE sha256=?", (key,)).fetchone()
    if row is not None or not has_rows:
        return None if row is None else tuple(row)
    row = conn.execute(f"SELECT {columns} FROM blob_rows WHERE id > ? AND sha256=? LIMIT 1",
                       (covered, key)).fetchone()
    if row is None and covered:  # not where the index says it would be: look everywhere
        row = conn.execute(f"SELECT {columns} FROM blob_rows WHERE sha256=? LIMIT 1",
                           (key,)).fetchone()
    return None if row is None else tuple(row)


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _chunks(items: Sequence[bytes], n: int) -> Iterable[Sequence[bytes]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
