"""Intake of well-formed cases: originals byte for byte, the catalogue in contracted order."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests import archives as A
from tests.conftest import VIANO, Cli, child_env

pytestmark = pytest.mark.usefixtures("backend")


def _catalogue(cli: Cli, store: Path, case: str) -> list[dict[str, Any]]:
    r = cli("cat", "--store", store, case, "case/catalogue.json")
    assert r.code == 0, r.err
    return json.loads(r.out)["sources"]  # type: ignore[no-any-return]


class TestSampleCase:
    def test_catalogue_order_ids_and_kinds(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """Report body, comments, observations, then archive members by bytewise path."""
        r = cli("intake", "--store", store_dir, "--report", sample / "report.json",
                "--attach", f"diagnostics={sample / 'wowdiag.zip'}",
                "--attach", f"source={sample / 'wowsrc.zip'}")
        assert r.code == 0, r.err
        sources = _catalogue(cli, store_dir, "BUG-20")
        assert [s["source_id"] for s in sources] == [f"S{i}" for i in range(1, 14)]
        assert [s["kind"] for s in sources] == (
            ["report", "comment", "comment", "observation", "observation"]
            + ["diagnostics"] * 4 + ["source"] * 4)
        assert [s["human"] for s in sources] == [True] * 5 + [False] * 8
        assert sources[0]["origin"] == {"input": "inputs/report.json", "pointer": "/body"}
        assert sources[4]["origin"]["pointer"] == "/observations/1/body"
        diag = [s["origin"]["member"] for s in sources if s["kind"] == "diagnostics"]
        assert diag == sorted(diag, key=lambda m: m.encode())
        assert diag[1] == "Logs/lua-errors.log"

    def test_hashes_match_the_originals(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """Every catalogue sha256 and size is that of the exact text or member bytes."""
        cli("intake", "--store", store_dir, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
        report = json.loads((sample / "report.json").read_text())
        with zipfile.ZipFile(sample / "wowdiag.zip") as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        for s in _catalogue(cli, store_dir, "BUG-20"):
            origin = s["origin"]
            if "member" in origin:
                data = members[origin["member"]]
            else:
                node: Any = report
                for part in origin["pointer"].strip("/").split("/"):
                    node = node[int(part)] if part.isdigit() else node[part]
                data = node.encode()
            assert s["sha256"] == hashlib.sha256(data).hexdigest()
            assert s["size"] == len(data)

    def test_originals_byte_for_byte(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """`viano cat` (a real process, binary stdout) returns each original exactly."""
        cli("intake", "--store", store_dir, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}",
            "--attach", f"source={sample / 'wowsrc.zip'}")
        for name in ("report.json", "wowdiag.zip", "wowsrc.zip"):
            proc = subprocess.run(
                [*VIANO, "cat",
                 "--store", str(store_dir), "BUG-20", f"inputs/{name}"],
                capture_output=True, env=child_env(), timeout=60, check=False)
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout == (sample / name).read_bytes()


class TestReportsAndAttachments:
    def test_text_report_and_derived_case_id(self, cli: Cli, tmp_path: Path,
                                             store_dir: Path) -> None:
        """A text report's first line is the title; without an id one is derived from its hash."""
        report = tmp_path / "bug.txt"
        report.write_text("\n  Crash on save\nIt crashes.\n", encoding="utf-8")
        r = cli("intake", "--json", "--store", store_dir, "--report", report)
        assert r.code == 0, r.err
        doc: Any = r.json
        digest = hashlib.sha256(report.read_bytes()).hexdigest()
        assert doc["case_id"] == f"case-{digest[:12]}"
        assert doc["title"] == "Crash on save"
        assert doc["catalogue"]["sources"] == [{
            "source_id": "S1", "kind": "report", "human": True,
            "origin": {"input": "inputs/bug.txt"}, "sha256": digest,
            "size": report.stat().st_size, "media_type": "text/plain"}]

    def test_a_line_that_shows_nothing_is_not_the_title(self, cli: Cli, tmp_path: Path,
                                                         store_dir: Path) -> None:
        """A first line of a no-break and a zero-width space was taken as the title."""
        report = tmp_path / "bug.txt"
        report.write_text("\u00a0\u200b\n\u2063\nCrash on save\nIt crashes.\n",
                          encoding="utf-8")
        r = cli("intake", "--json", "--store", store_dir, "--report", report)
        assert r.code == 0, r.err
        assert r.json["title"] == "Crash on save", r.json  # type: ignore[index]
        only = tmp_path / "blank.txt"
        only.write_text("\u00a0\u200b\n\u2063\n", encoding="utf-8")
        r = cli("intake", "--json", "--store", store_dir, "--report", only)
        assert r.code == 2, r.out

    def test_plain_and_tar_attachments(self, cli: Cli, tmp_path: Path, store_dir: Path) -> None:
        """Plain files are one source; tar.gz in a diagnostics role is catalogued by member;
        an archive in the attachment role stays one opaque source."""
        report = tmp_path / "r.json"
        report.write_text(json.dumps({"title": "t", "body": "b", "case_id": "T-1"}))
        log = tmp_path / "app.log"
        log.write_bytes(b"line\n")
        tgz = A.tar_with(tmp_path / "diag.tgz", [("z.txt", b"z"), ("a/b.txt", b"ab")])
        opaque = A.zip_with(tmp_path / "screens.zip", [("s.png", b"\x89PNG\0")])
        r = cli("intake", "--json", "--store", store_dir, "--report", report,
                "--attach", log, "--attach", f"diagnostics={tgz}", "--attach", opaque)
        assert r.code == 0, r.err
        sources = r.json["catalogue"]["sources"]  # type: ignore[index]
        assert [(s["kind"], s["origin"].get("member")) for s in sources] == [
            ("report", None), ("attachment", None), ("diagnostics", "a/b.txt"),
            ("diagnostics", "z.txt"), ("attachment", None)]
        assert sources[1]["media_type"] == "text/plain"

    def test_flag_overrides_report_case_id(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """--case-id wins over the report's case_id, and intake.json records which was used."""
        r = cli("intake", "--store", store_dir, "--report", sample / "report.json",
                "--case-id", "MY-CASE")
        assert r.code == 0, r.err
        r = cli("cat", "--store", store_dir, "MY-CASE", "case/intake.json")
        assert json.loads(r.out)["case_id_from"] == "flag"

    def test_large_original_is_a_blob_file(self, cli: Cli, tmp_path: Path,
                                           store_dir: Path) -> None:
        """An original over the inline threshold is stored as a fsynced file, byte for byte."""
        report = tmp_path / "r.txt"
        report.write_text("big attachment\n")
        big = tmp_path / "core.dmp"
        big.write_bytes(bytes(range(256)) * 2048)  # 512 KiB
        r = cli("intake", "--store", store_dir, "--report", report, "--case-id", "BIG-1",
                "--attach", big)
        assert r.code == 0, r.err
        digest = hashlib.sha256(big.read_bytes()).hexdigest()
        blob = store_dir / "blobs" / "sha256" / digest[:2] / digest
        assert blob.read_bytes() == big.read_bytes()
