"""More classes of hostile use, each of which once ended in lost data with exit 0 or in an
internal error: numbers too large to be numbers, inputs swapped mid-read, blob files that
are not files, damaged bytes served as good, foreign indexes, verify racing writers,
unusable export destinations, non-UTF-8 store paths, exports of large archives, and JSON
output of non-UTF-8 names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import open_store
from engine import (
    Attachment,
    InputRejected,
    IntakeLimits,
    StorageError,
    prepare_intake,
    read_export,
    verify_store,
)
from tests.conftest import PYTHON, Cli, child_env, run_viano, snapshot, unprivileged
from tests.store_helpers import create, open_ro, open_rw, sql

pytestmark = pytest.mark.usefixtures("backend")


def _report(tmp: Path, text: str = '{"title": "t", "body": "b"}') -> Path:
    p = tmp / "report.json"
    p.write_text(text)
    return p


def _big_case(cli: Cli, tmp: Path, store: Path, case_id: str = "BIG-1") -> str:
    """A case with a 400 KB attachment (a blob file); returns that blob's sha256."""
    big = tmp / "big.bin"
    big.write_bytes(os.urandom(400_000))
    r = cli("intake", "--json", "--store", store, "--report", _report(tmp), "--attach", big,
            "--case-id", case_id)
    assert r.code == 0, r.err
    return str(r.json["catalogue"]["sources"][1]["sha256"])  # type: ignore[index]


