"""Opening a store never guesses: read-only opens create nothing, a damaged or missing index
is refused whatever else is in the folder, a store the user cannot write is readable, and
a new store appears complete or not at all."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import zipfile
from pathlib import Path

import pytest

from engine import NotAStore, NotFound, SqliteStore, StorageError
from engine._store._sqlite_schema import CURRENT_VERSION
from tests.conftest import (
    VIANO,
    Cli,
    child_env,
    make_readonly,
    make_writable,
    run_viano,
    snapshot,
    unprivileged,
)
from tests.store_helpers import open_ro

pytestmark = pytest.mark.usefixtures("backend")

FIXTURE_V1 = Path(__file__).with_name("fixtures") / "store-v1.zip"


def _intake(cli: Cli, sample: Path, store: Path) -> None:
    r = cli("intake", "--store", store, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
    assert r.code == 0, r.err


@pytest.mark.sqlite_only  # SQLite's index file; PostgreSQL's: test_store_postgres.py
class TestDamagedIndex:
    """A 0-byte, schema-less or foreign store.sqlite3 is store_corrupt for every command,
    and nothing is written over it; gc deletes nothing."""

    @pytest.mark.parametrize("damage", ["zero bytes", "no schema", "not sqlite",
                                        "meta emptied", "index deleted"])
    def test_every_command_refuses(self, cli: Cli, sample: Path, store_dir: Path,
                                   tmp_path: Path, damage: str) -> None:
        big = tmp_path / "big.log"
        big.write_bytes(os.urandom(300_000))  # so the store holds a blob file
        assert cli("intake", "--store", store_dir, "--report", sample / "report.json",
                   "--attach", f"diagnostics={big}").code == 0
        db = store_dir / "store.sqlite3"
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        if damage == "zero bytes":
            db.write_bytes(b"")
        elif damage == "no schema":
            db.unlink()
            sqlite3.connect(db).close()
        elif damage == "not sqlite":
            db.write_bytes(b"hello, I am not a database" * 100)
        elif damage == "meta emptied":
            conn = sqlite3.connect(db)
            conn.execute("DELETE FROM meta")
            conn.commit()
            conn.close()
        else:
            db.unlink()
        before = snapshot(store_dir)
        for args in (["status"], ["show", "BUG-20"], ["verify"], ["gc", "--min-age", "0"],
                     ["log", "BUG-20"], ["intake", "--report", sample / "report.json",
                                         "--case-id", "NEW-1"]):
            r = cli(*args, "--store", store_dir, "--json")
            assert r.code in (1, 2), (damage, args, r.out)
            assert r.json["error"]["reason"] == "store_corrupt", (damage, args, r.json)  # type: ignore[index]
        assert snapshot(store_dir) == before, damage

    def test_emptied_index_beside_blobs_is_refused_by_verify_and_gc(
            self, cli: Cli, tmp_path: Path, store_dir: Path) -> None:
        """A valid schema with every generation deleted, beside blob rows and files: verify
        and gc refuse (store_corrupt) instead of calling every blob an orphan."""
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(300_000))
        report = tmp_path / "r.txt"
        report.write_text("title\n")
        assert cli("intake", "--store", store_dir, "--report", report, "--attach",
                   big).code == 0
        conn = sqlite3.connect(store_dir / "store.sqlite3")
        conn.execute("DELETE FROM generations")
        conn.execute("DELETE FROM refs")
        conn.commit()
        conn.close()
        files_before = sorted(p.name for p in (store_dir / "blobs").rglob("*") if p.is_file())
        for args in (["verify"], ["gc", "--min-age", "0"]):
            r = cli(*args, "--store", store_dir, "--json")
            assert r.json["error"]["reason"] == "store_corrupt", r.out  # type: ignore[index]
        assert sorted(p.name for p in (store_dir / "blobs").rglob("*")
                      if p.is_file()) == files_before

    def test_a_foreign_index_is_refused(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """Another store's store.sqlite3 copied over this one's: its store-id does not match
        the folder's, so writes are refused."""
        a, b = tmp_path / "a", tmp_path / "b"
        _intake(cli, sample, a)
        _intake(cli, sample, b)
        shutil.copy(a / "store.sqlite3", b / "store.sqlite3")
        r = cli("intake", "--store", b, "--report", sample / "report.json", "--case-id", "X-1",
                "--json")
        assert r.json["error"]["reason"] == "store_corrupt"  # type: ignore[index]


