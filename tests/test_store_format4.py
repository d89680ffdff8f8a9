"""Store format 4: generations found by their chain, with no index to update.

The (package_id, generation) index dirtied a 16 KiB page per publication once it outgrew a
group commit (bench/store_sustained.py); format 4 drops it. These tests hold what that
must not cost: a version-3 store migrates with every generation, status and hash kept; a
chain tampered with behind the store's back is reported by ``verify`` (never followed into
a loop, never read as someone else's generation); and a write on a damaged chain is
refused as ``store_corrupt``, not written.
"""

from __future__ import annotations

import os
import sqlite3
import zipfile
from pathlib import Path

import pytest

from engine import (
    BytesSource,
    CaseStatus,
    Change,
    ImportRequest,
    PublishRequest,
    SqliteStore,
    StatusRequest,
    StorageError,
    verify_store,
)
from engine._store._sqlite_schema import CURRENT_VERSION
from tests.conftest import Cli, child_env, run_viano
from tests.store_helpers import create, open_ro, open_rw

pytestmark = pytest.mark.sqlite_only  # SQLite's format; PostgreSQL keeps its own index

FIXTURE_V3 = Path(__file__).with_name("fixtures") / "store-v3.zip"


def _unpack(tmp_path: Path) -> Path:
    root = tmp_path / "v3"
    with zipfile.ZipFile(FIXTURE_V3) as zf:
        zf.extractall(root)
    return root


def _gens(log: object) -> list[int]:
    assert isinstance(log, dict), log
    return [g["package_generation"] for g in log["generations"]]


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "store.sqlite3", isolation_level=None)


def _forge(root: Path, pkg: str, like: int, **values: object) -> None:
    """Insert a generation row behind the store's back: a copy of the package's generation
    ``like`` with ``values`` (column: SQL expression or value) put in its place."""
    columns = ["package_id", "generation", "parent", "manifest_sha256", "manifest",
               "phase", "created_at", "parent_row", *(["id"] if "id" in values else [])]
    if values.get("parent_row") is ...:  # a format-3 writer: it knows no parent_row
        columns.remove("parent_row")
        del values["parent_row"]
    select = [repr(values[c]) if c in values and not isinstance(values[c], str)
              else (f"'{values[c]}'" if c in values else c) for c in columns]
    conn = _db(root)
    try:
        conn.execute(f"INSERT INTO generations ({', '.join(columns)}) SELECT "
                     f"{', '.join(select)} FROM generations WHERE package_id=? AND "
                     "generation=?", (pkg, like))
    finally:
        conn.close()


def _history(store: SqliteStore) -> dict[str, list[tuple[int, int | None, str, bytes]]]:
    return {r.case_id: [(g.generation, g.parent, g.manifest_sha256, g.manifest)
                        for g in store.generations(r.package_id)]
            for r in store.list_cases()}


def _publish(store: SqliteStore, case_id: str, name: str) -> object:
    ref = store.case(case_id)
    return store.commit_batch([PublishRequest(ref.package_id, case_id, ref.generation, Change(
        files={f"work/{name}": BytesSource.of(name.encode())}))])[0]


def _stack(store: Path, case: str, n: int) -> str:
    """A case with ``n`` generations; its package id."""
    s = open_rw(store)
    try:
        s.commit_batch([create(case)])
        for i in range(n - 1):
            _publish(s, case, f"g{i}.txt")
        return str(s.case(case).package_id)
    finally:
        s.close()


