"""`viano verify` finds every kind of damage; `viano gc` removes only unreferenced blobs."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from engine import BlobSource, SqliteStore
from engine._store import BlobFiles, BytesSource
from tests.conftest import Cli


def _intake(cli: Cli, sample: Path, store: Path) -> None:
    r = cli("intake", "--store", store, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
    assert r.code == 0, r.err


def _intake_large_blob(cli: Cli, tmp: Path, store: Path, case_id: str) -> None:
    """A case whose attachment is over the inline threshold, so it is a blob file."""
    report = tmp / "r.txt"
    report.write_text("t\n")
    big = tmp / "big.bin"
    big.write_bytes(os.urandom(300_000))
    r = cli("intake", "--store", store, "--report", report, "--case-id", case_id,
            "--attach", big)
    assert r.code == 0, r.err


def _sql(store: Path, stmt: str, *params: object) -> None:
    conn = sqlite3.connect(store / "store.sqlite3")
    conn.execute(stmt, params)
    conn.commit()
    conn.close()


def _violations(cli: Cli, store: Path) -> list[str]:
    r = cli("verify", "--json", "--store", store)
    doc = r.json
    assert isinstance(doc, dict)
    assert r.code == (0 if doc["ok"] else 1)
    return [v["violation"] for v in doc["violations"]]


class TestVerify:
    def test_clean_store_passes(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """A fresh store verifies with no violations and rehashes every blob."""
        _intake(cli, sample, store_dir)
        doc = cli("verify", "--json", "--store", store_dir).json
        assert doc == {"ok": True, "cases": 1, "generations": 1, "blobs_checked": 4,
                       "orphan_blob_files": 0, "violations": []}

    def test_corrupt_inline_blob(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """A changed byte in an inline blob is reported."""
        _intake(cli, sample, store_dir)
        _sql(store_dir, "UPDATE blobs SET data = CAST('evil' AS BLOB) WHERE sha256 = "
                        "(SELECT MIN(sha256) FROM blobs WHERE data IS NOT NULL)")
        assert any("corrupt" in v for v in _violations(cli, store_dir))

    def test_corrupt_and_missing_blob_files(self, cli: Cli, tmp_path: Path,
                                            store_dir: Path) -> None:
        """A changed or deleted large blob file is reported."""
        _intake_large_blob(cli, tmp_path, store_dir, "V-1")
        files = list(BlobFiles(store_dir).iter_files())
        assert len(files) == 1
        path = files[0][1]
        data = bytearray(path.read_bytes())
        data[1000] ^= 1
        path.write_bytes(bytes(data))
        assert any("corrupt" in v for v in _violations(cli, store_dir))
        path.unlink()
        assert any("missing" in v for v in _violations(cli, store_dir))

    def test_manifest_and_chain_damage(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """Edited manifests, broken parents and a ref past the chain are each reported."""
        _intake(cli, sample, store_dir)
        _sql(store_dir, "UPDATE generations SET manifest = "
                        "CAST(REPLACE(CAST(manifest AS TEXT), 'BUG-20', 'BUG-21') AS BLOB)")
        _sql(store_dir, "UPDATE generations SET parent = 7")
        _sql(store_dir, "UPDATE refs SET generation = 2")
        found = _violations(cli, store_dir)
        assert any("do not match their sha256" in v for v in found)
        assert any("has parent 7" in v for v in found)
        assert any("ref points at generation 2" in v for v in found)
        assert any("case_id" in v for v in found)

    def test_unknown_case_is_a_violation(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """verify CASE for a case that does not exist exits 1 naming it."""
        _intake(cli, sample, store_dir)
        r = cli("verify", "--store", store_dir, "NOPE")
        assert r.code == 1 and "NOPE" in r.out


class TestGc:
    def test_removes_old_orphans_keeps_referenced_and_young(self, cli: Cli, tmp_path: Path,
                                                            store_dir: Path) -> None:
        """gc removes unreferenced blob files older than --min-age, nothing else."""
        _intake_large_blob(cli, tmp_path, store_dir, "G-1")
        store = SqliteStore.open(store_dir, create=False)
        orphan: BlobSource = BytesSource.of(os.urandom(300_000))
        young: BlobSource = BytesSource.of(os.urandom(300_000))
        store.blob_files.write(orphan)
        store.blob_files.write(young)
        old = time.time() - 3600
        os.utime(store.blob_files.path_for(orphan.sha256), (old, old))
        before = cli("verify", "--json", "--store", store_dir).json
        assert before["orphan_blob_files"] == 2  # type: ignore[index]
        r = cli("gc", "--json", "--store", store_dir, "--min-age", "600")
        assert r.json == {"removed_files": 1, "removed_bytes": 300_000,  # type: ignore[comparison-overlap]
                          "removed_temporary": 0, "kept_young": 1}
        assert not store.blob_files.path_for(orphan.sha256).exists()
        assert store.blob_files.path_for(young.sha256).exists()
        assert cli("verify", "--store", store_dir).code == 0
        store.close()