@pytest.mark.sqlite_only  # what a store folder holds; PostgreSQL's: test_store_postgres.py
class TestNotAStore:
    def test_store_naming_a_file(self, cli: Cli, tmp_path: Path, sample: Path) -> None:
        """--store naming a regular file is a refusal (exit 2) for reads and writes alike;
        the file is untouched."""
        f = tmp_path / "notes.txt"
        f.write_bytes(b"my notes")
        for args in (["status"], ["verify"], ["intake", "--report", sample / "report.json"]):
            r = cli(*args, "--store", f, "--json")
            assert r.code == 2 and r.json["error"]["reason"] == "not_a_store", (args, r.out)  # type: ignore[index]
        assert f.read_bytes() == b"my notes"

    def test_a_folder_of_other_things(self, cli: Cli, tmp_path: Path, sample: Path) -> None:
        """A non-empty folder that is not a store is not turned into one."""
        home = tmp_path / "home"
        home.mkdir()
        (home / "thesis.tex").write_text("...")
        r = cli("intake", "--store", home, "--report", sample / "report.json", "--json")
        assert r.code == 2 and r.json["error"]["reason"] == "not_a_store"  # type: ignore[index]
        assert sorted(os.listdir(home)) == ["thesis.tex"]

    def test_read_commands_create_nothing(self, cli: Cli, tmp_path: Path) -> None:
        """status/verify/show on a store that does not exist create no folder and no file."""
        missing = tmp_path / "missing"
        for args in (["status"], ["gc"], ["verify"], ["show", "X"], ["log", "X"],
                     ["cat", "X", "p"]):
            r = cli(*args, "--store", missing, "--json")
            assert r.json["error"]["reason"] == "no_store"  # type: ignore[index]
        assert not missing.exists()

    def test_open_api_refuses_the_same(self, tmp_path: Path) -> None:
        """The backend's own open() gives the same answers as the CLI."""
        with pytest.raises(NotFound):
            SqliteStore.open(tmp_path / "none", write=False)
        (tmp_path / "f").write_text("x")
        with pytest.raises(NotAStore):
            SqliteStore.open(tmp_path / "f", write=True)
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "store.sqlite3").write_bytes(b"")
        with pytest.raises(StorageError) as info:
            SqliteStore.open(tmp_path / "d", write=True)
        assert info.value.reason == "store_corrupt"
        assert (tmp_path / "d" / "store.sqlite3").read_bytes() == b""


class TestCreation:
    def test_two_processes_creating_one_store_share_it(self, tmp_path: Path,
                                                       sample: Path) -> None:
        """Concurrent first intakes into a new store: both land in the same index (neither
        replaces the other's new store)."""
        store = tmp_path / "new"
        procs = [subprocess.Popen([*VIANO,
                                   "intake", "--store", str(store), "--report",
                                   str(sample / "report.json"), "--case-id", f"C-{i}"],
                                  env=child_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE) for i in range(4)]
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
            if p.stderr:
                p.stderr.close()
        check = open_ro(store)
        assert sorted(r.case_id for r in check.list_cases()) == ["C-0", "C-1", "C-2", "C-3"]
        check.close()
        assert not list(store.glob("store.sqlite3.creating*"))


