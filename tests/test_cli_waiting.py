"""A command that creates a case (intake, import) waits briefly for another process that
holds the case, instead of answering ``locked`` at once: the same export imported twice at
once, or the same intake, both succeed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from engine import CaseLocked
from tests.conftest import (
    PYTHON,
    VIANO,
    Cli,
    child_env,
    fixture_config,
    paused_child,
    rest_of,
    strict_json,
    wait_until_paused,
)
from viano_bug_analysis.cli._context import LOCKED_TRIES, LOCKED_WAIT_S, waiting_for_the_case


class TestWaitingForTheCase:
    async def test_a_lock_given_back_meanwhile_is_waited_for(self, autojump_clock: object
                                                             ) -> None:
        calls, told = [], []

        async def call() -> str:
            calls.append(trio.current_time())
            if len(calls) <= 3:
                raise CaseLocked("held by pid 1")
            return "done"

        assert await waiting_for_the_case(call, told.append) == "done"
        assert len(calls) == 4 and len(told) == 1 and "held by pid 1" in told[0]
        assert calls[-1] - calls[0] == pytest.approx(3 * LOCKED_WAIT_S)

    async def test_a_lock_kept_is_locked_after_the_wait(self, autojump_clock: object) -> None:
        calls = []

        async def call() -> None:
            calls.append(trio.current_time())
            raise CaseLocked("held")

        with pytest.raises(CaseLocked):
            await waiting_for_the_case(call)
        assert len(calls) == LOCKED_TRIES
        assert calls[-1] - calls[0] == pytest.approx((LOCKED_TRIES - 1) * LOCKED_WAIT_S)

    async def test_another_refusal_is_not_retried(self, autojump_clock: object) -> None:
        calls = []

        async def call() -> None:
            calls.append(1)
            raise ValueError("not a lock")

        with pytest.raises(ValueError):
            await waiting_for_the_case(call)
        assert calls == [1]


@pytest.mark.slow
@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("command", ["import", "intake"])
def test_the_same_command_twice_at_once_both_succeed(cli: Cli, sample: Path, tmp_path: Path,
                                                     command: str) -> None:
    """The first process is paused inside its commit, holding the case; the second, started
    then, says it is waiting (so it did meet the lock), and once the first goes on, finds
    the case in place: both exit 0 with the same generation (it exited 11, locked)."""
    target = tmp_path / "target"
    if command == "import":
        exported = tmp_path / "e.zip"
        assert cli("intake", "--store", tmp_path / "a", "--report", sample / "report.json"
                   ).code == 0
        assert cli("export", "--store", tmp_path / "a", "BUG-20", exported).code == 0
        args = ["import", "--json", "--store", str(target), str(exported)]
    else:
        args = ["intake", "--json", "--store", str(target), "--report",
                str(sample / "report.json")]
    # The target store exists first, so that the second process opens it as it is.
    assert cli("intake", "--store", target, "--report", sample / "report.json",
               "--case-id", "OTHER-1").code == 0
    viano = [*VIANO, *args]
    with paused_child(viano, "txn.before_commit", tmp_path / "paused") as first:
        second = subprocess.Popen(viano, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=child_env())
        try:
            assert second.stderr is not None
            said = second.stderr.readline()  # returns at the note, or at its exit
            assert "waiting for another process" in said, said
            out1, err1 = first.resume()
            out2, rest = rest_of(second)
            err2 = said + rest
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2
    import json

    one, two = json.loads(out1), json.loads(out2)
    assert one["package_generation"] == two["package_generation"] == 1, (one, two)
    assert one["package_id"] == two["package_id"]
    assert cli("verify", "--store", target).code == 0


def _ctrl_c_in_the_commit(tmp_path: Path, args: list[str], sig: str = "SIGINT"
                          ) -> tuple[int | None, str, str]:
    """``viano ARGS`` paused just before its COMMIT, sent SIGINT (or ``sig``) there, then
    let go on."""
    import signal

    with paused_child([*VIANO, *args], "txn.before_commit", tmp_path / "paused") as child:
        child.process.send_signal(getattr(signal, sig))
        out, err = child.resume()
    return child.returncode, out, err


def test_ctrl_c_while_its_change_commits(cli: Cli, sample: Path, tmp_path: Path) -> None:
    """Ctrl-C while a reopen's commit is under way (paused just before COMMIT): the change
    lands, so the command says it is done (exit 0, its result), not "interrupted, run it
    again" — which made a second reopening."""
    store = tmp_path / "s"
    assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
    code, out, err = _ctrl_c_in_the_commit(tmp_path, ["reopen", "BUG-20", "--json",
                                                      "--reason", "again", "--store",
                                                      str(store)])
    assert code == 0, err
    assert "interrupted after the change was committed" in err, err
    doc = strict_json(out)
    assert doc["analysis_revision"] == 2 and doc["changed"] is True, doc  # type: ignore[index]
    r = cli("status", "--json", "--store", store)
    assert r.code == 0 and '"analysis_revision": 2' in r.out, r.out
    assert cli("verify", "--store", store).code == 0


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["intake", "import"])
def test_ctrl_c_while_a_new_case_commits(cli: Cli, sample: Path, tmp_path: Path,
                                         command: str, sig: str) -> None:
    """The same for the commands that create a case: its whole work was that commit, so
    once it landed the command prints its result and exits 0 (it said "interrupted").
    A SIGTERM is a Ctrl-C here too (it ended the process at once: exit 143, no result)."""
    store = tmp_path / "s"
    if command == "import":
        exported = tmp_path / "e.zip"
        assert cli("intake", "--store", tmp_path / "a", "--report", sample / "report.json"
                   ).code == 0
        assert cli("export", "--store", tmp_path / "a", "BUG-20", exported).code == 0
        args = ["import", "--json", "--store", str(store), str(exported)]
    else:
        args = ["intake", "--json", "--store", str(store), "--report",
                str(sample / "report.json")]
    code, out, err = _ctrl_c_in_the_commit(tmp_path, args, sig)
    assert code == 0, err
    assert "interrupted after the change was committed" in err, err
    doc = strict_json(out)
    assert doc["case_id"] == "BUG-20" and doc["package_generation"] == 1, doc  # type: ignore[index]
    listed = cli("status", "--json", "--store", store).json
    assert [c["case_id"] for c in listed] == ["BUG-20"], listed  # type: ignore[union-attr]
    assert cli("verify", "--store", store).code == 0


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_sigterm_during_an_export_cleans_up_as_ctrl_c_does(cli: Cli, sample: Path,
                                                            tmp_path: Path,
                                                            sigint: str) -> None:
    """SIGTERM while an export's file is written (paused before its rename): the export
    removes its temporary file and says ``interrupted`` (exit 130), as on Ctrl-C. It ended
    the process at once, silent, leaving an export-sized temporary file that only a later
    export into the same folder removes, 15 minutes on. Also when the shell started the
    command with SIGINT ignored (a background job)."""
    import signal
    import subprocess

    store = tmp_path / "s"
    assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    marker = tmp_path / "paused"
    argv = [*VIANO, "--json", "--store", str(store), "export", "BUG-20",
            str(out_dir / "e.zip")]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" \
        else None
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=child_env(VIANO_PAUSE_AT="export.written",
                                             VIANO_PAUSE_FILE=str(marker)),
                               preexec_fn=ignore)
    try:
        wait_until_paused(marker, process)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, (process.returncode, err)
    assert strict_json(out)["error"]["reason"] == "interrupted", out  # type: ignore[index]
    assert sorted(p.name for p in out_dir.iterdir()) == [], list(out_dir.iterdir())


