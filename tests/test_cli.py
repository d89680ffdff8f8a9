"""The command line as users and scripts see it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, VIANO, Cli, child_env, fixture_config, run_viano
from tests.store_helpers import open_ro
from viano_bug_analysis.cli._commands import COMMANDS

pytestmark = pytest.mark.usefixtures("backend")


class TestHelp:
    @pytest.mark.parametrize("command", [None, *sorted(COMMANDS)])
    def test_every_command_has_help(self, cli: Cli, command: str | None) -> None:
        """`--help` works on the program and on every command, and exits 0."""
        r = cli(*([command] if command else []), "--help")
        assert r.code == 0
        assert "usage: viano" in r.out and "--store" in r.out

    @pytest.mark.parametrize("command", [None, *sorted(COMMANDS)])
    def test_help_under_json_is_one_json_document(self, cli: Cli, command: str | None) -> None:
        """`--json` promises one JSON document on stdout, `--help` included."""
        r = cli(*([command] if command else []), "--help", "--json")
        assert r.code == 0
        doc = r.json
        assert isinstance(doc, dict) and doc["command"] == " ".join(["viano", command or ""]
                                                                     ).strip()
        assert "usage: viano" in doc["help"] and "--store" in doc["help"]

    def test_version_under_json_is_one_json_document(self, cli: Cli) -> None:
        from importlib.metadata import version

        r = cli("--json", "--version")
        assert r.code == 0 and r.json == {"program": "viano", "version": version("viano")}


class TestGlobalOptions:
    def test_before_or_after_the_command(self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """`viano --store S status` and `viano status --store S` are the same."""
        store = tmp_path / "s"
        assert cli("intake", "--report", sample / "report.json", "--store", store).code == 0
        before = cli("--store", store, "--json", "status")
        after = cli("status", "--store", store, "--json")
        assert before.code == after.code == 0
        assert before.json == after.json
        assert [c["case_id"] for c in before.json] == ["BUG-20"]  # type: ignore[union-attr]

    def test_env_store(self, cli: Cli, sample: Path, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
        """VIANO_STORE selects the store when --store is absent."""
        monkeypatch.setenv("VIANO_STORE", str(tmp_path / "env-store"))
        assert cli("intake", "--report", sample / "report.json").code == 0
        store = open_ro(tmp_path / "env-store")
        assert [c.case_id for c in store.list_cases()] == ["BUG-20"]
        store.close()

    def test_bad_config_refused_naming_key_and_file(self, cli: Cli, tmp_path: Path,
                                                    sample: Path) -> None:
        """A bad configuration stops every command with exit 2, naming key and file."""
        cfg = tmp_path / "bad.toml"
        cfg.write_text("[hypotheses]\nmin_hypotheses = 0\n")
        r = cli("status", "--config", cfg)
        assert r.code == 2
        assert "min_hypotheses" in r.err and str(cfg) in r.err and "config_invalid" in r.err


class TestJsonOutput:
    def test_one_document_on_stdout(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """With --json, stdout is exactly one JSON document for every read command."""
        cli("intake", "--store", store_dir, "--report", sample / "report.json")
        for args in (["status"], ["show", "BUG-20"], ["log", "BUG-20"], ["verify"],
                     ["cat", "BUG-20", "case/catalogue.json"]):
            r = cli(*args, "--store", store_dir, "--json")
            assert r.code == 0, (args, r.err)
            json.loads(r.out)

    def test_errors_are_json_too(self, cli: Cli, store_dir: Path) -> None:
        """An error with --json is a JSON document with reason and hint."""
        r = cli("show", "NOPE", "--store", store_dir, "--json")
        assert r.code == 2
        err = r.json["error"]  # type: ignore[index]
        assert err["reason"] == "no_store" and err["hint"]


class TestReadCommands:
    def test_show_log_and_status(self, cli: Cli, sample: Path, store_dir: Path) -> None:
        """show prints the contracted manifest, log the history, status the index."""
        cli("intake", "--store", store_dir, "--report", sample / "report.json",
            "--attach", f"diagnostics={sample / 'wowdiag.zip'}")
        manifest = cli("show", "BUG-20", "--store", store_dir, "--json").json
        assert isinstance(manifest, dict)
        assert manifest["format"] == "viano-case-package/1"
        assert manifest["package_generation"] == 1 and manifest["parent_generation"] is None
        assert manifest["pointers"]["catalogue"] == "case/catalogue.json"
        assert set(manifest["files"]) == {"inputs/report.json", "inputs/wowdiag.zip",
                                          "case/catalogue.json", "case/intake.json"}
        log = cli("log", "BUG-20", "--store", store_dir, "--json").json
        assert isinstance(log, dict)
        assert log["generations"][0]["added"] == sorted(manifest["files"])
        status = cli("status", "--store", store_dir, "--json").json
        assert isinstance(status, list)
        assert status[0]["phase"] == "INTAKE" and status[0]["package_generation"] == 1

    def test_unknown_case_path_and_generation(self, cli: Cli, sample: Path,
                                              store_dir: Path) -> None:
        """Unknown names are refused with their own reason codes."""
        cli("intake", "--store", store_dir, "--report", sample / "report.json")
        assert "unknown_case" in cli("show", "X", "--store", store_dir).err
        assert "unknown_path" in cli("cat", "BUG-20", "nope", "--store", store_dir).err
        assert "unknown_generation" in cli("show", "BUG-20", "--generation", "9",
                                           "--store", store_dir).err

    def test_status_and_gc_on_the_default_store_not_made_yet(
            self, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The default store not made yet lists nothing (and gc removes nothing); a store
        the user named that does not exist is no_store, as for every other command (a
        mistyped path must not look like an empty store). Nothing is created."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("VIANO_STORE", raising=False)
        monkeypatch.delenv("VIANO_CONFIG", raising=False)
        for cmd in (["status"], ["gc"]):
            r = cli(*cmd, "--json")
            assert r.code == 0, r.err
            r = cli(*cmd, "--json", "--store", tmp_path / "none")
            assert (r.code, r.json["error"]["reason"]) == (2, "no_store"), r.out  # type: ignore[index]
            monkeypatch.setenv("VIANO_STORE", str(tmp_path / "none"))
            r = cli(*cmd, "--json")
            assert (r.code, r.json["error"]["reason"]) == (2, "no_store"), r.out  # type: ignore[index]
            monkeypatch.delenv("VIANO_STORE")
        assert list(tmp_path.iterdir()) == []


class TestConsoleScript:
    def test_demo_through_the_installed_entry_point(self, tmp_path: Path) -> None:
        """The console script runs the bundled demo end to end: every phase COMPLETED,
        verify clean, and the interpretation summary shown; it leaves nothing behind."""
        proc = subprocess.run([*VIANO, "demo", "--json"], capture_output=True, text=True,
                              env=child_env(), cwd=tmp_path, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["verify"]["ok"] is True
        assert [r["status"] for r in doc["results"]] == ["COMPLETED"] * len(doc["results"])
        assert doc["results"][0]["case_id"] == "BUG-20"
        assert "# Case interpretation: `BUG-20`, revision 1" in doc["interpretation_summary"]
        assert "first known divergence" in doc["interpretation_summary"]
        assert list(tmp_path.iterdir()) == []

    def test_the_console_script_is_the_small_entry_module(self) -> None:
        from importlib.metadata import entry_points

        (script,) = entry_points(group="console_scripts", name="viano")
        assert script.value == "viano_main:run"

    # Ctrl-C while the command line is still being imported: ``os.kill`` to itself just as
    # the import starts, which is the moment a user's early Ctrl-C lands in.
    EARLY_CTRL_C = """