@pytest.mark.skipif(unprivileged() is None, reason="needs setpriv to drop root's powers")
@pytest.mark.sqlite_only  # file permissions on SQLite's files; PostgreSQL's: test_store_postgres.py
class TestReadOnlyStore:
    def test_read_commands_work_on_a_store_the_user_cannot_write(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """status, show, cat, log, verify and export run as a user who can read the store
        but not write it; the store is unchanged."""
        store = tmp_path / "ro"
        _intake(cli, sample, store)
        for suffix in ("-wal", "-shm"):  # as a cleanly closed store leaves it
            Path(f"{store}/store.sqlite3{suffix}").unlink(missing_ok=True)
        out = tmp_path / "out"
        out.mkdir()
        make_readonly(store)
        before = snapshot(store)
        prefix = unprivileged()
        try:
            for args in (["status"], ["show", "BUG-20"], ["cat", "BUG-20",
                                                          "inputs/report.json"],
                         ["log", "BUG-20"], ["verify"],
                         ["export", "BUG-20", str(out / "bug.zip")]):
                r = run_viano(*args, "--store", store, "--json", prefix=prefix)
                assert r.returncode == 0, (args, r.stdout, r.stderr)
            # Writing is refused as what it is (store_read_only), not a crash; gc said
            # store_unavailable, whose hint sent the user to verify.
            for args in (["intake", "--report", str(sample / "report.json"), "--case-id",
                          "W-1"], ["gc", "--min-age", "0"], ["import", str(out / "bug.zip")]):
                r = run_viano(*args, "--store", store, "--json", prefix=prefix)
                assert r.returncode == 1, (args, r.stdout)
                assert json.loads(r.stdout)["error"]["reason"] == "store_read_only", r.stdout
        finally:
            make_writable(store)
        assert snapshot(store) == before
        assert zipfile.is_zipfile(out / "bug.zip")


@pytest.mark.sqlite_only  # SQLite's schema versions; PostgreSQL's: test_store_postgres.py
class TestMigration:
    """A store written by the landed version-1 code (tests/fixtures/store-v1.zip) opens."""

    def _unpack(self, tmp_path: Path) -> Path:
        root = tmp_path / "v1"
        with zipfile.ZipFile(FIXTURE_V1) as zf:
            zf.extractall(root)
        return root

    def test_read_only_commands_read_it_as_it_is(self, cli: Cli, tmp_path: Path) -> None:
        """Read commands on a version-1 store work and leave it at version 1."""
        root = self._unpack(tmp_path)
        before = (root / "store.sqlite3").read_bytes()
        status = cli("status", "--store", root, "--json").json
        assert isinstance(status, list)
        assert [(r["case_id"], r["status"]) for r in status] == [("BUG-20", "READY"),
                                                                 ("TXT-1", "READY")]
        assert cli("verify", "--store", root).code == 0
        assert (root / "store.sqlite3").read_bytes() == before

    def test_a_write_migrates_it_and_keeps_everything(self, cli: Cli, tmp_path: Path,
                                                      sample: Path) -> None:
        """The first write migrates to the current format in one transaction: every
        generation, blob and hash is kept, cases get a durable status, and the store goes on
        working."""
        root = self._unpack(tmp_path)
        old = SqliteStore.open(root, write=False)
        assert old.version == 1
        history = {r.case_id: [(g.generation, g.manifest_sha256, g.manifest)
                               for g in old.generations(r.package_id)]
                   for r in old.list_cases()}
        old.close()
        r = cli("intake", "--store", root, "--report", sample / "report.json", "--case-id",
                "NEW-1")
        assert r.code == 0, r.err
        new = SqliteStore.open(root, write=False)
        assert new.version == CURRENT_VERSION == 4
        for ref in new.list_cases():
            if ref.case_id in history:
                assert [(g.generation, g.manifest_sha256, g.manifest)
                        for g in new.generations(ref.package_id)] == history[ref.case_id]
            assert ref.status is not None and ref.status.status == "READY"
        assert [c.case_id for c in new.due_cases(now=0.0, limit=10)] == ["BUG-20", "NEW-1",
                                                                          "TXT-1"]
        new.close()
        assert (root / "store-id").is_file()
        assert cli("verify", "--store", root).code == 0
        big = cli("cat", "--store", root, "--json", "TXT-1", "inputs/big.log").json
        assert isinstance(big, dict) and big["size"] == 315000

    def test_the_migrated_schema_is_the_new_schema(self, tmp_path: Path, cli: Cli,
                                                   sample: Path) -> None:
        """A migrated store and a new store have the same tables, columns and indexes."""
        root = self._unpack(tmp_path)
        cli("intake", "--store", root, "--report", sample / "report.json", "--case-id", "N-1")
        _intake(cli, sample, tmp_path / "fresh")

        def schema(db: Path) -> list[tuple[str, str]]:
            conn = sqlite3.connect(db)
            rows = conn.execute("SELECT type, name FROM sqlite_master ORDER BY name").fetchall()
            cols = [("col", f"{t}.{c[1]}:{c[2]}") for t in ("refs", "blobs", "generations",
                                                             "meta")
                    for c in conn.execute(f"PRAGMA table_info({t})")]
            conn.close()
            return rows + cols

        assert schema(root / "store.sqlite3") == schema(tmp_path / "fresh" / "store.sqlite3")

    def test_a_newer_format_is_refused(self, cli: Cli, tmp_path: Path, sample: Path) -> None:
        """A store from a newer Viano is refused with store_format, unchanged."""
        _intake(cli, sample, tmp_path / "s")
        conn = sqlite3.connect(tmp_path / "s" / "store.sqlite3")
        conn.execute("UPDATE meta SET value='viano-store/99' WHERE key='format'")
        conn.commit()
        conn.close()
        before = snapshot(tmp_path / "s")
        for args in (["status"], ["intake", "--report", sample / "report.json", "--case-id",
                                  "Z-1"]):
            r = cli(*args, "--store", tmp_path / "s", "--json")
            assert r.json["error"]["reason"] == "store_format"  # type: ignore[index]
        assert snapshot(tmp_path / "s") == before
