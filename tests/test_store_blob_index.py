"""The SQLite store's blob index is a side file derived from the main file: whatever state
it is left in (missing, behind, ahead, garbage, another store's, a power loss's rollback),
no blob is lost, none is served wrong, and the next write repairs it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import zipfile
from pathlib import Path

import pytest

from engine import BytesSource, Change, PublishRequest, SqliteStore, StorageError, sha256_hex
from engine._store._sqlite_index import INDEX_NAME
from tests.conftest import Cli
from tests.store_helpers import create

pytestmark = pytest.mark.sqlite_only  # a file of the SQLite backend


def _publish(store: SqliteStore, case: str, payloads: list[bytes]) -> None:
    """A new case holding ``payloads`` (inline blobs)."""
    files = {f"inputs/{i}.bin": BytesSource.of(p) for i, p in enumerate(payloads)}
    out = store.commit_batch([PublishRequest(
        f"pkg-{case.lower()}", case, None, Change(files=files, phase="INTAKE"))])
    assert not isinstance(out[0], Exception), out[0]


def _rows(root: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(root / "store.sqlite3")
    try:
        return [(i, bytes(s).hex()) for i, s in
                conn.execute("SELECT id, sha256 FROM blob_rows ORDER BY id")]
    finally:
        conn.close()


def _keys(root: Path) -> dict[str, int]:
    conn = sqlite3.connect(root / INDEX_NAME)
    try:
        return {bytes(s).hex(): i for s, i in conn.execute("SELECT sha256, id FROM keys")}
    finally:
        conn.close()


def _store(root: Path, write: bool = True) -> SqliteStore:
    return SqliteStore.open(root, write=write)


def _all_readable(root: Path, payloads: list[bytes]) -> None:
    ro = _store(root, write=False)
    try:
        for p in payloads:
            assert ro.read_blob(sha256_hex(p)) == p
    finally:
        ro.close()


def _v1_store(root: Path) -> None:
    """A store written by the landed version-1 code (tests/fixtures), at ``root``."""
    with zipfile.ZipFile(Path(__file__).with_name("fixtures") / "store-v1.zip") as zf:
        zf.extractall(root)


PAYLOADS = [b"first %d" % i for i in range(5)]
LATER = [b"later %d" % i for i in range(5)]


def test_every_row_is_indexed_once_and_duplicates_add_no_row(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    _publish(store, "A-2", PAYLOADS + LATER)  # five already stored, five new
    store.close()
    rows = _rows(root)
    assert [i for i, _ in rows] == list(range(1, 11))
    assert len({s for _, s in rows}) == 10
    assert _keys(root) == {s: i for i, s in rows}
    _all_readable(root, PAYLOADS + LATER)


def test_a_missing_index_is_read_around_and_rebuilt_by_the_next_write(tmp_path: Path,
                                                                      cli: Cli) -> None:
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    for name in (INDEX_NAME, f"{INDEX_NAME}-wal", f"{INDEX_NAME}-shm"):
        (root / name).unlink(missing_ok=True)
    _all_readable(root, PAYLOADS)  # a reader looks through the rows
    assert not (root / INDEX_NAME).exists()  # and creates nothing
    store = _store(root)
    _publish(store, "A-2", PAYLOADS + LATER)
    store.close()
    assert len(_rows(root)) == 10  # the rebuilt index still deduplicated
    assert _keys(root) == {s: i for i, s in _rows(root)}
    assert cli("verify", "--store", root).code == 0


def test_an_index_behind_the_rows_is_caught_up(tmp_path: Path, cli: Cli) -> None:
    """The main file's commit landed and the index's did not (a crash between the two, or a
    power loss taking the index's last transactions, which are not fsynced)."""
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    saved = (root / INDEX_NAME).read_bytes()
    store = _store(root)
    _publish(store, "A-2", LATER)
    store.close()
    (root / INDEX_NAME).write_bytes(saved)  # the index as it was before A-2
    assert len(_keys(root)) == 5
    _all_readable(root, PAYLOADS + LATER)  # rows past the index's mark are found
    store = _store(root)
    _publish(store, "A-3", [*LATER, b"third"])  # LATER must not be stored twice
    store.close()
    assert len(_rows(root)) == 11
    assert _keys(root) == {s: i for i, s in _rows(root)}
    assert cli("verify", "--store", root).code == 0


def test_entries_past_the_rows_are_never_served_and_are_dropped(tmp_path: Path) -> None:
    """The index's commit landed and the main file's did not: its entries name rows that
    do not exist, or that a later batch numbers again with other content."""
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    ghost = sha256_hex(b"never committed")
    conn = sqlite3.connect(root / INDEX_NAME)
    conn.execute("INSERT INTO keys VALUES (?, 6)", (bytes.fromhex(ghost),))
    conn.execute("UPDATE state SET value=6 WHERE key='covered'")
    conn.commit()
    conn.close()
    ro = _store(root, write=False)
    assert ro.blob_info(ghost) is None
    ro.close()
    store = _store(root)
    _publish(store, "A-2", [b"the real row 6"])
    assert store.read_blob(sha256_hex(b"the real row 6")) == b"the real row 6"
    assert store.blob_info(ghost) is None
    store.close()
    assert _keys(root) == {s: i for i, s in _rows(root)}
    assert ghost not in _keys(root)


def test_an_entry_naming_another_row_is_not_served(tmp_path: Path) -> None:
    """A damaged or stale entry points at a row that holds other content: the row's own
    sha256 decides, and the blob is found where it really is."""
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    keys = _keys(root)
    a, b = sha256_hex(PAYLOADS[0]), sha256_hex(PAYLOADS[1])
    _remap(root, a, keys[b])
    conn = sqlite3.connect(root / INDEX_NAME)
    conn.execute("UPDATE state SET value=0 WHERE key='covered'")  # and it is behind
    conn.commit()
    conn.close()
    _all_readable(root, PAYLOADS)


@pytest.mark.parametrize("damage", ["garbage", "empty", "another store's", "a directory"])
def test_an_unfit_index_is_ignored_by_readers_and_rebuilt(tmp_path: Path, cli: Cli,
                                                          damage: str) -> None:
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    index = root / INDEX_NAME
    if damage == "garbage":
        index.write_bytes(os.urandom(4096))
    elif damage == "empty":
        index.write_bytes(b"")
    elif damage == "another store's":
        other = _store(tmp_path / "other")
        _publish(other, "O-1", [b"other"])
        other.close()
        shutil.copy(tmp_path / "other" / INDEX_NAME, index)
    else:
        index.unlink()
        index.mkdir()
    _all_readable(root, PAYLOADS)
    assert cli("verify", "--store", root).code == 0
    if damage == "a directory":  # not ours to delete: writing is refused until it goes
        with pytest.raises(StorageError) as refused:
            _publish(_store(root), "A-2", LATER)
        assert refused.value.reason == "store_corrupt" and "Remove" in refused.value.hint
        index.rmdir()
    store = _store(root)
    _publish(store, "A-2", PAYLOADS + LATER)
    store.close()
    assert len(_rows(root)) == 10
    assert _keys(root) == {s: i for i, s in _rows(root)}
    assert cli("verify", "--store", root).code == 0


def test_a_damaged_row_is_healed_by_the_same_bytes_again(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    conn = sqlite3.connect(root / "store.sqlite3")
    conn.execute("UPDATE blob_rows SET data=CAST('rot' AS BLOB) WHERE sha256=?",
                 (bytes.fromhex(sha256_hex(PAYLOADS[2])),))
    conn.commit()
    conn.close()
    store = _store(root)
    out = store.commit_batch([create("A-2", PAYLOADS[2])])
    assert not isinstance(out[0], Exception)
    assert store.read_blob(sha256_hex(PAYLOADS[2])) == PAYLOADS[2]
    store.close()
    assert len(_rows(root)) == 6  # healed in place; A-2's case/c.json is the new row


def test_a_migrated_store_reads_and_deduplicates_against_its_old_blobs(
        tmp_path: Path, cli: Cli, sample: Path) -> None:
    """A version-1 store (the landed code's, tests/fixtures) keeps its ``blobs`` table: the
    migration copies nothing, old blobs are read from it, and the same bytes again are
    not stored a second time in ``blob_rows``."""
    root = tmp_path / "v1"
    _v1_store(root)
    assert cli("intake", "--store", root, "--report", sample / "report.json", "--case-id",
               "AGAIN-1").code == 0
    conn = sqlite3.connect(root / "store.sqlite3")
    try:
        old = {bytes(s).hex() for (s,) in conn.execute("SELECT sha256 FROM blobs")}
    finally:
        conn.close()
    new = {s for _, s in _rows(root)}
    assert len(old) == 9 and new and not (old & new)
    shown = cli("show", "--json", "--store", root, "AGAIN-1").json
    assert isinstance(shown, dict)
    report = shown["files"]["inputs/report.json"]["sha256"]
    assert report in old  # the same report bytes: found in the old table, not stored again
    assert cli("cat", "--store", root, "AGAIN-1", "inputs/report.json").out == \
        (sample / "report.json").read_text()
    assert cli("verify", "--store", root).code == 0


def test_only_a_store_with_old_blobs_searches_their_table(tmp_path: Path, cli: Cli,
                                                           sample: Path) -> None:
    """The version-2 ``blobs`` table is searched for duplicates only where it holds rows (a
    migrated store, above); nothing of version 3 adds to it, so a new store skips it. The
    skip is seen in the SQL the writer runs, and the migrated store's still searches."""
    fresh = _store(tmp_path / "fresh")
    old = tmp_path / "v1"
    _v1_store(old)
    assert cli("intake", "--store", old, "--report", sample / "report.json", "--case-id",
               "AGAIN-2").code == 0
    migrated = _store(old)
    try:
        for store, searched in ((fresh, False), (migrated, True)):
            statements: list[str] = []
            store.writer.set_trace_callback(statements.append)
            _publish(store, "TRACED-1", [b"traced once", b"traced twice"])
            store.writer.set_trace_callback(None)
            assert any("INTO blob_rows" in s for s in statements)  # the trace saw the write
            assert any(" FROM blobs " in s for s in statements) is searched
            _publish(store, "TRACED-2", [b"traced once"])  # a duplicate adds no row
        assert len(_rows(tmp_path / "fresh")) == 2
    finally:
        fresh.close()
        migrated.close()


def test_a_new_store_has_small_pages_and_an_old_one_keeps_its_own(tmp_path: Path,
                                                                   cli: Cli) -> None:
    """The page size is chosen when a store is made (16 KiB, see PAGE_SIZE); a store made
    with 32 KiB pages (the version-1 fixture) is written, read and verified with them."""
    from engine._store._sqlite_open import PAGE_SIZE

    def page_size(root: Path) -> int:
        conn = sqlite3.connect(root / "store.sqlite3")
        try:
            return int(conn.execute("PRAGMA page_size").fetchone()[0])
        finally:
            conn.close()

    store = _store(tmp_path / "new")
    _publish(store, "PAGES-1", PAYLOADS)
    store.close()
    assert page_size(tmp_path / "new") == PAGE_SIZE == 16384
    old = tmp_path / "old"
    _v1_store(old)
    assert page_size(old) == 32768
    store = _store(old)
    _publish(store, "PAGES-2", LATER)
    store.close()
    assert page_size(old) == 32768
    _all_readable(old, LATER)
    assert cli("verify", "--store", old).code == 0


def _remap(root: Path, key: str, to_id: int) -> None:
    conn = sqlite3.connect(root / INDEX_NAME)
    conn.execute("UPDATE keys SET id=? WHERE sha256=?", (to_id, bytes.fromhex(key)))
    conn.commit()
    conn.close()


def test_a_wrong_entry_under_a_right_mark_is_read_around_and_repaired(tmp_path: Path,
                                                                     cli: Cli) -> None:
    """The mark covers every row, but one entry names the wrong row: the blob is still
    served (found where it really is), and the next write sees the entry disagree with
    its row, indexes everything again and stores nothing twice."""
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    keys = _keys(root)
    a, b = sha256_hex(PAYLOADS[0]), sha256_hex(PAYLOADS[1])
    _remap(root, a, keys[b])
    _all_readable(root, PAYLOADS)
    assert cli("verify", "--store", root).code == 0
    store = _store(root)
    _publish(store, "A-2", PAYLOADS)
    store.close()
    assert len(_rows(root)) == 5
    assert _keys(root) == {s: i for i, s in _rows(root)}


def test_an_index_of_another_history_is_rebuilt(tmp_path: Path, cli: Cli) -> None:
    """store.sqlite3 restored from a backup and written again, then the index restored
    from a copy taken on the abandoned branch: same ids, other blobs under them."""
    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    main_copy = {n: (root / n).read_bytes() for n in ("store.sqlite3",)}
    assert not (root / "store.sqlite3-wal").exists()
    store = _store(root)
    _publish(store, "A-2", LATER)  # the branch that will be abandoned
    store.close()
    branch_index = (root / INDEX_NAME).read_bytes()
    for name, data in main_copy.items():
        (root / name).write_bytes(data)
    store = _store(root)
    other = [b"other %d" % i for i in range(5)]
    _publish(store, "A-3", other)  # ids 6-10 again, other content
    store.close()
    (root / INDEX_NAME).write_bytes(branch_index)
    _all_readable(root, PAYLOADS + other)
    store = _store(root)
    _publish(store, "A-4", [*other, b"new"])
    store.close()
    assert len(_rows(root)) == 11
    assert _keys(root) == {s: i for i, s in _rows(root)}
    assert cli("verify", "--store", root).code == 0


def test_a_damaged_page_inside_the_index_costs_no_read_and_no_write(tmp_path: Path,
                                                                    cli: Cli) -> None:
    root = tmp_path / "s"
    store = _store(root)
    many = [b"blob %d" % i for i in range(3000)]
    for i in range(0, 3000, 500):
        _publish(store, f"M-{i}", many[i:i + 500])
    store.close()
    index = root / INDEX_NAME
    raw = bytearray(index.read_bytes())
    assert len(raw) > 60 * 1024
    for page in range(20, 60):  # pages of the keys tree, not the header
        raw[page * 1024:(page + 1) * 1024] = os.urandom(1024)
    index.write_bytes(bytes(raw))
    _all_readable(root, many[::97])
    assert cli("verify", "--store", root).code == 0
    store = _store(root)
    _publish(store, "M-again", [*many[:50], b"fresh"])
    store.close()
    assert len(_rows(root)) == 3000 + 1  # only "fresh" is new
    assert _keys(root) == {s: i for i, s in _rows(root)}


def test_the_check_and_rebuild_hold_the_index_lock(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers finding the index missing at once must not both rebuild it."""
    import fcntl

    import engine._store._sqlite_index as ix

    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-0", [b"zero"])
    store.close()
    (root / INDEX_NAME).unlink()
    real, held = ix._build, []

    def build(path: Path, store_id: str) -> None:
        fd = os.open(root / "locks" / ".index", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(True)
        finally:
            os.close(fd)
        real(path, store_id)

    monkeypatch.setattr(ix, "_build", build)
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()
    assert held == [True]


def test_a_lookup_reads_the_index_and_the_rows_in_one_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine._store._sqlite_index as ix

    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    real, seen = ix._find, []

    def spy(conn: sqlite3.Connection, *args: object) -> object:
        seen.append(conn.in_transaction)
        return real(conn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ix, "_find", spy)
    assert store.read_blob(sha256_hex(PAYLOADS[0])) == PAYLOADS[0]
    store.close()
    assert seen and all(seen)


def test_a_frozen_reader_does_not_trust_an_index_with_frames_in_its_wal(
        tmp_path: Path) -> None:
    """A reader that must read immutably (a folder it cannot write) reads the index
    immutably only when its -wal holds nothing: otherwise it looks through the rows."""
    from engine._store._sqlite_index import attach_for_reading

    root = tmp_path / "s"
    store = _store(root)
    _publish(store, "A-1", PAYLOADS)
    store.close()  # the last connection: the index's WAL is checkpointed and removed
    store_id = (root / "store-id").read_text().strip()
    assert not Path(f"{root / INDEX_NAME}-wal").exists()
    conn = sqlite3.connect("file::memory:", uri=True)  # URIs, as the store's readers
    assert attach_for_reading(conn, root, store_id, immutable=True)
    conn.execute("DETACH DATABASE ix")
    Path(f"{root / INDEX_NAME}-wal").write_bytes(b"frames")
    assert not attach_for_reading(conn, root, store_id, immutable=True)
    conn.close()
