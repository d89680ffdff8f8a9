"""Packages an older release took in read as that release read them.

``fixtures/reports-store-96b70a9.zip`` is a store that Viano at 96b70a9 (before reader and
ADF conversion versions) took GitHub and Jira reports into, made by
``fixtures/make_reports_store.py`` with that release's own code, beside the sha256 of the
interpretation context it derived for each case. Today's code derives each again from the
stored original: it must be those exact bytes (verify compares a pinned context with the
one it derives, so any drift fails every such package once interpreted), though today's
readers read the same reports otherwise (tests/test_intake_formats.py). Not circular: the
expected bytes come from the old release, not from today's code pretending to be it."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_viano
from tests.phase_helpers import interpretation_context

pytestmark = pytest.mark.sqlite_only  # the fixture is a SQLite store

FIXTURE = Path(__file__).with_name("fixtures") / "reports-store-96b70a9.zip"


@pytest.fixture(scope="module")
def old_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("old") / "store"
    with zipfile.ZipFile(FIXTURE) as zf:
        contexts: dict[str, str] = json.loads(zf.read("contexts.json"))
        for name in zf.namelist():
            if name != "contexts.json":
                zf.extract(name, root)
    return root, contexts


def _context(root: Path, case: str) -> dict[str, Any]:
    raw = interpretation_context(root, case)
    return {"sha256": hashlib.sha256(raw).hexdigest(), "doc": json.loads(raw)}


@pytest.mark.parametrize("case", ["JIRA-BLANK", "JIRA-ADF", "GH-TEXT", "GH-KEYS"])
def test_an_old_package_derives_the_context_its_release_derived(
        old_store: tuple[Path, dict[str, str]], case: str) -> None:
    root, contexts = old_store
    got = _context(root, case)
    assert got["sha256"] == contexts[case], json.dumps(got["doc"], indent=1)[:3000]


def test_the_old_store_verifies_and_its_intake_records_name_no_reader(
        old_store: tuple[Path, dict[str, str]]) -> None:
    root, _ = old_store
    r = run_viano("verify", "--store", root)
    assert r.returncode == 0, r.stdout + r.stderr
    intake = json.loads(run_viano("cat", "--store", root, "JIRA-BLANK",
                                  "case/intake.json").stdout)
    assert "reader" not in intake["inputs"][0]  # reader 1, and so adf-text/1
    texts = _context(root, "JIRA-BLANK")["doc"]["untrusted_case_data"]["human_texts"]
    assert [t["text"] for t in texts] == ["Export hangs on big files", "me too"]
