"""Opening the SQLite store: the folder's checks, creating a store whole or not at all,
migrating an older format in one transaction, the connections, and the translation of
sqlite3 and OS errors at the storage boundary (see ``_sqlite`` for the store itself)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from .._errors import NotAStore, NotFound, StorageError, VianoError
from .._ids import shard_of
from ._blobs import NOT_YOURS_TO_WRITE, fsync_dir
from ._crash import crash_point
from ._sources import read_text_file
from ._sqlite_schema import CURRENT_VERSION, create_current, migrate, parse_version
from ._wal import WAL_RESTART_BYTES

PAGE_SIZE = 16 * 1024  # of a new store; one made with 32 KiB pages (before) keeps them
WAL_SIZE_LIMIT = WAL_RESTART_BYTES  # what the WAL file is truncated to after a restart
CACHE_KIB = 65536  # the writer's; the 2 MiB default holds only 125 pages of 16 KiB
# Each worker thread has its own reader connection, and a process may run dozens of
# threads: 64 MiB each grew a 512-case batch to 600 MB (bench/throughput.py). Readers get
# a small cache; the OS page cache already holds what they read.
READER_CACHE_KIB = 4096
DB_NAME = "store.sqlite3"
ID_NAME = "store-id"
log = logging.getLogger("viano.store")


def check_folder(root: Path, write: bool) -> bool:
    """Whether ``root`` holds an index; refuses a folder that is not (or no longer) a
    store. Creates nothing."""
    if root.exists() and not root.is_dir():
        raise NotAStore(f"--store {root} is a file, not a store folder")
    _no_broken_links(root)
    db = root / DB_NAME
    if db.exists() or db.is_symlink():
        if not db.is_file():
            raise StorageError(f"{db} is not a regular file", reason="store_corrupt")
        return True
    entries = set(os.listdir(root)) if root.is_dir() else set()
    leftovers = {e for e in entries if e.startswith(f"{DB_NAME}.creating")} | {ID_NAME, "locks"}
    if "blobs" in entries:
        raise StorageError(f"{root} holds blob files but its index {DB_NAME} is missing",
                           reason="store_corrupt",
                           hint="Restore store.sqlite3 from a backup; do not write to this "
                                "store until then.")
    foreign = entries - leftovers
    if foreign:
        raise NotAStore(f"{root} is a folder that is not a Viano store (it holds "
                        f"{', '.join(sorted(foreign)[:3])})")
    if not write:
        raise NotFound(f"no store at {root}", reason="no_store",
                       hint="Create one with 'viano intake' or pass --store PATH.")
    outer = enclosing_store(root.parent)
    if outer is not None:
        # Inside another store's folders, its gc or verify would take the new store's files
        # for its own (a temporary file it reports for ever, a blob it may delete).
        raise NotAStore(f"--store {root} is inside the store folder {outer}",
                        hint="Create the store outside every other store's folder.")
    return False


def _no_broken_links(root: Path) -> None:
    """``root``, or a folder it is in, is a symbolic link that leads nowhere: named, as
    a refusal. A dangling one above the store said "File exists" (from mkdir), a loop
    above it was an internal error (pathlib's RuntimeError), a loop as the store "does
    not exist"."""
    for path in (root, *root.parents):
        if not path.is_symlink():
            continue
        try:
            os.stat(path)
        except OSError as exc:
            what = (f"--store {root} is" if path == root else
                    f"--store {root} is in {path}, which is")
            if exc.errno == errno.ELOOP:
                raise NotAStore(f"{what} a symbolic link that loops (it leads back to "
                                "itself)", hint="Point the link at a folder, or pass "
                                "--store a folder that is not under it.") from exc
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                continue  # it may lead somewhere this user cannot see: opening says why
            raise NotAStore(f"{what} a symbolic link to {os.readlink(path)}, which does "
                            "not exist", hint="Create the folder it names, or pass --store "
                            "the folder itself.") from exc


def enclosing_store(path: Path) -> Path | None:
    """The Viano store folder (this one or any other: two of a ``store-id``, a
    ``store.sqlite3`` and a ``blobs`` folder) that ``path`` is in, if any. A file written
    there (an export with ``--force``, an event log, a new store) could replace a store's
    database or one of its files, or be taken for one of them."""
    try:
        target = path.resolve(strict=False)
    except (RuntimeError, OSError):  # a link loop (RuntimeError until Python 3.13): no
        return None                  # file can be written there either
    for folder in (target, *target.parents):
        marks = ((folder / ID_NAME).is_file(), (folder / DB_NAME).exists(),
                 (folder / "blobs").is_dir())
        if sum(marks) >= 2:  # a version-1 store has no store-id until its first write
            return folder
    return None


def create_store(root: Path) -> None:
    """Build a new store under a temporary name and link it into place (never over an
    existing index: ``link`` fails if one appeared meanwhile). Creators in several
    processes take turns on ``locks/.create``."""
    (root / "locks").mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "locks" / ".create", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # brief: only while one process builds the index
        if not (root / DB_NAME).exists():
            _build(root)
    finally:
        os.close(fd)


def _build(root: Path) -> None:
    for leftover in root.glob(f"{DB_NAME}.creating*"):
        leftover.unlink(missing_ok=True)  # a crashed creator's: we hold the create lock
    tmp = root / f"{DB_NAME}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    store_id = str(uuid.uuid4())
    conn = connect(tmp, writer=True)
    try:
        with translate("create the store"):
            conn.execute("BEGIN IMMEDIATE")
            create_current(conn, store_id)
            conn.execute("COMMIT")
    finally:
        conn.close()
    try:
        os.link(tmp, root / DB_NAME)
        created = True
    except FileExistsError:
        created = False  # another process created the store first: use theirs
    finally:
        tmp.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    if created:
        # A crash before this line leaves the index without its id file; the next write
        # open writes it from meta.store_id (see _check_id).
        _write_id(root, store_id)
    fsync_dir(root)


def _write_id(root: Path, store_id: str) -> None:
    tmp = root / f".{ID_NAME}.{os.getpid()}"
    with tmp.open("w") as f:
        f.write(store_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / ID_NAME)


def open_existing(root: Path, write: bool) -> tuple[int, bool]:
    """The format of the store at ``root`` (migrated to the current one if ``write``) and
    whether it must be read as immutable (see :func:`probe`)."""
    db = root / DB_NAME
    conn, immutable = probe(db)
    try:
        version, store_id = _read_meta(conn, db)
    finally:
        conn.close()
    if version > CURRENT_VERSION:
        raise StorageError(f"{root} has store format {version}; this Viano reads up to "
                           f"{CURRENT_VERSION}", reason="store_format",
                           hint="Upgrade Viano to open this store.")
    if write and version < CURRENT_VERSION:
        version = _migrate(root, db, version)
    elif write and store_id is not None:
        _check_id(root, store_id)
    return version, immutable


def _check_id(root: Path, store_id: str) -> None:
    try:
        on_disk = read_text_file(root / ID_NAME)
    except FileNotFoundError:
        if _has_generations(root / DB_NAME):
            raise StorageError(f"{root}: the folder's store-id file is missing, so this index "
                               "cannot be shown to belong to it", reason="store_corrupt",
                               hint="Restore the store-id file (or the whole store) from a "
                                    "backup; do not write to this store.") from None
        _write_id(root, store_id)  # a crash between creating the index and its id file
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"{root}: the store-id file cannot be read ({exc})",
                           reason="store_corrupt") from exc
    if on_disk != store_id:
        raise StorageError(f"{root}: the index belongs to another store (store-id "
                           f"{on_disk[:8]}… on disk, {store_id[:8]}… in {DB_NAME})",
                           reason="store_corrupt",
                           hint="Restore the store's own store.sqlite3; do not write to it.")