import builtins, os, signal, sys
real = builtins.__import__
def hit(name, *args, **kwargs):
    if name == "viano_bug_analysis.cli" and not hit.done:
        hit.done = True
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)
hit.done = False
builtins.__import__ = hit
from viano_main import run
run()
"""

    @pytest.mark.parametrize("as_json", [True, False])
    def test_ctrl_c_before_the_command_starts(self, tmp_path: Path, as_json: bool) -> None:
        store = tmp_path / "s"
        proc = subprocess.run([PYTHON, "-c", self.EARLY_CTRL_C, "status", "--store", store,
                               *(["--json"] if as_json else [])], capture_output=True,
                              text=True, env=child_env(), timeout=120, check=False)
        assert proc.returncode == 130, proc.stderr
        assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
        assert "error[interrupted]" in proc.stderr and "nothing was done" in proc.stderr
        if as_json:
            assert json.loads(proc.stdout)["error"]["reason"] == "interrupted"
        else:
            assert proc.stdout == ""
        assert not store.exists()

    # A signal while the command line is parsed and the configuration read: after the
    # imports (viano_main's guard is gone), before the command sets its own handlers.
    PARSING_SIGNAL = """
import os, signal, sys
import viano_bug_analysis.cli as cli
sig = getattr(signal, sys.argv.pop(1))
real = cli.parse
def parse(argv):
    os.kill(os.getpid(), sig)
    return real(argv)