class TestNumbersTooLarge:
    def test_in_a_report(self, cli: Cli, tmp_path: Path, store_dir: Path) -> None:
        for number in ("1" * 5000, "1e400", "-" + "9" * 50):
            r = cli("intake", "--json", "--store", store_dir, "--report",
                    _report(tmp_path, '{"title": "t", "body": "b", "x": ' + number + "}"))
            assert r.code == 2 and r.json["error"]["reason"] == "invalid_report", r.out  # type: ignore[index]

    def test_in_a_stored_manifest(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """A manifest with a 5000-digit revision written behind the store's back: verify
        reports it, show refuses it; neither is an internal error."""
        assert cli("intake", "--store", store_dir, "--report", sample / "report.json").code == 0
        sql(store_dir, "UPDATE generations SET manifest = CAST(REPLACE(CAST(manifest AS TEXT), "
                       "'\"analysis_revision\":1', '\"analysis_revision\":" + "1" * 5000 +
            "') AS BLOB)")
        r = cli("verify", "--json", "--store", store_dir)
        assert r.code == 1 and r.json["cases_affected"] == ["BUG-20"]  # type: ignore[index]
        r = cli("show", "--json", "--store", store_dir, "BUG-20")
        assert r.json["error"]["reason"] == "store_corrupt"  # type: ignore[index]


class TestInputsSwappedMidRead:
    def test_an_archive_renamed_over_during_its_scan(self, tmp_path: Path, sample: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """Another archive renamed over the attachment while it is scanned: the catalogue
        describes what was scanned, and the publication of anything else is refused."""
        import engine._intake._intake as intake

        diag = tmp_path / "diag.zip"
        shutil.copy(sample / "wowdiag.zip", diag)
        other = tmp_path / "other.zip"
        with zipfile.ZipFile(other, "w") as zf:
            zf.writestr("evil/one.txt", b"not what was catalogued")
        real = intake.scan_open_archive

        def swapping(*a, **kw):  # type: ignore[no-untyped-def]
            found = real(*a, **kw)
            os.replace(other, diag)  # the swap lands after the scan
            return found

        monkeypatch.setattr(intake, "scan_open_archive", swapping)
        plan = prepare_intake(_report(tmp_path), [Attachment("diagnostics", diag)],
                              case_id="SW-1", limits=IntakeLimits())
        members = [s["origin"].get("member") for s in plan.catalogue["sources"][1:]]
        assert "Logs/lua-errors.log" in members  # the scan saw the original

        async def go() -> None:
            async with open_store(tmp_path / "s") as store:
                await store.intake(plan)

        with pytest.raises(InputRejected) as info:
            trio.run(go)
        assert info.value.reason == "input_changed"

    @pytest.mark.parametrize("replacement", ["junk", "truncated", "deleted"])
    def test_an_export_replaced_before_its_commit(self, cli: Cli, sample: Path,
                                                  tmp_path: Path, replacement: str) -> None:
        """An export replaced after validation is input_changed for that import, never an
        internal error, and nothing is written."""
        a = tmp_path / "a"
        _big_case(cli, tmp_path, a)
        exported = tmp_path / "x.zip"
        assert cli("export", "--store", a, "BIG-1", exported).code == 0
        request = read_export(exported, IntakeLimits())
        if replacement == "junk":
            exported.write_bytes(b"\x00" * 1000)
        elif replacement == "truncated":
            exported.write_bytes(exported.read_bytes()[:5000])
        else:
            exported.unlink()

        async def go() -> None:
            async with open_store(tmp_path / "b") as store:
                await store.import_package(request)

        with pytest.raises(InputRejected) as info:
            trio.run(go)
        assert info.value.reason in ("input_changed", "unreadable_input")
        check = open_ro(tmp_path / "b")
        assert check.list_cases() == []
        check.close()


@pytest.mark.sqlite_only  # SQLite's own file, edited behind the store's back
class TestIndexTextThatIsNotUtf8:
    """No writer stores text that is not UTF-8. In the schema it made every command an
    internal_error (sqlite3 could not decode its own error message); in a row it was
    store_unavailable with a hint about permissions and free space."""

    @pytest.mark.parametrize("where", ["schema", "row"])
    def test_every_command_says_store_corrupt(self, cli: Cli, sample: Path, store_dir: Path,
                                              where: str) -> None:
        assert cli("intake", "--store", store_dir, "--report", sample / "report.json").code == 0
        if where == "schema":
            import sqlite3

            conn = sqlite3.connect(store_dir / "store.sqlite3")
            conn.execute("PRAGMA writable_schema=ON")
            conn.execute("UPDATE sqlite_master SET sql = CAST(('CREATE INDEX refs_due ON "
                         "refs (status, due_at) ' || x'cc') AS TEXT) WHERE name = 'refs_due'")
            conn.commit()
            conn.close()
        else:
            sql(store_dir, "UPDATE refs SET reason = CAST(x'cc' AS TEXT)")
        for args in (["verify"], ["status"], ["show", "BUG-20"], ["log", "BUG-20"]):
            r = cli(*args, "--json", "--store", store_dir)
            assert r.code == 1, (args, r.out, r.err)
            error = r.json["error"]  # type: ignore[index]
            assert error["reason"] == "store_corrupt", (args, error)
            assert "disk is not full" not in error["hint"], error


@pytest.mark.sqlite_only  # SQLite's own schema, edited behind the store's back
class TestIndexRowsOfTheWrongType:
    """A flipped bit can change a column's type (text to NULL, an integer or a blob):
    verify compared such an id with text and died with internal_error. It is a
    violation now, named as well as it can be, and the other cases are still checked."""

    @pytest.mark.parametrize(("table", "column"), [("generations", "package_id"),
                                                   ("refs", "package_id"),
                                                   ("refs", "case_id")])
    @pytest.mark.parametrize("value", [None, 7, b"\x00"], ids=["null", "integer", "blob"])
    def test_verify_reports_it(self, cli: Cli, tmp_path: Path, store_dir: Path, table: str,
                               column: str, value: object) -> None:
        import sqlite3

        for case in ("W-1", "W-2"):
            r = cli("intake", "--store", store_dir, "--report", _report(tmp_path),
                    "--case-id", case)
            assert r.code == 0, r.err
        conn = sqlite3.connect(store_dir / "store.sqlite3")
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(replace(sql, 'TEXT NOT NULL', "
                     "'ANY'), 'STRICT', '') WHERE name = ?", (table,))
        conn.commit()
        conn.close()
        sql(store_dir, f"UPDATE {table} SET {column} = ? WHERE rowid = (SELECT MIN(rowid) "
                       f"FROM {table})", value)
        r = cli("verify", "--json", "--store", store_dir)
        assert r.code == 1, (r.out, r.err)
        doc: Any = r.json
        assert doc["violations"], doc
        if (table, column) == ("refs", "package_id"):
            # The damaged ref row, said once by its case: its package's generations were
            # reported again, as a package "with generations but no ref".
            assert [v["case_id"] for v in doc["violations"]] == ["W-1"], doc
            assert "ref row" in str(doc["violations"][0]), doc
        assert "W-2" not in doc["cases_affected"], doc  # the undamaged case checks clean
        assert doc["cases"] >= 1, doc
        r = cli("verify", "--json", "--store", store_dir, "W-2")
        assert r.code == 0, r.out  # a damaged row of another case is not W-2's


@pytest.mark.parametrize("odd", ["folder", "dangling link", "looping link"])
def test_verify_and_gc_agree_on_entries_named_like_blobs_that_are_not_files(
        cli: Cli, tmp_path: Path, store_dir: Path, odd: str) -> None:
    """Viano writes no folder among the blobs: verify counted one as an orphan blob file,
    and gc, after removing the real orphans before it, failed on it with
    store_unavailable "could not lock the store". A link is an orphan entry: gc removes
    the link (never what it names); it failed on a loop the same way, and skipped a
    dangling one that verify counted."""
    import hashlib

    sha = _big_case(cli, tmp_path, store_dir)
    blobs = store_dir / "blobs" / "sha256"
    odd_sha = hashlib.sha256(odd.encode()).hexdigest()
    orphan_sha = hashlib.sha256(b"an orphan").hexdigest()
    entry = blobs / odd_sha[:2] / odd_sha
    entry.parent.mkdir(exist_ok=True)
    if odd == "folder":
        entry.mkdir()
    else:
        entry.symlink_to(tmp_path / "nowhere" if odd == "dangling link" else entry)
    (blobs / orphan_sha[:2]).mkdir(exist_ok=True)
    (blobs / orphan_sha[:2] / orphan_sha).write_bytes(b"an orphan")
    orphans = 1 if odd == "folder" else 2
    r = cli("verify", "--json", "--store", store_dir)
    assert r.code == 0 and r.json["orphan_blob_files"] == orphans, r.out  # type: ignore[index]
    r = cli("gc", "--json", "--min-age", "0", "--store", store_dir)
    assert r.code == 0, r.err
    assert r.json["removed_files"] == orphans, r.json  # type: ignore[index]
    assert entry.is_dir() if odd == "folder" else not entry.is_symlink()
    assert not (blobs / orphan_sha[:2] / orphan_sha).exists()
    assert (blobs / sha[:2] / sha).is_file()
    r = cli("verify", "--json", "--store", store_dir)
    assert r.code == 0 and r.json["orphan_blob_files"] == 0, r.out  # type: ignore[index]


def test_an_orphan_gc_may_not_remove_is_named_as_such(
        cli: Cli, tmp_path: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "could not lock the store" (the lock gc holds meanwhile)."""
    import errno
    import hashlib

    from engine import collect_garbage

    _big_case(cli, tmp_path, store_dir)
    orphan_sha = hashlib.sha256(b"an orphan").hexdigest()
    orphan = store_dir / "blobs" / "sha256" / orphan_sha[:2] / orphan_sha
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"an orphan")

    def refused(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    store = open_rw(store_dir)
    try:
        monkeypatch.setattr(Path, "unlink", refused)
        with pytest.raises(StorageError) as info:
            collect_garbage(store, min_age_s=0)
    finally:
        monkeypatch.undo()
        store.close()
    assert info.value.reason == "store_read_only", info.value.message
    assert f"could not remove the orphan blob file {orphan}" in info.value.message
    assert orphan.exists()


class TestRowValuesOfTheWrongType:
    """A manifest or a blob size that is no longer bytes or a count (NULL, text: a
    changed column, a hand edit) made verify, log and export fail with internal_error
    (``bytes(None)``, ``int(None)``) on both backends. Each is a violation of verify's
    now, and the commands that read it refuse with store_corrupt."""

    @pytest.mark.parametrize("damage", ["manifest", "blob size"])
    def test_verify_names_it_and_the_readers_refuse(
            self, cli: Cli, tmp_path: Path, store_dir: Path, backend: str,
            damage: str) -> None:
        big = tmp_path / "big.log"
        big.write_bytes(b"x" * 200)
        r = cli("intake", "--store", store_dir, "--report", _report(tmp_path), "--case-id",
                "D-1", "--attach", f"diagnostics={big}")
        assert r.code == 0, r.err
        pg = backend == "postgresql"
        if damage == "manifest":
            if pg:
                sql(store_dir, "ALTER TABLE generations ALTER COLUMN manifest DROP NOT NULL")
            sql(store_dir, "UPDATE generations SET manifest = ?", None if pg else "text")
        else:
            if pg:
                sql(store_dir, "ALTER TABLE blobs ALTER COLUMN size DROP NOT NULL")
            sql(store_dir, "UPDATE blobs SET size = ?", None if pg else "twelve")
        r = cli("verify", "--json", "--store", store_dir)
        assert r.code == 1, (r.out, r.err)
        doc: Any = r.json
        assert doc["violations"] and {v["case_id"] for v in doc["violations"]} == {"D-1"}, doc
        r = cli("--json", "log", "D-1", "--store", store_dir)  # it lists what it can read
        assert r.code == 0, r.out
        assert ("damaged" in r.out) == (damage == "manifest"), r.out
        for args in (["export", "D-1", tmp_path / "x.zip"],
                     ["cat", "D-1", "inputs/big.log"] if damage != "manifest" else
                     ["show", "D-1"]):
            r = cli("--json", *args, "--store", store_dir)
            assert r.code != 0, (args, r.out)
            error = r.json["error"]  # type: ignore[index]
            assert error["reason"] == "store_corrupt", (args, error)


class TestBlobFilesThatAreNotFiles:
    @pytest.mark.parametrize("kind", ["directory", "fifo", "symlink loop", "dangling symlink"])
    def test_verify_cat_and_export_refuse(self, cli: Cli, tmp_path: Path, store_dir: Path,
                                          kind: str) -> None:
        sha = _big_case(cli, tmp_path, store_dir)
        path = store_dir / "blobs" / "sha256" / sha[:2] / sha
        path.unlink()
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink loop":
            path.symlink_to(path)
        else:
            path.symlink_to(tmp_path / "nowhere")
        # A FIFO would block a reader forever: run as processes, each bounded.
        r = run_viano("verify", "--json", "--store", store_dir, timeout=60)
        assert r.returncode == 1, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert doc["cases_affected"] == ["BIG-1"], doc
        for args in (["cat", "BIG-1", "inputs/big.bin"],
                     ["export", "BIG-1", str(tmp_path / "out.zip")]):
            r = run_viano(*args, "--json", "--store", store_dir, timeout=60)
            assert r.returncode == 1, (args, r.stdout)
            assert json.loads(r.stdout)["error"]["reason"] in ("store_corrupt",
                                                               "store_unavailable")
        assert not (tmp_path / "out.zip").exists()


class TestDamagedBytesAreNeverServed:
    @pytest.mark.parametrize("where", ["inline row", "blob file"])
    def test_cat_and_export_refuse_damaged_blobs(self, cli: Cli, tmp_path: Path,
                                                 store_dir: Path, where: str) -> None:
        """A blob whose bytes no longer match its name: cat writes none of them and exits
        1 (store_corrupt); export leaves no file; the report input is untouched."""
        sha = _big_case(cli, tmp_path, store_dir)
        if where == "blob file":
            path = store_dir / "blobs" / "sha256" / sha[:2] / sha
            data = bytearray(path.read_bytes())
            data[12345] ^= 1
            path.write_bytes(bytes(data))
            target = "inputs/big.bin"
        else:
            m = json.loads(cli("show", "--json", "--store", store_dir, "BIG-1").out)
            inline = m["files"]["inputs/report.json"]["sha256"]
            sql(store_dir, "UPDATE blobs SET data = CAST('{\"title\": \"x\"}' AS BLOB) "
                           "WHERE sha256 = ?", bytes.fromhex(inline))
            target = "inputs/report.json"
        r = cli("cat", "--store", store_dir, "BIG-1", target)
        assert r.code == 1 and r.out == "", r.out[:80]
        assert "store_corrupt" in r.err
        r = cli("export", "--json", "--store", store_dir, "BIG-1", tmp_path / "o.zip")
        assert r.code == 1 and r.json["error"]["reason"] == "store_corrupt"  # type: ignore[index]
        assert not (tmp_path / "o.zip").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".viano-export")]


@pytest.mark.sqlite_only  # a copied store.sqlite3; PostgreSQL's: test_store_postgres.py
class TestForeignIndexes:
    def test_a_copied_index_or_a_missing_id_is_refused_by_everything(
            self, cli: Cli, tmp_path: Path, sample: Path) -> None:
        a, b = tmp_path / "a", tmp_path / "b"
        assert cli("intake", "--store", a, "--report", sample / "report.json").code == 0
        _big_case(cli, tmp_path, b)
        shutil.copy(a / "store.sqlite3", b / "store.sqlite3")
        for suffix in ("-wal", "-shm"):
            Path(f"{b}/store.sqlite3{suffix}").unlink(missing_ok=True)
        before = snapshot(b)
        for args in (["verify"], ["gc", "--min-age", "0"],
                     ["intake", "--report", sample / "report.json", "--case-id", "N-1"]):
            r = cli(*args, "--json", "--store", b)
            assert r.json["error"]["reason"] == "store_corrupt", (args, r.out)  # type: ignore[index]
        assert snapshot(b) == before
        (b / "store-id").unlink()
        for args in (["verify"], ["gc", "--min-age", "0"],
                     ["intake", "--report", sample / "report.json", "--case-id", "N-1"]):
            r = cli(*args, "--json", "--store", b)
            assert r.json["error"]["reason"] == "store_corrupt", (args, r.out)  # type: ignore[index]
        assert not (b / "store-id").exists()


class TestVerifyRacingWriters:
    def test_verify_sees_one_committed_state(self, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        """A case committed by another writer between verify's reads (here: between listing
        the cases and listing the packages) is not half seen as a package with no ref."""
        root = tmp_path / "s"
        writer = open_rw(root)
        writer.commit_batch([create("A-1")])
        reader = open_ro(root)
        real = reader.generation_counts
        done = threading.Event()

        def racing() -> dict[str, int]:
            if not done.is_set():
                t = threading.Thread(target=lambda: writer.commit_batch([create("B-1")]))
                t.start()
                t.join()
                done.set()
            return real()

        monkeypatch.setattr(reader, "generation_counts", racing)
        report = verify_store(reader)
        assert report.ok, report.violations
        assert report.cases == 1  # B-1 is after verify's snapshot
        assert done.is_set()
        assert verify_store(open_ro(root)).cases == 2
        writer.close()
        reader.close()


class TestExportDestinationsTheSystemRefuses:
    @pytest.mark.parametrize("dest", ["long name", "/proc/x.zip", "/sys/x.zip", "self link"])
    def test_refused_not_crashed(self, cli: Cli, tmp_path: Path, sample: Path,
                                 dest: str) -> None:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        target: Path
        if dest == "long name":
            target = tmp_path / ("x" * 300 + ".zip")
        elif dest == "self link":
            target = tmp_path / "l.zip"
            target.symlink_to(target)
        else:
            target = Path(dest)
        r = cli("export", "--json", "--store", store, "BUG-20", target, "--force")
        assert r.code == 2, r.out
        assert r.json["error"]["reason"].startswith("destination_"), r.json  # type: ignore[index]

    def test_a_name_near_the_limit_still_works(self, cli: Cli, tmp_path: Path,
                                               sample: Path) -> None:
        """The temporary file does not borrow the destination's name, so a 254-byte name
        (the longest ext4 allows with '.zip') exports."""
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        target = tmp_path / ("x" * 250 + ".zip")
        assert cli("export", "--store", store, "BUG-20", target).code == 0
        assert zipfile.is_zipfile(target)

    @pytest.mark.skipif(unprivileged() is None, reason="needs setpriv to drop root's powers")
    def test_a_folder_the_user_cannot_write(self, cli: Cli, tmp_path: Path,
                                            sample: Path) -> None:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            r = run_viano("export", "--json", "--store", store, "BUG-20", locked / "a.zip",
                          prefix=unprivileged())
        finally:
            locked.chmod(0o755)
        assert r.returncode == 2, r.stdout + r.stderr
        assert json.loads(r.stdout)["error"]["reason"] == "destination_invalid"


class TestNonUtf8Paths:
    def test_a_store_path_that_is_not_utf8_works(self, tmp_path: Path, sample: Path) -> None:
        """A store folder whose name is not UTF-8: intake, status and verify work, and the
        JSON documents are valid UTF-8 (the name appears escaped)."""
        store = os.path.join(os.fsencode(tmp_path), b"st\xff")

        def viano(*args: bytes) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run([os.fsencode(PYTHON), b"-c",
                                   b"from viano_main import run; run()", *args,
                                   b"--json", b"--store", store], capture_output=True,
                                  env=child_env(), timeout=120, check=False)

        r = viano(b"intake", b"--report", os.fsencode(sample / "report.json"))
        assert r.returncode == 0, r.stderr
        for args in ([b"status"], [b"verify"]):
            r = viano(*args)
            assert r.returncode == 0, r.stderr
            json.loads(r.stdout.decode("utf-8"))  # strict UTF-8

    def test_an_export_name_that_is_not_utf8_gives_valid_json(self, tmp_path: Path,
                                                              sample: Path) -> None:
        store = tmp_path / "s"
        assert run_viano("intake", "--store", store, "--report",
                         sample / "report.json").returncode == 0
        bad = os.path.join(os.fsencode(tmp_path), b"no\xffdir", b"x.zip")
        r = subprocess.run([os.fsencode(PYTHON), b"-c",
                            b"from viano_main import run; run()", b"export",
                            b"BUG-20", bad, b"--json", b"--store", os.fsencode(store)],
                           capture_output=True, env=child_env(), timeout=120, check=False)
        assert r.returncode == 2
        doc = json.loads(r.stdout.decode("utf-8"))
        assert doc["error"]["reason"] == "destination_invalid"


class TestExportsOfLargeArchives:
    def test_an_archive_over_max_member_bytes_round_trips(self, cli: Cli,
                                                          tmp_path: Path) -> None:
        """An archive may be up to max_total_bytes at intake (its members each up to
        max_member_bytes), so one blob of an export may be that large too."""
        cfg = tmp_path / "c.toml"
        cfg.write_text("[intake.limits]\nmax_member_bytes = 100000\nmax_total_bytes = 400000\n")
        diag = tmp_path / "diag.zip"
        with zipfile.ZipFile(diag, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr("a.bin", os.urandom(90_000))
            zf.writestr("b.bin", os.urandom(90_000))
        a, b = tmp_path / "a", tmp_path / "b"
        assert cli("intake", "--config", cfg, "--store", a, "--report", _report(tmp_path),
                   "--attach", f"diagnostics={diag}", "--case-id", "L-1").code == 0
        assert cli("export", "--config", cfg, "--store", a, "L-1", tmp_path / "l.zip").code == 0
        r = cli("import", "--config", cfg, "--store", b, tmp_path / "l.zip")
        assert r.code == 0, r.err
        assert cli("verify", "--store", b).code == 0


class TestGcArguments:
    @pytest.mark.parametrize("value", ["nan", "-5", "inf", "soon"])
    def test_min_age_must_be_a_duration(self, cli: Cli, store_dir: Path, value: str) -> None:
        r = cli("gc", "--json", "--store", store_dir, "--min-age", value)
        assert r.code == 2 and r.json["error"]["reason"] == "usage_error"  # type: ignore[index]


def test_storage_errors_are_viano_errors() -> None:
    """(A guard for the classes above: every refusal they expect is in the tree.)"""
    assert issubclass(StorageError, Exception)


class TestClosingUnderUse:
    def test_close_waits_for_operations_in_progress_and_refuses_new_ones(
            self, tmp_path: Path) -> None:
        """Closing a store while another thread is inside a read waits for the read to
        end (closing a connection under a running statement crashed the interpreter: a
        host whose serve loop outlived its engine), and any use afterwards is
        store_unavailable, not a crash."""
        import threading

        from engine import StorageError

        store = open_rw(tmp_path / "s")
        inside, release, closed = threading.Event(), threading.Event(), threading.Event()

        def reader() -> None:
            with store.read_transaction():
                store.list_cases()
                inside.set()
                release.wait(10)
                store.list_cases()  # still usable: close is waiting for us

        def closer() -> None:
            store.close()
            closed.set()

        t1 = threading.Thread(target=reader)
        t1.start()
        assert inside.wait(10)
        t2 = threading.Thread(target=closer)
        t2.start()
        assert not closed.wait(0.2)  # blocked on the read in progress
        release.set()
        t1.join(10)
        assert closed.wait(10)
        t2.join(10)
        with pytest.raises(StorageError) as err:
            store.list_cases()
        assert err.value.reason == "store_unavailable"


@pytest.mark.sqlite_only
class TestAFifoWhereTheStoreKeepsAFile:
    """The store's own small files are read as the user's are: a FIFO put in the place of
    one is refused (or, in blobs/tmp, left alone), never opened to wait for a writer that
    will not come. Each command runs as a real process, bounded by a timeout."""

    @pytest.mark.parametrize("where", ["store-id", "blobs/tmp/leftover"])
    @pytest.mark.parametrize("command", [["verify"], ["gc", "--min-age", "0"], ["status"],
                                         ["reopen", "BUG-20", "--reason", "x"]])
    def test_no_command_waits_on_it(self, cli: Cli, sample: Path, tmp_path: Path,
                                    where: str, command: list[str]) -> None:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        place = store / where
        place.parent.mkdir(parents=True, exist_ok=True)
        place.unlink(missing_ok=True)
        os.mkfifo(place)
        r = run_viano(*command, "--json", "--store", store, timeout=60)
        assert "internal_error" not in r.stdout + r.stderr, r.stderr
        if where == "store-id" and command[0] in ("verify", "gc", "reopen"):
            assert r.returncode == 1, r.stderr  # store_corrupt, or verify's violation
            assert "store_corrupt" in r.stdout + r.stderr or "store-id" in r.stdout, r.stdout
        elif where != "store-id":
            assert r.returncode == 0, r.stderr
        assert place.exists()  # left as it was: not Viano's to remove


@pytest.mark.sqlite_only
@pytest.mark.parametrize("what", ["export --force", "--log-json"])
def test_nothing_is_written_into_another_store(cli: Cli, sample: Path, tmp_path: Path,
                                               what: str) -> None:
    """A destination inside any Viano store folder, not only the one the command reads, is
    destination_in_store: --force must not replace another store's database."""
    one, other = tmp_path / "one", tmp_path / "other"
    for store in (one, other):
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
    before = snapshot(other)
    for target in (other / "store.sqlite3", other / "blobs" / "x.zip", other / "new.zip"):
        if what == "export --force":
            r = cli("export", "--json", "--force", "--store", one, "BUG-20", target)
        else:
            r = cli("status", "--json", "--store", one, "--log-json", target)
        assert r.code == 2, r.err
        assert r.json["error"]["reason"] == "destination_in_store", r.out  # type: ignore[index]
    assert snapshot(other) == before
    assert cli("verify", "--store", other).code == 0


def test_a_closed_store_opens_no_connection_again(tmp_path: Path) -> None:
    """After ``close``, asking for the writer (either backend) or a reader (SQLite) is a
    clear ``store_unavailable``, and no connection is opened: one made then was never
    closed (a leak, and a handle that went on working after its end), from any path that
    reached a connection without passing the gate."""
    store = open_rw(tmp_path / "s")
    store.commit_batch([create("CL-1")])
    store.list_cases()  # this thread has a reader
    store.close()
    sqlite = hasattr(store, "_readers")
    opens: list[Any] = [(lambda: store.reader), (lambda: store.writer)] if sqlite else \
        [store._writer_conn]
    for open_one in opens:
        with pytest.raises(StorageError) as caught:
            open_one()
        assert caught.value.reason == "store_unavailable"
    if sqlite:
        assert store._readers == [] and store._writer is None
    else:
        assert store._writer is None


def test_the_sqlite_writer_is_made_only_under_the_commit_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first commit read ``writer`` before taking the commit lock, so a first commit
    racing a first ``exclusive()`` (or another commit) on another thread could make two
    writers, the overwritten one left open after ``close``. Every path that makes it
    (commit, exclusive, the index rebuild) now holds the lock while it does, and one
    writer serves them all."""
    from engine._store._sqlite import SqliteStore

    made: list[bool] = []
    real = SqliteStore._connect_writer

    def connect(self: SqliteStore) -> Any:
        made.append(self._commit_lock.locked())
        return real(self)

    monkeypatch.setattr(SqliteStore, "_connect_writer", connect)
    for first in ("commit", "exclusive"):
        store = open_rw(tmp_path / first)
        if not isinstance(store, SqliteStore):
            store.close()
            pytest.skip("PostgreSQL's writer is made under its commit lock already")
        try:
            made.clear()
            if first == "commit":
                store.commit_batch([create("W-1")])
            with store.exclusive():
                pass
            store.commit_batch([create("W-2")])
            assert made == [True], first
        finally:
            store.close()