def _has_generations(db: Path) -> bool:
    conn = connect_reader(db, immutable=False)
    try:
        return conn.execute("SELECT 1 FROM generations LIMIT 1").fetchone() is not None
    finally:
        conn.close()


def _migrate(root: Path, db: Path, version: int) -> int:
    conn = connect(db, writer=True)
    try:
        with translate("migrate the store"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                current, store_id = _read_meta(conn, db)  # another process may have won
                if current < CURRENT_VERSION:
                    existing = root / ID_NAME
                    store_id = read_text_file(existing) if existing.is_file() \
                        else str(uuid.uuid4())
                    _write_id(root, store_id)
                    migrate(conn, current, store_id)
                    crash_point("migrate.before_commit")
                    log.info("migrated %s from store format %d to %d", root, current,
                             CURRENT_VERSION)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    finally:
        conn.close()
    return CURRENT_VERSION


def _read_meta(conn: sqlite3.Connection, db: Path) -> tuple[int, str | None]:
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"{db} is not an initialised Viano store ({exc})",
                           reason="store_corrupt",
                           hint="Restore store.sqlite3 from a backup; it is empty, "
                                "schema-less or not a Viano index.") from exc
    version = parse_version(str(rows.get("format", "")))
    if version is None:
        raise StorageError(f"{db} has no Viano store format", reason="store_corrupt")
    return version, rows.get("store_id")


def connect(path: Path, *, writer: bool) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                               timeout=30.0)
        if writer:
            # Takes effect only when the database is created. 16 KiB was chosen while each
            # package a group commit published inserted at its own leaf of the
            # generations index (format 3): with 32 KiB pages that wrote 94-95 KiB per
            # publication at 4 GB, with 16 KiB 77-78 (bench/store_sustained.py, see the
            # README). Format 4 has no such index; blob and generation rows are appended,
            # so small pages cost them only space: ~9% more file for 2-8 KiB blobs than
            # 32 KiB pages.
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    except sqlite3.Error as exc:
        if _read_only(exc):
            raise read_only(f"open {path} to write", exc) from exc
        raise StorageError(f"cannot open {path}: {exc}", reason=_reason(exc)) from exc
    return conn