cli.parse = parse
from viano_main import run
run()
"""

    @pytest.mark.no_store
    @pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
    @pytest.mark.parametrize("as_json", [True, False])
    def test_a_signal_while_the_arguments_are_read_is_an_interruption(
            self, tmp_path: Path, sig: str, as_json: bool) -> None:
        """A SIGTERM there ended the process with exit 143 and nothing said, no JSON
        document under --json (a daemon stopped half a second after its start)."""
        store = tmp_path / "s"
        proc = subprocess.run([PYTHON, "-c", self.PARSING_SIGNAL, sig, "status", "--store",
                               store, *(["--json"] if as_json else [])], capture_output=True,
                              text=True, env=child_env(), timeout=120, check=False)
        assert proc.returncode == 130, (proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr and "error[interrupted]" in proc.stderr
        if as_json:
            assert json.loads(proc.stdout)["error"]["reason"] == "interrupted"
        else:
            assert proc.stdout == ""
        assert not store.exists()

    # A signal that comes once the command has returned: as its event log closes, or as
    # the interpreter shuts down (atexit), the moments a Ctrl-C just after the result
    # lands in.
    LATE_SIGNAL = """
import atexit, contextlib, os, signal, sys
import viano_bug_analysis.cli as cli
sig, moment = getattr(signal, sys.argv.pop(1)), sys.argv.pop(1)
if moment == "closing":
    real = cli.event_log
    @contextlib.contextmanager
    def closing(*args, **kwargs):
        with real(*args, **kwargs) as log:
            yield log
        os.kill(os.getpid(), sig)
    cli.event_log = closing
else:
    atexit.register(os.kill, os.getpid(), sig)
