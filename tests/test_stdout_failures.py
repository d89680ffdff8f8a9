"""Standard output that cannot take the result — a full disk (``> /dev/full``) or a closed
descriptor (``>&-``) — is never an internal error and never a traceback.

A full stdout is ``output_unwritable`` (exit 1: the report is lost, the work is not; under
``--json`` the reason is on stderr, as stdout refuses everything). A closed stdout is
opened on /dev/null before anything else: left closed, the next file the process opened
took descriptor 1, and what was printed would land in it (a store's file included).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import VIANO, child_env, run_viano

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")


def _with_stdout(args: list[str], stdout: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """viano with its stdout redirected by the shell (``> /dev/full`` or ``>&-``)."""
    quoted = " ".join(f"'{a}'" for a in [*VIANO, *args])
    return subprocess.run(["sh", "-c", f"exec {quoted} {stdout}"], capture_output=True,
                          text=True, env=child_env(), timeout=120, check=False, cwd=cwd)


@pytest.fixture
def store(tmp_path: Path, sample: Path) -> Path:
    root = tmp_path / "s"
    r = run_viano("--store", root, "intake", *_sample_args(sample))
    assert r.returncode == 0, r.stderr
    return root


def _sample_args(sample: Path) -> list[str]:
    return ["--report", str(sample / "report.json"), "--attach",
            f"diagnostics={sample / 'wowdiag.zip'}", "--attach",
            f"source={sample / 'wowsrc.zip'}"]


def _unwritable(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "error[output_unwritable]" in r.stderr, r.stderr
    assert "internal_error" not in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [
    ["status"], ["--json", "status"], ["show", "BUG-20"], ["--json", "show", "BUG-20"],
    ["cat", "BUG-20", "inputs/report.json"], ["log", "BUG-20"], ["--json", "verify"],
    ["--help"], ["--json", "--version"], ["--json", "status", "--no-such-flag"],
], ids=lambda a: " ".join(a))
def test_a_full_stdout_is_output_unwritable(store: Path, tmp_path: Path,
                                            args: list[str]) -> None:
    r = _with_stdout(["--store", str(store), *args], f"> {FULL}", tmp_path)
    if "--no-such-flag" in args:  # the refusal's own code stands; its document is lost
        assert r.returncode == 2 and "error[usage_error]" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        return
    _unwritable(r)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_an_intake_whose_result_cannot_be_printed_is_kept(tmp_path: Path, sample: Path,
                                                          json_flag: list[str]) -> None:
    root = tmp_path / "s"
    r = _with_stdout(["--store", str(root), *json_flag, "intake", "--report",
                      str(sample / "report.json")], f"> {FULL}", tmp_path)
    _unwritable(r)
    status = run_viano("--store", root, "--json", "status")
    assert status.returncode == 0 and "BUG-20" in status.stdout, status.stdout
    assert run_viano("--store", root, "verify").returncode == 0


def test_an_export_whose_result_cannot_be_printed_is_written(store: Path,
                                                             tmp_path: Path) -> None:
    dest = tmp_path / "x.zip"
    _unwritable(_with_stdout(["--store", str(store), "export", "BUG-20", str(dest)],
                             f"> {FULL}", tmp_path))
    assert dest.is_file()
    r = run_viano("--store", tmp_path / "other", "import", dest)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args", [["status"], ["--json", "status"], ["verify"],
                                  ["--json", "intake", "SAMPLE"]],
                         ids=lambda a: " ".join(a))
def test_a_closed_stdout_is_dev_null(store: Path, tmp_path: Path, sample: Path,
                                     args: list[str]) -> None:
    args = [x for a in args for x in (_sample_args(sample) if a == "SAMPLE" else [a])]
    r = _with_stdout(["--store", str(store), *args], ">&-", tmp_path)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stderr == "" or "already present" in r.stderr or r.stderr.isspace(), r.stderr
    assert run_viano("--store", store, "verify").returncode == 0


def test_a_closed_stdout_never_becomes_a_file_of_the_process(store: Path, tmp_path: Path,
                                                             sample: Path) -> None:
    """With fd 1 closed, the first file the command opened (the event log here) took
    descriptor 1, and the result printed on "stdout" went into it."""
    config = tmp_path / "c.toml"
    config.write_text(f'[[providers]]\nname = "fx"\nkind = "fixture"\n'
                      f'path = "{sample / "fixtures"}"\n[interpretation]\nauto_confirm = true\n')
    log = tmp_path / "events.jsonl"
    r = _with_stdout(["--store", str(store), "--config", str(config), "--log-json", str(log),
                      "run", "--all"], ">&-", tmp_path)
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    assert lines, "the run logged no event"
    for line in lines:
        assert line.startswith('{"'), line  # JSON Lines only, no human result among them
    assert run_viano("--store", store, "verify").returncode == 0