def _read_only(exc: sqlite3.Error) -> bool:
    """SQLite's own word that the file (or its folder, for the WAL) cannot be written."""
    return isinstance(exc, sqlite3.OperationalError) and "readonly database" in str(exc)


def _reason(exc: sqlite3.Error | UnicodeDecodeError) -> str:
    """OperationalError: locked, read-only, disk full, I/O; the rest: a damaged file. Text
    that is not UTF-8 (in a row, or in the schema, whose error message sqlite3 then cannot
    decode) is damage too: no writer stores it."""
    if isinstance(exc, UnicodeDecodeError) or "Could not decode to UTF-8" in str(exc):
        return "store_corrupt"
    return "store_unavailable" if isinstance(exc, sqlite3.OperationalError) else "store_corrupt"


_CORRUPT_HINT = ("The store's index is damaged: restore store.sqlite3 from a backup, or "
                 "import the cases' exports into a new store.")
_UNAVAILABLE_HINT = ("Check that the store path is writable and the disk is not full, then "
                     "run 'viano verify'.")


def _said(exc: sqlite3.Error | UnicodeDecodeError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"the index holds text that is not UTF-8 ({exc.reason} at byte {exc.start})"
    return str(exc)


def _shard(case_id: object, count: object) -> int | None:
    """``viano_shard(case_id, count)`` in the due index's queries (a damaged row's id that
    is not text, or a count that is not a positive number, is in no shard)."""
    if not isinstance(case_id, str) or not isinstance(count, int) or count < 1:
        return None
    return shard_of(case_id, count)


def _reader(path: Path, immutable: bool) -> sqlite3.Connection:
    """A read-only connection, touched once so that opening problems show here. Raises
    sqlite3 errors (the callers translate them)."""
    uri = f"file:{quote(os.fsencode(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                           timeout=30.0)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
        conn.create_function("viano_shard", 2, _shard, deterministic=True)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except BaseException:
        conn.close()
        raise
    return conn


def connect_reader(path: Path, *, immutable: bool) -> sqlite3.Connection:
    try:
        return _reader(path, immutable)
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        reason = _reason(exc)
        raise StorageError(f"cannot read {path}: {_said(exc)}", reason=reason,
                           hint=_CORRUPT_HINT if reason == "store_corrupt" else
                           "Check the store's permissions, then run the command again."
                           ) from exc


def probe(db: Path) -> tuple[sqlite3.Connection, bool]:
    """A read-only connection that works even where the user cannot write: WAL readers
    need the ``-shm`` file, which SQLite cannot create in a read-only folder. With no
    ``-wal`` there is no writer whose work could be missed, so ``immutable`` is exact."""
    try:
        return _reader(db, False), False
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if ("readonly" in text or "unable to open" in text) and \
                not Path(f"{db}-wal").exists():
            return connect_reader(db, immutable=True), True
        raise StorageError(f"cannot read {db}: {exc}", reason="store_unavailable",
                           hint="Check the store's permissions.") from exc
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"{db} is not a SQLite database ({exc})", reason="store_corrupt",
                           hint="Restore store.sqlite3 from a backup.") from exc
    except UnicodeDecodeError as exc:  # a schema whose text is not UTF-8
        raise StorageError(f"cannot read {db}: {_said(exc)}", reason="store_corrupt",
                           hint=_CORRUPT_HINT) from exc


@contextmanager
def translate(doing: str, *, write: bool = False) -> Iterator[None]:
    """Translate sqlite3/OS errors at the storage boundary. In a ``write``, a file or folder
    this user may not write is ``store_read_only`` (a read that may not read stays
    ``store_unavailable``: "read commands still work" would not be true of it)."""
    try:
        yield
    except VianoError:
        raise
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        if write and isinstance(exc, sqlite3.DatabaseError) and _read_only(exc):
            raise read_only(doing, exc) from exc
        reason = _reason(exc)
        raise StorageError(f"could not {doing}: {_said(exc)}", reason=reason,
                           hint=_CORRUPT_HINT if reason == "store_corrupt"
                           else _UNAVAILABLE_HINT) from exc
    except OSError as exc:
        if write and exc.errno in NOT_YOURS_TO_WRITE:
            raise read_only(doing, exc) from exc
        raise StorageError(f"could not {doing}: {exc}", reason="store_unavailable",
                           hint="Check that the store path is writable and the disk is not "
                                "full, then run the command again.") from exc




def read_only(doing: str, exc: BaseException) -> StorageError:
    return StorageError(f"could not {doing}: {exc}", reason="store_read_only",
                        hint="This store cannot be written by you; read commands still work.")