class TestMigrationFromVersion3:
    def test_read_only_commands_read_it_as_it_is(self, cli: Cli, tmp_path: Path) -> None:
        """A version-3 store read without a write stays at version 3, byte for byte, and
        every generation reads through its old index."""
        root = _unpack(tmp_path)
        before = (root / "store.sqlite3").read_bytes()
        assert cli("verify", "--store", root).code == 0
        log = cli("log", "--store", root, "--json", "BUG-20").json
        assert _gens(log) == [1, 2, 3, 4]
        shown = cli("show", "--store", root, "--json", "BUG-20", "--generation", "2").json
        assert isinstance(shown, dict) and shown["package_generation"] == 2
        old = SqliteStore.open(root, write=False)
        assert old.version == 3
        old.close()
        assert (root / "store.sqlite3").read_bytes() == before

    def test_a_write_migrates_every_generation_and_status(self, cli: Cli, tmp_path: Path,
                                                          sample: Path) -> None:
        root = _unpack(tmp_path)
        old = SqliteStore.open(root, write=False)
        history = _history(old)
        statuses = {r.case_id: (r.generation, r.status) for r in old.list_cases()}
        old.close()
        assert history["BUG-20"][-1][0] == 4 and history["TXT-2"][-1][0] == 2
        r = cli("intake", "--store", root, "--report", sample / "report.json", "--case-id",
                "NEW-1")
        assert r.code == 0, r.err
        new = SqliteStore.open(root, write=True)
        assert new.version == CURRENT_VERSION == 4
        after = _history(new)
        assert {c: after[c] for c in history} == history
        assert {r.case_id: (r.generation, r.status) for r in new.list_cases()
                if r.case_id in statuses} == statuses
        # The chain goes on from a migrated head, and reads back through it.
        assert _publish(new, "BUG-20", "after.txt").generation == 5  # type: ignore[attr-defined]
        assert [g.generation for g in new.generations(new.case("BUG-20").package_id)] == \
            [1, 2, 3, 4, 5]
        assert new.manifest(new.case("BUG-20").package_id, 2).package_generation == 2
        new.close()
        assert cli("verify", "--store", root).code == 0
        conn = _db(root)
        assert conn.execute("SELECT COUNT(*) FROM refs WHERE head_row IS NULL").fetchone() == (0,)
        conn.close()

    def test_a_migration_killed_before_its_commit_leaves_format_3(self, tmp_path: Path,
                                                                  sample: Path) -> None:
        """The rebuild is one transaction: a process that dies just before COMMIT (os._exit
        at the named crash point, what SIGKILL leaves) leaves the store at format 3 with
        every generation; the next write migrates it."""
        root = _unpack(tmp_path)
        old = SqliteStore.open(root, write=False)
        history = _history(old)
        old.close()
        intake = ("intake", "--store", root, "--report", sample / "report.json",
                  "--case-id", "K-1")
        r = run_viano(*intake, env=child_env(VIANO_CRASH_AT="migrate.before_commit"))
        assert r.returncode == 137, (r.stdout, r.stderr)
        after = SqliteStore.open(root, write=False)
        assert after.version == 3 and _history(after) == history
        after.close()
        assert verify_store(open_ro(root)).ok
        r = run_viano(*intake)
        assert r.returncode == 0, r.stderr
        new = SqliteStore.open(root, write=False)
        assert new.version == 4
        assert {c: h for c, h in _history(new).items() if c in history} == history
        new.close()

    def test_the_migrated_schema_is_the_new_schema(self, cli: Cli, tmp_path: Path,
                                                   sample: Path) -> None:
        root = _unpack(tmp_path)
        assert cli("intake", "--store", root, "--report", sample / "report.json",
                   "--case-id", "N-1").code == 0
        fresh = tmp_path / "fresh"
        assert cli("intake", "--store", fresh, "--report", sample / "report.json").code == 0

        def schema(db: Path) -> list[tuple[object, ...]]:
            conn = sqlite3.connect(db)
            rows = conn.execute("SELECT type, name, tbl_name FROM sqlite_master "
                                "ORDER BY name").fetchall()
            cols = [("col", t, c[1], c[2], c[5]) for t in ("refs", "generations")
                    for c in conn.execute(f"PRAGMA table_info({t})")]
            conn.close()
            return rows + cols

        assert schema(root / "store.sqlite3") == schema(fresh / "store.sqlite3")