def test_ctrl_c_while_a_models_answer_is_recorded(cli: Cli, sample: Path,
                                                  tmp_path: Path) -> None:
    """Ctrl-C while ``viano interpret`` builds the record of the model's answer (on SQLite
    that plan runs on the event loop's thread): the answer, paid for, still lands as its
    round record, and the command says it was interrupted (exit 130). A KeyboardInterrupt
    raised inside the plan threw the answer away, so running the command again called the
    model again; the worker thread it ran on before had held Ctrl-C back until the commit.
    The SIGINT is raised by the plan itself (``round_change`` wrapped): no timing."""
    cfg = fixture_config(tmp_path, sample)
    store = tmp_path / "s"
    assert cli("intake", "--store", store, "--report", sample / "report.json", "--attach",
               f"diagnostics={sample / 'wowdiag.zip'}").code == 0
    code = ("import signal\n"
            "import actors._case_actor as actor\n"
            "real = actor.round_change\n"
            "def interrupted(*args, **kwargs):\n"
            "    signal.raise_signal(signal.SIGINT)\n"
            "    return real(*args, **kwargs)\n"
            "actor.round_change = interrupted\n"
            "from viano_main import run; run()\n")
    proc = subprocess.run([PYTHON, "-c", code, "interpret", "BUG-20", "--json", "--store",
                           str(store), "--config", str(cfg)], env=child_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    answer = "analysis/interpretation/0001/rounds/0001-0001.answer.json"
    log = cli("log", "BUG-20", "--json", "--store", store).json
    added = [path for g in log["generations"] for path in g["added"]]  # type: ignore[index]
    assert answer in added, added
    # Run again, it judges the recorded answer: no second round, no second call.
    again = cli("interpret", "BUG-20", "--json", "--store", store, "--config", cfg)
    assert again.code == 0 and again.json["reason"] == "awaiting_confirmation", again.out  # type: ignore[index]
    log = cli("log", "BUG-20", "--json", "--store", store).json
    rounds = [p for g in log["generations"] for p in g["added"]  # type: ignore[index]
              if "/rounds/" in p]
    assert rounds == [answer], rounds
    assert cli("verify", "--store", store).code == 0
