"""``viano intake --batch``: many reports in one process through group commit; idempotent;
a refusal writes nothing and stops nothing; killed and run again, nothing is taken twice."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine import IntakeLimits
from tests.conftest import VIANO, child_env, run_viano
from viano_bug_analysis.cli._intake_commands import IN_FLIGHT

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


@pytest.mark.usefixtures("backend")
def test_already_present_is_the_rule_single_intake_uses(tmp_path: Path) -> None:
    """Bulk intake calls a case "already present" only if it holds every file this intake
    would write (IntakePlan.is_in, as single intake does), not merely the same report
    bytes: a case taken in with the same report plus an attachment is another intake
    (case_exists), and a case whose head does not read back proves nothing (case_exists,
    never an internal error); the others are present."""
    from tests.store_helpers import query, sql

    folder = _folder(tmp_path, 3)
    store = tmp_path / "s"
    log = tmp_path / "app.log"
    log.write_text("a log line\n")
    r = run_viano("intake", "--store", store, "--report", folder / "r000.json",
                  "--attach", f"diagnostics={log}")
    assert r.returncode == 0, r.stderr
    code, doc = _bulk(store, folder)
    assert code == 2 and (doc["taken_in"], doc["already_present"]) == (2, 0), doc
    assert [(x["case_id"], x["reason"]) for x in doc["refused"]] == [
        ("BULK-000", "case_exists")], doc
    pkg = query(store, "SELECT package_id FROM refs WHERE case_id='BULK-001'")[0][0]
    raw = bytearray(query(store, "SELECT manifest FROM generations WHERE package_id=?",
                          pkg)[0][0])
    raw[10] ^= 0x04
    sql(store, "UPDATE generations SET manifest=? WHERE package_id=?", bytes(raw), pkg)
    code, again = _bulk(store, folder)
    assert code == 2 and (again["taken_in"], again["already_present"]) == (0, 1), again
    assert sorted((x["case_id"], x["reason"]) for x in again["refused"]) == [
        ("BULK-000", "case_exists"), ("BULK-001", "case_exists")], again


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
    # More reports than two commits can hold, whatever the timing: at most IN_FLIGHT
    # publications wait on the publisher, so a commit takes at most that many.
    n = 2 * IN_FLIGHT + 10
    folder = _folder(tmp_path, n)
    store = tmp_path / "s"
    env = child_env() | {"VIANO_CRASH_AT": "txn.after_commit:2"}
    r = run_viano("intake", "--json", "--store", store, "--batch", folder, env=env,
                  timeout=300)
    assert r.returncode == 137, (r.returncode, r.stderr)  # died after its second commit
    first = len(_cases(store))
    assert 0 < first <= 2 * IN_FLIGHT
    code, doc = _bulk(store, folder)
    assert code == 0, doc
    assert doc["taken_in"] == n - first and doc["already_present"] == first
    # Those found already there were no publications (they were counted as ones).
    assert doc["store"]["publications"] == n - first, doc["store"]
    assert doc["store"]["refused"] == first, doc["store"]
    code, doc = _bulk(store, folder)
    assert code == 0 and doc["already_present"] == n
    assert doc["store"]["publications"] == 0 and doc["store"]["refused"] == n, doc["store"]
    cases = _cases(store)
    assert sorted(c["case_id"] for c in cases) == [f"BULK-{i:03d}" for i in range(n)]
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


def test_links_and_special_files_are_left_out_and_listed(tmp_path: Path) -> None:
    import os

    folder = _folder(tmp_path, 2)
    secret = tmp_path / "secret.txt"
    secret.write_text("Secret\nnot a report of this folder\n")
    (folder / "link.txt").symlink_to(secret)  # a link could name any file at all
    (folder / "dangling.txt").symlink_to(tmp_path / "nowhere")
    os.mkfifo(folder / "pipe.txt")
    (folder / "sub").mkdir()
    code, doc = _bulk(tmp_path / "s", folder)
    assert code == 0 and doc["taken_in"] == 2 and doc["reports"] == 2, doc
    assert sorted((e["entry"].rsplit("/", 1)[1], e["why"]) for e in doc["skipped"]) == [
        ("dangling.txt", "symbolic_link"), ("link.txt", "symbolic_link"),
        ("pipe.txt", "not_a_regular_file"), ("sub", "folder")]
    assert sorted(c["case_id"] for c in _cases(tmp_path / "s")) == ["BULK-000", "BULK-001"]


def test_a_file_given_to_batch_must_be_json_lines_and_lines_must_be_json(
        tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text('garbage "title": "x"\n[1, 2]\n')
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--batch", notes)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "usage_error"
    lines = tmp_path / "r.jsonl"
    lines.write_text('garbage "title": "x"\n' + json.dumps(_report(1)) + "\n")
    code, doc = _bulk(tmp_path / "s", lines)
    assert code == 2 and doc["taken_in"] == 1
    assert [r["reason"] for r in doc["refused"]] == ["invalid_report"]


def test_the_count_of_reports_is_what_is_taken_or_refused(tmp_path: Path) -> None:
    big = json.dumps(_report(9) | {"body": "x" * (3 << 20)})  # one line of 3 MiB
    lines = tmp_path / "r.jsonl"
    lines.write_text("\n\n" + json.dumps(_report(1)) + "\n  \n" + big + "\n" +
                     json.dumps(_report(2)) + "\n\n")
    code, doc = _bulk(tmp_path / "s", lines)
    assert code == 0, doc
    assert doc["reports"] == 3 == doc["taken_in"] + len(doc["refused"])


def test_a_report_that_breaks_a_reader_refuses_that_report_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug met on one report (here: a reader that raises) is that report's refusal,
    with reason internal_error; the batch goes on."""
    from viano_bug_analysis.cli import _intake_commands as bulk

    real = bulk.prepare_intake

    def flaky(path: Path, *a: Any, **kw: Any) -> Any:
        if path.name == "r001.json":
            raise RuntimeError("a reader bug")
        return real(path, *a, **kw)

    monkeypatch.setattr(bulk, "prepare_intake", flaky)
    seen: list[tuple[str, dict[str, Any]]] = []
    items = [bulk._Item(str(p), p) for p in sorted(_folder(tmp_path, 3).iterdir())]
    plans = [bulk._prepare(item, IntakeLimits(), None, lambda k, e: seen.append((k, e)))
             for item in items]
    assert [p is not None for p in plans] == [True, False, True]
    assert [(k, e["reason"]) for k, e in seen] == [("refused", "internal_error")]


