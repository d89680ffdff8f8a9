"""`viano verify` finds every kind of damage, names the cases it affects and never dies of
what it exists to find; `viano gc` removes only unreferenced blobs and abandoned
temporaries."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine import BytesSource
from tests.conftest import Cli
from tests.store_helpers import open_ro, open_rw, query, sql

pytestmark = pytest.mark.usefixtures("backend")


def _intake(cli: Cli, sample: Path, store: Path, case_id: str = "BUG-20") -> None:
    r = cli("intake", "--store", store, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}", "--case-id", case_id)
    assert r.code == 0, r.err


def _intake_large_blob(cli: Cli, tmp: Path, store: Path, case_id: str,
                       data: bytes | None = None) -> None:
    """A case whose attachment is over the inline threshold, so it is a blob file."""
    report = tmp / "r.txt"
    report.write_text("t\n")
    big = tmp / "big.bin"
    big.write_bytes(data if data is not None else os.urandom(300_000))
    r = cli("intake", "--store", store, "--report", report, "--case-id", case_id,
            "--attach", big)
    assert r.code == 0, r.err


def _verify(cli: Cli, store: Path) -> dict:  # type: ignore[type-arg]
    r = cli("verify", "--json", "--store", store)
    doc = r.json
    assert isinstance(doc, dict), r.out + r.err
    assert r.code == (0 if doc["ok"] else 1)
    return doc


def _violations(cli: Cli, store: Path) -> list[str]:
    return [v["violation"] for v in _verify(cli, store)["violations"]]


class TestVerify:
    def test_clean_store_passes(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """A fresh store verifies with no violations and rehashes every blob."""
        _intake(cli, sample, store_dir)
        assert _verify(cli, store_dir) == {
            "ok": True, "cases": 1, "generations": 1, "blobs_checked": 4,
            "orphan_blob_files": 0, "temporary_files": 0, "cases_affected": [],
            "violations": []}

    def test_corrupt_inline_blob_names_every_case_using_it(self, cli: Cli, sample: Path,
                                                           store_dir: Path) -> None:
        """A changed byte in a blob two cases share is reported once per case, by name."""
        _intake(cli, sample, store_dir, "BUG-20")
        _intake(cli, sample, store_dir, "BUG-21")
        store = open_ro(store_dir)
        sha = store.manifest(store.case("BUG-20").package_id, 1).files[
            "inputs/wowdiag.zip"].sha256
        store.close()
        sql(store_dir, "UPDATE blobs SET data = CAST('evil' AS BLOB) WHERE sha256 = ?",
            bytes.fromhex(sha))
        doc = _verify(cli, store_dir)
        bad = [v for v in doc["violations"] if sha in v["violation"]]
        assert sorted(v["case_id"] for v in bad) == ["BUG-20", "BUG-21"]
        assert doc["cases_affected"] == ["BUG-20", "BUG-21"]

    def test_corrupt_and_missing_blob_files(self, cli: Cli, tmp_path: Path,
                                            store_dir: Path) -> None:
        """A changed or deleted large blob file is reported against its case."""
        _intake_large_blob(cli, tmp_path, store_dir, "V-1")
        store = open_ro(store_dir)
        files = list(store.blob_files.iter_files())
        store.close()
        assert len(files) == 1
        path = files[0][1]
        data = bytearray(path.read_bytes())
        data[1000] ^= 1
        path.write_bytes(bytes(data))
        doc = _verify(cli, store_dir)
        assert any("corrupt" in v["violation"] and v["case_id"] == "V-1"
                   for v in doc["violations"])
        path.unlink()
        doc = _verify(cli, store_dir)
        assert any("missing" in v["violation"] and v["case_id"] == "V-1"
                   for v in doc["violations"])

    def test_a_blob_file_grown_huge_is_damaged_unread(self, cli: Cli, tmp_path: Path,
                                                      store_dir: Path) -> None:
        """A blob file of another size than the index recorded is store_corrupt for verify,
        cat and export from its size alone (grown to 64 GiB, sparse: hashing it first took
        16 s per 3 GB)."""
        _intake_large_blob(cli, tmp_path, store_dir, "V-1")
        store = open_ro(store_dir)
        ((_sha, path),) = list(store.blob_files.iter_files())
        store.close()
        recorded = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(64 << 30)
        said = f"is {64 << 30} bytes, not the {recorded} it was stored with"
        doc = _verify(cli, store_dir)
        assert any(said in v["violation"] and v["case_id"] == "V-1"
                   for v in doc["violations"]), doc["violations"]
        for args in (["cat", "V-1", "inputs/big.bin"],
                     ["export", "V-1", tmp_path / "out.zip"]):
            r = cli(*args, "--json", "--store", store_dir)
            assert r.code == 1 and said in r.err, (args, r.err)
            assert r.json["error"]["reason"] == "store_corrupt"  # type: ignore[index]
        assert not (tmp_path / "out.zip").exists()

    @pytest.mark.parametrize("offset", [0, 10, 50, 120, -2])
    def test_a_flipped_bit_in_a_manifest(self, cli: Cli, sample: Path, store_dir: Path,
                                         offset: int) -> None:
        """One flipped bit anywhere in a stored manifest: verify lists it against its case
        (exit 1); show and cat refuse with store_corrupt and a hint, never an internal
        error; the other cases still verify."""
        _intake(cli, sample, store_dir, "BUG-20")
        _intake(cli, sample, store_dir, "OK-1")
        pkg = query(store_dir, "SELECT package_id FROM refs WHERE case_id='BUG-20'")[0][0]
        raw = bytearray(query(store_dir, "SELECT manifest FROM generations WHERE "
                                         "package_id=?", pkg)[0][0])
        raw[offset] ^= 0x04
        sql(store_dir, "UPDATE generations SET manifest=? WHERE package_id=?", bytes(raw), pkg)
        doc = _verify(cli, store_dir)
        assert not doc["ok"] and doc["cases_affected"] == ["BUG-20"]
        for args in (["show", "BUG-20"], ["cat", "BUG-20", "inputs/report.json"]):
            r = cli(*args, "--store", store_dir, "--json")
            assert r.code == 1, r.out
            assert r.json["error"]["reason"] == "store_corrupt", r.json  # type: ignore[index]
        assert cli("show", "OK-1", "--store", store_dir, "--json").code == 0
        assert cli("verify", "OK-1", "--store", store_dir).code == 0
        assert "DAMAGED" in cli("log", "BUG-20", "--store", store_dir).out

    def test_chain_damage(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """Broken parents, a ref past the chain and a phase that disagrees are each
        reported."""
        _intake(cli, sample, store_dir)
        sql(store_dir, "UPDATE generations SET parent = 7")
        sql(store_dir, "UPDATE refs SET generation = 2")
        found = _violations(cli, store_dir)
        assert any("parent_generation" in v for v in found)
        assert any("ref points at generation 2" in v for v in found)

    def test_an_unknown_case_is_a_usage_error(self, cli: Cli, sample: Path,
                                              store_dir: Path) -> None:
        """verify CASE for a case that does not exist: exit 2 unknown_case naming it, as
        every other command says (not 1, which means the store has violations)."""
        _intake(cli, sample, store_dir)
        r = cli("verify", "--store", store_dir, "NOPE")
        assert r.code == 2 and "unknown_case" in r.err and "NOPE" in r.err

    def test_leftover_temporary_files_are_counted_and_gc_removes_them(
            self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """A crash mid blob write leaves a temporary file: verify counts it, gc removes it."""
        _intake(cli, sample, store_dir)
        tmp = store_dir / "blobs" / "tmp"
        tmp.mkdir(parents=True)
        (tmp / "abc.123.part").write_bytes(b"half a blob")
        assert _verify(cli, store_dir)["temporary_files"] == 1
        r = cli("gc", "--json", "--store", store_dir, "--min-age", "0")
        assert r.json["removed_temporary"] == 1  # type: ignore[index]
        assert _verify(cli, store_dir)["temporary_files"] == 0


class TestGc:
    def test_removes_old_orphans_keeps_referenced_and_young(self, cli: Cli, tmp_path: Path,
                                                            store_dir: Path) -> None:
        """gc removes unreferenced blob files older than --min-age, nothing else."""
        _intake_large_blob(cli, tmp_path, store_dir, "G-1")
        store = open_rw(store_dir)
        orphan = BytesSource.of(os.urandom(300_000))
        young = BytesSource.of(os.urandom(300_000))
        store.blob_files.write(orphan)
        store.blob_files.write(young)
        store.close()
        old = time.time() - 3600
        os.utime(store_dir / "blobs" / "sha256" / orphan.sha256[:2] / orphan.sha256, (old, old))
        assert _verify(cli, store_dir)["orphan_blob_files"] == 2
        r = cli("gc", "--json", "--store", store_dir, "--min-age", "600")
        assert r.json == {"removed_files": 1, "removed_bytes": 300_000,  # type: ignore[comparison-overlap]
                          "removed_temporary": 0, "kept_young": 1}
        assert not (store_dir / "blobs" / "sha256" / orphan.sha256[:2] / orphan.sha256).exists()
        assert (store_dir / "blobs" / "sha256" / young.sha256[:2] / young.sha256).exists()
        assert cli("verify", "--store", store_dir).code == 0

    def test_a_damaged_manifest_stops_gc(self, cli: Cli, tmp_path: Path,
                                         store_dir: Path) -> None:
        """gc cannot know what a damaged generation references, so it removes nothing."""
        _intake_large_blob(cli, tmp_path, store_dir, "G-1")
        sql(store_dir, "UPDATE generations SET manifest = CAST('{' AS BLOB)")
        files = sorted(p for p in (store_dir / "blobs").rglob("*") if p.is_file())
        r = cli("gc", "--json", "--store", store_dir, "--min-age", "0")
        assert r.json["error"]["reason"] == "store_corrupt"  # type: ignore[index]
        assert sorted(p for p in (store_dir / "blobs").rglob("*") if p.is_file()) == files

    def test_crash_orphans_in_a_new_store_are_collectable(self, tmp_path: Path,
                                                          cli: Cli) -> None:
        """Blob files left by a crash before a new store's first commit are orphans of
        this store (its store-id matches), not signs of a lost index."""
        store = open_rw(tmp_path / "s")
        store.blob_files.write(BytesSource.of(os.urandom(300_000)))
        store.close()
        r = cli("gc", "--json", "--store", tmp_path / "s", "--min-age", "0")
        assert r.json["removed_files"] == 1, r.out  # type: ignore[index]