class TestNothingToUpdateButTheEnd:
    def test_generations_have_no_index_but_their_id(self, tmp_path: Path) -> None:
        """What the format is for: a publication appends its row and touches no index of
        the generations table (the old primary-key index was half a batch's WAL). The one
        index left is partial: an entry per package, for its generation 1."""
        _stack(tmp_path / "s", "A-1", 3)
        conn = _db(tmp_path / "s")
        assert [r[1] for r in conn.execute("PRAGMA index_list(generations)")] == [
            "generations_first"]
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='generations_first'"
                           ).fetchone()[0]
        assert sql.endswith("WHERE generation = 1"), sql
        ids = [r[0] for r in conn.execute("SELECT id FROM generations ORDER BY rowid")]
        assert ids == sorted(ids) and len(ids) == 3
        conn.close()

    def test_old_generations_read_back_through_the_chain(self, tmp_path: Path) -> None:
        pkg = _stack(tmp_path / "s", "A-1", 6)
        _stack(tmp_path / "s", "B-1", 4)  # interleaved rows of another package
        s = open_ro(tmp_path / "s")
        assert [g.generation for g in s.generations(pkg)] == [1, 2, 3, 4, 5, 6]
        for gen in range(1, 7):
            assert s.manifest(pkg, gen).package_generation == gen
        with pytest.raises(Exception) as info:
            s.manifest(pkg, 7)
        assert getattr(info.value, "reason", None) in ("unknown_generation",
                                                       "unknown_case", "not_found")
        s.close()

    def test_two_generations_of_one_package_in_one_batch(self, tmp_path: Path) -> None:
        """An import appends several generations in one request; each links to the one
        before it in the same transaction."""
        src = tmp_path / "src"
        pkg = _stack(src, "A-1", 4)
        s = open_ro(src)
        manifests = [s.manifest(pkg, g) for g in range(1, 5)]
        blobs = {e.sha256: s.read_blob(e.sha256) for m in manifests for e in m.files.values()}
        s.close()

        dst = open_rw(tmp_path / "dst")
        out = dst.commit_batch([ImportRequest(
            pkg, "A-1", tuple(manifests),
            {sha: BytesSource.of(data) for sha, data in blobs.items()})])[0]
        assert not isinstance(out, Exception), out
        assert [g.generation for g in dst.generations(pkg)] == [1, 2, 3, 4]
        dst.close()
        assert verify_store(open_ro(tmp_path / "dst")).ok