def test_ctrl_c_reports_exactly_what_the_store_holds(tmp_path: Path) -> None:
    import signal
    import subprocess


    folder = _folder(tmp_path, 2500)
    store = tmp_path / "s"
    proc = subprocess.Popen([*VIANO,
                             "intake", "--json", "--store", str(store), "--batch",
                             str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    db = store / "store.sqlite3"
    for _ in range(2000):  # until the first commit has made the store
        if db.exists() or proc.poll() is not None:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.01)
    proc.send_signal(signal.SIGINT)
    out, _err = proc.communicate(timeout=120)
    doc = json.loads(out)
    assert proc.returncode == (130 if doc["interrupted"] else 0), (proc.returncode, doc)
    held = len(_cases(store))
    assert doc["taken_in"] == held  # nothing committed goes unreported
    code, again = _bulk(store, folder)
    assert code == 0 and again["already_present"] == held
    assert again["taken_in"] == 2500 - held


def test_a_link_put_in_a_files_place_after_the_listing_is_not_followed(
        tmp_path: Path) -> None:
    """The folder is listed, then each entry read; whoever can write to the folder may put
    a symbolic link in a file's place in between. The read never follows it."""
    from viano_bug_analysis.cli import _intake_commands as bulk

    folder = _folder(tmp_path, 2)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0\n")
    _total, items, _skipped = bulk._items(folder, IntakeLimits())
    listed = list(items)
    (folder / "r001.json").unlink()
    (folder / "r001.json").symlink_to(secret)
    seen: list[tuple[str, dict[str, Any]]] = []
    plans = [bulk._prepare(i, IntakeLimits(), None, lambda k, e: seen.append((k, e)))
             for i in listed]
    assert plans[0] is not None and plans[1] is None
    assert [(k, e["reason"]) for k, e in seen] == [("refused", "unreadable_input")]
    assert "symbolic link" in seen[0][1]["message"]


def test_oversized_blank_lines_count_as_reports_and_a_json_file_is_not_json_lines(
        tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[intake.limits]\nmax_report_bytes = 1000\n")
    lines = tmp_path / "r.jsonl"
    lines.write_text(json.dumps(_report(1)) + "\n" + " " * 5000 + "\n\n" +
                     json.dumps(_report(2)) + "\n")
    code, doc = _bulk(tmp_path / "s", lines, "--config", config)
    assert doc["reports"] == 3 == doc["taken_in"] + len(doc["refused"]), doc
    assert [r["reason"] for r in doc["refused"]] == ["limit_exceeded"] and code == 2
    one = tmp_path / "one.json"
    one.write_text(json.dumps(_report(3), indent=2))
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--batch", one)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "usage_error"
