"""``viano intake --batch``: many reports in one process through group commit; idempotent;
a refusal writes nothing and stops nothing; killed and run again, nothing is taken twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import child_env, run_viano

REPORTS = Path(__file__).parent / "fixtures" / "reports"


def _report(i: int) -> dict[str, Any]:
    return {"title": f"Crash {i}: ünïcode ✓", "body": f"Traceback line {i}\n```\nboom\n```",
            "case_id": f"BULK-{i:03d}", "comments": [{"author": "qa", "body": f"seen {i}"}]}


def _folder(root: Path, n: int) -> Path:
    folder = root / "reports"
    folder.mkdir()
    for i in range(n):
        (folder / f"r{i:03d}.json").write_text(json.dumps(_report(i), ensure_ascii=False))
    return folder


def _bulk(store: Path, path: Path, *extra: str, env: dict[str, str] | None = None
          ) -> tuple[int, dict[str, Any]]:
    r = run_viano("intake", "--json", "--store", store, "--batch", path, *extra, env=env,
                  timeout=300)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr})


def _cases(store: Path) -> list[dict[str, Any]]:
    r = run_viano("status", "--json", "--store", store)
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


def test_a_folder_of_mixed_reports(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 3)
    for name in ("github_gh.json", "jira_v2.json", "jira_v3.json"):
        shutil.copy(REPORTS / name, folder / name)
    (folder / "broken.json").write_text('{"title": "t", "body": ')  # refused: not JSON
    (folder / "notes.txt").write_text("Plain text title\n\nbody of a text report\n")
    (folder / ".hidden.json").write_text("{}")  # left out
    (folder / "subdir").mkdir()  # left out
    store = tmp_path / "s"
    code, doc = _bulk(store, folder)
    assert code == 2, doc  # one refused
    assert (doc["reports"], doc["taken_in"], doc["already_present"]) == (8, 7, 0)
    assert [(r["report"].rsplit("/", 1)[1], r["reason"]) for r in doc["refused"]] == [
        ("broken.json", "invalid_report")]
    ids = sorted(c["case_id"] for c in _cases(store))
    assert ids == sorted(["BULK-000", "BULK-001", "BULK-002", "acme-org_doc.tool_1287",
                          "PAY-314", "UI-88", ids[-1]]) and ids[-1].startswith("case-")
    # Each original byte for byte, under its own name.
    cat = run_viano("cat", "--store", store, "PAY-314", "inputs/jira_v2.json")
    assert cat.stdout.encode() == (REPORTS / "jira_v2.json").read_bytes()
    # Again: everything already present, the refusal refused again, nothing new.
    code, again = _bulk(store, folder)
    assert code == 2 and (again["taken_in"], again["already_present"]) == (0, 7)
    assert [c["package_generation"] for c in _cases(store)] == [1] * 7
    # One report changed: that case is refused (case_exists); the others still present.
    (folder / "r001.json").write_text(json.dumps(_report(1) | {"body": "changed"}))
    code, changed = _bulk(store, folder)
    assert code == 2 and changed["already_present"] == 6
    assert sorted((r["reason"], str(r["case_id"])) for r in changed["refused"]) == [
        ("case_exists", "BULK-001"), ("invalid_report", "None")]
    assert run_viano("verify", "--store", store).returncode == 0


def test_json_lines(tmp_path: Path) -> None:
    lines = [json.dumps(_report(i), ensure_ascii=False).encode() for i in range(4)]
    gh = json.dumps(json.loads((REPORTS / "github_rest_combined.json").read_text())).encode()
    data = b"\n".join([lines[0], b"", lines[1], b"[1, 2]", gh, lines[2] + b"\r", lines[3]])
    path = tmp_path / "issues.jsonl"
    path.write_bytes(data + b"\n")
    code, doc = _bulk(tmp_path / "s", path)
    assert code == 2 and doc["taken_in"] == 5
    assert [(r["report"].rsplit(":", 1)[1], r["reason"]) for r in doc["refused"]] == [
        ("4", "invalid_report")]  # line 4 is a list
    cat = run_viano("cat", "--store", tmp_path / "s", "BULK-002", "inputs/report.json")
    assert cat.stdout.encode() == lines[2]  # the line's bytes, without its line ending
    assert run_viano("status", "--store", tmp_path / "s", "acme-org_doc.tool_77").returncode \
        == 0


def test_group_commit_carries_a_bulk_intake(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 150)
    code, doc = _bulk(tmp_path / "s", folder)
    assert code == 0 and doc["taken_in"] == 150 and doc["refused"] == []
    store = doc["store"]
    assert store["publications"] == 150
    assert store["transactions"] < store["publications"]  # shared transactions
    assert store["publications_per_transaction"] > 1


def test_killed_mid_batch_and_run_again_takes_nothing_twice(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 40)
    store = tmp_path / "s"
    env = child_env() | {"VIANO_CRASH_AT": "txn.after_commit:2"}
    r = run_viano("intake", "--json", "--store", store, "--batch", folder, env=env,
                  timeout=300)
    assert r.returncode == 137, (r.returncode, r.stderr)  # died after its second commit
    first = len(_cases(store))
    assert 0 < first < 40
    code, doc = _bulk(store, folder)
    assert code == 0, doc
    assert doc["taken_in"] == 40 - first and doc["already_present"] == first
    cases = _cases(store)
    assert sorted(c["case_id"] for c in cases) == [f"BULK-{i:03d}" for i in range(40)]
    assert all(c["package_generation"] == 1 for c in cases)
    assert run_viano("verify", "--store", store).returncode == 0


def test_bulk_usage_errors(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 1)
    for args in (["--batch", folder, "--attach", folder / "r000.json"],
                 ["--batch", folder, "--case-id", "X"],
                 ["--batch", tmp_path / "missing"],
                 ["--batch", folder, "--report", folder / "r000.json"]):
        r = run_viano("intake", "--json", "--store", tmp_path / "s", *args)
        assert r.returncode == 2, (args, r.stdout)
        assert json.loads(r.stdout)["error"]["reason"] == "usage_error", args
    assert not (tmp_path / "s").exists()
    r = run_viano("intake", "--store", tmp_path / "s", "--batch", folder)
    assert r.returncode == 0 and "taken in 1, already present 0, refused 0" in r.stdout