class TestTamperedChains:
    """Each edit is made behind the store's back; verify names the case (exit 1), log and
    show end, and nothing reads another package's generation as this one's."""

    def _whole_history_refused(self, cli: Cli, root: Path, tmp_path: Path) -> None:
        """log and export need the whole history: a chain that does not reach generation
        1 is store_corrupt (exit 1), and no archive is written."""
        for args in (["log", "A-1"], ["export", "A-1", str(tmp_path / "a.zip")]):
            r = cli(*args, "--store", root, "--json")
            assert r.code == 1, (args, r.out)
            assert r.json["error"]["reason"] == "store_corrupt", r.out  # type: ignore[index]
        assert not (tmp_path / "a.zip").exists()

    def _verify(self, cli: Cli, root: Path) -> str:
        r = cli("verify", "--store", root)
        assert r.code == 1, r.out
        assert "A-1" in r.out, r.out
        return r.out

    def test_a_parent_link_to_itself_or_another_package(self, cli: Cli, tmp_path: Path
                                                        ) -> None:
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 4)
        other = _stack(root, "B-1", 3)
        conn = _db(root)
        g3 = conn.execute("SELECT id FROM generations WHERE package_id=? AND generation=3",
                          (pkg,)).fetchone()[0]
        b2 = conn.execute("SELECT id FROM generations WHERE package_id=? AND generation=2",
                          (other,)).fetchone()[0]
        conn.execute("UPDATE generations SET parent_row=? WHERE id=?", (g3, g3))
        conn.close()
        out = self._verify(cli, root)
        assert "broken below generation 3" in out
        self._whole_history_refused(cli, root, tmp_path)
        conn = _db(root)
        conn.execute("UPDATE generations SET parent_row=? WHERE id=?", (b2, g3))
        conn.close()
        self._verify(cli, root)
        s = open_ro(root)
        with pytest.raises(StorageError):
            s.manifest(pkg, 2)  # B-1's generation 2 is never served as A-1's
        s.close()

    def test_a_row_beside_the_chain(self, cli: Cli, tmp_path: Path) -> None:
        """A generation row inserted for the package but linked from nothing."""
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 2)
        conn = _db(root)
        g2 = conn.execute("SELECT id FROM generations WHERE package_id=? AND generation=2",
                          (pkg,)).fetchone()[0]
        conn.close()
        _forge(root, pkg, 2, generation=3, parent=2, parent_row=g2)
        assert "1 of the package's 3 generation rows are not on its chain" in \
            self._verify(cli, root)

    def test_a_damaged_chains_blob_files_are_not_counted_as_orphans(
            self, cli: Cli, tmp_path: Path) -> None:
        """verify reads a damaged package's every row, on its chain or not, for what they
        reference: its blob files are the case's (gc keeps them), not orphans. Before,
        a broken link or a row beside the chain made verify count them as orphans."""
        root = tmp_path / "s"
        big = os.urandom(300 * 1024)  # above the inline threshold: a blob file
        s = open_rw(root)
        s.commit_batch([create("A-1")])
        ref = s.case("A-1")
        s.commit_batch([PublishRequest(ref.package_id, "A-1", 1, Change(
            files={"work/big.bin": BytesSource.of(big)}))])
        _publish(s, "A-1", "g3.txt")
        pkg = str(ref.package_id)
        s.close()
        clean = cli("verify", "--store", root, "--json")
        assert clean.code == 0 and clean.json["orphan_blob_files"] == 0, clean.out  # type: ignore[index]
        conn = _db(root)
        g3 = conn.execute("SELECT id FROM generations WHERE package_id=? AND generation=3",
                          (pkg,)).fetchone()[0]
        conn.execute("UPDATE generations SET parent_row=? WHERE id=?", (g3, g3))
        conn.close()
        broken = cli("verify", "--store", root, "--json")
        assert broken.code == 1 and "A-1" in broken.out, broken.out
        assert broken.json["orphan_blob_files"] == 0, broken.out  # type: ignore[index]
        conn = _db(root)
        conn.execute("UPDATE generations SET parent_row=? WHERE id=?", (g3 - 1, g3))
        conn.execute("UPDATE refs SET head_row=?, generation=1 WHERE package_id=?",
                     (g3 - 2, pkg))  # generation 1's row: 2 and 3 are beside the chain
        conn.close()
        beside = cli("verify", "--store", root, "--json")
        assert beside.code == 1 and "not on its chain" in beside.out, beside.out
        assert beside.json["orphan_blob_files"] == 0, beside.out  # type: ignore[index]

    def test_a_head_row_that_names_nothing(self, cli: Cli, tmp_path: Path) -> None:
        """A damaged head link: verify reports it, and a write on top of that head is
        refused as store_corrupt with nothing written (another case in the batch
        commits)."""
        root = tmp_path / "s"
        _stack(root, "A-1", 2)
        _stack(root, "B-1", 1)
        conn = _db(root)
        conn.execute("UPDATE refs SET head_row = 999999 WHERE case_id='A-1'")
        conn.close()
        self._verify(cli, root)
        self._whole_history_refused(cli, root, tmp_path)
        s = open_rw(root)
        before = s.generation_counts()
        a, b = s.case("A-1"), s.case("B-1")
        outs = s.commit_batch([
            PublishRequest(a.package_id, "A-1", a.generation,
                           Change(files={"work/x": BytesSource.of(b"x")})),
            PublishRequest(b.package_id, "B-1", b.generation,
                           Change(files={"work/y": BytesSource.of(b"y")}))])
        assert isinstance(outs[0], StorageError) and outs[0].reason == "store_corrupt"
        assert getattr(outs[1], "generation", None) == 2, outs[1]
        after = s.generation_counts()
        assert after[a.package_id] == before[a.package_id]
        assert after[b.package_id] == before[b.package_id] + 1
        s.close()

    @pytest.mark.parametrize("damage", ["NULL", "'text'", "1.5", "another package's row"])
    def test_a_damaged_head_refuses_only_its_own_requests(self, tmp_path: Path,
                                                          damage: str) -> None:
        """In a writer whose manifest cache already holds the head (so the plan never
        reads it), a damaged head link still refuses that case's requests, status changes
        included, and only those: the rest of the group commit is written."""
        root = tmp_path / "s"
        s = open_rw(root)
        s.commit_batch([create("A-1"), create("B-1")])
        _publish(s, "A-1", "warm.txt")
        _publish(s, "B-1", "warm.txt")
        a, b = s.case("A-1"), s.case("B-1")
        conn = _db(root)
        value = "(SELECT head_row FROM refs WHERE case_id='B-1')" \
            if damage == "another package's row" else damage
        conn.execute(f"UPDATE refs SET head_row = {value} WHERE case_id='A-1'")
        conn.close()
        before = s.generation_counts()
        outs = s.commit_batch([
            StatusRequest(a.package_id, "A-1", a.generation, CaseStatus(
                status="RETRY_PENDING", phase="INTAKE", reason="timeout", due_at=1.0)),
            PublishRequest(a.package_id, "A-1", a.generation,
                           Change(files={"work/x": BytesSource.of(b"x")})),
            PublishRequest(b.package_id, "B-1", b.generation,
                           Change(files={"work/y": BytesSource.of(b"y")}))])
        assert [getattr(o, "reason", None) for o in outs[:2]] == ["store_corrupt"] * 2, outs
        assert getattr(outs[2], "generation", None) == 3, outs[2]
        after = s.generation_counts()
        assert after[a.package_id] == before[a.package_id]
        assert after[b.package_id] == before[b.package_id] + 1
        assert s.case("A-1").status == a.status  # the status change was not written
        s.close()

    def test_a_writer_of_format_3_cannot_write_off_the_chain(self, tmp_path: Path) -> None:
        """A process of the previous version that opened the store before it was migrated
        still inserts generation rows the format-3 way: the insert fails (parent_row is
        NOT NULL) and nothing is written, so no chain is broken by an upgrade."""
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 2)
        with pytest.raises(sqlite3.IntegrityError):
            _forge(root, pkg, 2, generation=3, parent=2, parent_row=...)
        assert verify_store(open_ro(root)).ok

    def test_a_history_is_never_written_twice(self, cli: Cli, tmp_path: Path) -> None:
        """With the case index's row lost (deleted behind the store's back), importing
        the package's own export again is refused: its generation 1 is still there, and
        a second copy of the history beside it would be rows no chain reaches."""
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 3)
        assert cli("export", "A-1", str(tmp_path / "a.zip"), "--store", root).code == 0
        conn = _db(root)
        conn.execute("DELETE FROM refs WHERE case_id='A-1'")
        conn.close()
        before = open_ro(root).generation_counts()
        r = cli("import", str(tmp_path / "a.zip"), "--store", root, "--json")
        assert r.code != 0, r.out
        assert "store_corrupt" in r.out, r.out
        assert open_ro(root).generation_counts() == before == {pkg: 3}
        with pytest.raises(sqlite3.IntegrityError):  # and the index says so by itself
            _forge(root, pkg, 1, parent_row=0)

    def test_a_forged_row_with_the_largest_id_does_not_stop_writes(self, tmp_path: Path
                                                                   ) -> None:
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 2)
        _forge(root, pkg, 2, id=2**63 - 1, package_id="forged", parent_row=0)
        s = open_rw(root)
        assert getattr(_publish(s, "A-1", "after.txt"), "generation", None) == 3
        assert getattr(s.commit_batch([create("B-1")])[0], "generation", None) == 1
        assert [g.generation for g in s.generations(pkg)] == [1, 2, 3]
        s.close()

    def test_a_head_row_below_the_ref(self, cli: Cli, tmp_path: Path) -> None:
        """The ref says generation 5 and its head row holds generation 3 (whose chain is
        whole): log and export refuse rather than show 1-3 as the whole history."""
        root = tmp_path / "s"
        pkg = _stack(root, "A-1", 5)
        conn = _db(root)
        conn.execute("UPDATE refs SET head_row = (SELECT id FROM generations WHERE "
                     "package_id=? AND generation=3) WHERE case_id='A-1'", (pkg,))
        conn.close()
        self._verify(cli, root)
        self._whole_history_refused(cli, root, tmp_path)

    def test_gc_refuses_a_manifest_stored_as_text(self, cli: Cli, tmp_path: Path) -> None:
        root = tmp_path / "s"
        _stack(root, "A-1", 2)
        conn = _db(root)
        conn.execute("UPDATE generations SET manifest = CAST(manifest AS TEXT) "
                     "WHERE generation = 2")
        conn.close()
        r = cli("gc", "--store", root, "--min-age", "0", "--json")
        assert r.code == 1, r.out
        assert r.json["error"]["reason"] == "store_corrupt", r.out  # type: ignore[index]


class TestWholeHistoryIsOneState:
    def test_export_does_not_half_see_a_publication(self, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        """A publication committed between export's read of the case and of its
        generations is not seen at all (one read transaction), so the archive holds the
        history as of the first read, whole, instead of a false store_corrupt."""
        import threading

        from engine import export_package

        root = tmp_path / "s"
        _stack(root, "A-1", 3)
        writer = open_rw(root)
        reader = open_ro(root)
        real = reader.case

        def racing(case_id: str) -> object:
            ref = real(case_id)
            t = threading.Thread(target=lambda: _publish(writer, "A-1", "late.txt"))
            t.start()
            t.join()
            return ref

        monkeypatch.setattr(reader, "case", racing)
        summary = export_package(reader, "A-1", tmp_path / "a.zip")
        assert summary.generations == 3, summary
        assert writer.case("A-1").generation == 4  # the publication did commit
        writer.close()
        reader.close()