from viano_main import run
run()
"""

    @pytest.mark.no_store  # the console script's own signal handling, on any store
    @pytest.mark.parametrize("moment", ["closing", "exiting"])
    @pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
    def test_a_signal_after_the_result_interrupts_nothing(self, tmp_path: Path, sig: str,
                                                          moment: str) -> None:
        """The result stands (exit 0, its one document, nothing on stderr). It was exit 130
        with ``interrupted`` on stderr, a KeyboardInterrupt traceback, or the process
        killed by the signal with nothing said."""
        store = tmp_path / "s"
        report = tmp_path / "r.txt"
        report.write_text("Crash\nIt crashes.\n")
        assert run_viano("--store", store, "intake", "--report", report).returncode == 0
        proc = subprocess.run([PYTHON, "-c", self.LATE_SIGNAL, sig, moment, "--json",
                               "status", "--store", store], capture_output=True, text=True,
                              env=child_env(), timeout=120, check=False)
        assert proc.returncode == 0, (proc.returncode, proc.stderr)
        assert proc.stderr == "", proc.stderr
        assert [c["status"] for c in json.loads(proc.stdout)] == ["READY"]

    @pytest.mark.no_store
    def test_main_in_process_gives_the_callers_handlers_back(self, tmp_path: Path) -> None:
        """Only the console script goes deaf once its command has ended: ``main`` called
        by an embedding program (here in its main thread) leaves its handlers as they
        were, ignoring nothing."""
        import signal
        import threading

        from viano_bug_analysis.cli import main

        # Off the main thread main() sets no handlers at all: the test would prove nothing.
        assert threading.current_thread() is threading.main_thread()

        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        report = tmp_path / "r.txt"
        report.write_text("Crash\nIt crashes.\n")
        assert main(["--store", str(tmp_path / "s"), "intake", "--report", str(report)]) == 0
        assert {s: signal.getsignal(s) for s in before} == before
        assert signal.SIG_IGN not in before.values()


class TestPhaseCommands:
    def test_interpret_confirm_hypothesize_with_the_fixture_provider(
            self, cli: Cli, sample: Path, tmp_path: Path) -> None:
        """The whole path through the CLI, with the contract's exit codes and results."""
        cfg = fixture_config(tmp_path, sample)
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json", "--attach",
                   f"diagnostics={sample / 'wowdiag.zip'}").code == 0
        early = cli("hypothesize", "BUG-20", "--json", "--store", store, "--config", cfg)
        assert early.code == 13
        assert early.json["reason"] == "interpretation_not_confirmed"  # type: ignore[index]
        r = cli("interpret", "BUG-20", "--json", "--store", store, "--config", cfg)
        assert r.code == 0 and r.json["reason"] == "awaiting_confirmation"  # type: ignore[index]
        assert cli("confirm", "BUG-20", "--by", "qa", "--store", store).code == 0
        r = cli("hypothesize", "BUG-20", "--json", "--store", store, "--config", cfg)
        assert r.code == 0, r.out
        doc = r.json
        assert isinstance(doc, dict)
        assert set(doc) == {"case_id", "package_id", "phase", "status", "reason", "message",
                            "analysis_revision", "package_generation", "attempt_id", "round",
                            "max_rounds", "due_at"}
        assert (doc["phase"], doc["status"]) == ("GENERATING_HYPOTHESES", "COMPLETED")
        status = cli("status", "--json", "--store", store).json
        assert status[0]["phase"] == "GENERATING_HYPOTHESES"  # type: ignore[index]
        assert cli("verify", "--store", store).code == 0
        md = cli("cat", "BUG-20", "analysis/hypotheses/0001/hypotheses.md", "--store", store)
        assert "## H1:" in md.out

    def test_no_providers_is_a_configuration_refusal(self, cli: Cli, sample: Path,
                                                     tmp_path: Path) -> None:
        store = tmp_path / "s"
        assert cli("intake", "--store", store, "--report", sample / "report.json").code == 0
        r = cli("interpret", "BUG-20", "--json", "--store", store)
        assert r.code == 2 and r.json["error"]["reason"] == "config_invalid"  # type: ignore[index]

    def test_dispatch_commands_never_create_a_store(self, cli: Cli, sample: Path,
                                                    tmp_path: Path) -> None:
        cfg = fixture_config(tmp_path, sample)
        for cmd in ("interpret", "hypothesize", "confirm", "unblock"):
            r = cli(cmd, "BUG-20", "--json", "--store", tmp_path / "none", "--config", cfg)
            assert r.code == 2 and r.json["error"]["reason"] == "no_store", (cmd, r.out)  # type: ignore[index]
        assert not (tmp_path / "none").exists()
