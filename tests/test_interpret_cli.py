"""Interpretation through the command line, as real processes against a loopback provider
server in its own process: the round policy with small real delays, SIGKILL at every named
step, two processes on one case, and an echoed key across a whole phase."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import VIANO, child_env, paused_child, run_viano
from tests.loopback.process import Provider, start_provider
from tests.phase_helpers import FIXTURES, SAMPLE

KEY = "sk-VIANO-CLI-9d8c7b6a5f4e3d2c1b0a"


@pytest.fixture
def answers(tmp_path: Path) -> Path:
    """The loopback server's answer folder: <prompt_id>.json."""
    d = tmp_path / "answers"
    d.mkdir()
    (d / "interpretation_v1.json").write_text(
        (FIXTURES / "interpretation_v1" / "BUG-20.json").read_text())
    return d


@pytest.fixture
def provider(tmp_path: Path, answers: Path) -> Iterator[Provider]:
    p = start_provider(tmp_path, answers)
    yield p
    p.stop()


def _config(tmp: Path, port: int, *, retries: int = 0, extra: str = "",
            providers: str | None = None) -> Path:
    cfg = tmp / f"cfg-{port}.toml"
    cfg.write_text(extra + (providers or f"""
[[providers]]
name = "loopback"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "m"
api_key_env = "VIANO_CLI_KEY"
retries = {retries}
timeout_s = 10
"""))
    return cfg


def _env(**extra: str) -> dict[str, str]:
    return child_env(VIANO_CLI_KEY=KEY, **extra)


def _intake(store: Path) -> None:
    r = run_viano("intake", "--store", store, "--report", SAMPLE / "report.json", "--attach",
                  f"diagnostics={SAMPLE / 'wowdiag.zip'}", "--attach",
                  f"source={SAMPLE / 'wowsrc.zip'}")
    assert r.returncode == 0, r.stderr


def _interpret(store: Path, cfg: Path, *args: str, env: dict[str, str] | None = None
               ) -> tuple[int, dict[str, object]]:
    r = run_viano("interpret", "BUG-20", "--json", "--store", store, "--config", cfg, *args,
                  env=env or _env())
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout)


class TestRoundPolicyThroughTheCli:
    def test_retry_pending_not_due_blocked_unblock(self, tmp_path: Path, answers: Path) -> None:
        """Exit 10 with a due time; exit 11 not_due before it (no request); exit 12 after
        max_rounds; `viano unblock`; then exit 0."""
        p = start_provider(tmp_path, answers, mode="503")
        try:
            store = tmp_path / "s"
            _intake(store)
            # A due time a CLI start-up cannot pass by itself (start-up is ~0.3 s here).
            cfg = _config(tmp_path, p.port, extra="[retry]\nmax_rounds = 3\nbase_delay_s = 1.5\n"
                                                  "max_delay_s = 1.5\n")
            code, doc = _interpret(store, cfg)
            assert (code, doc["status"], doc["round"]) == (10, "RETRY_PENDING", 1), doc
            n = len(p.calls)
            code, doc = _interpret(store, cfg)
            assert (code, doc["reason"]) == (11, "not_due") and len(p.calls) == n
            for expected in (10, 12):
                time.sleep(1.6)  # past the due time (a real, small delay)
                code, doc = _interpret(store, cfg)
                assert code == expected, doc
            assert doc["reason"] == "rounds_exhausted" and doc["round"] == 3
            assert _interpret(store, cfg)[0] == 12
            r = run_viano("unblock", "BUG-20", "--store", store, "--by", "qa")
            assert r.returncode == 0, r.stderr
        finally:
            p.stop()
        up = start_provider(tmp_path, answers)
        try:
            code, doc = _interpret(store, _config(tmp_path, up.port,
                                                  extra="[retry]\nmax_rounds = 3\n"))
            assert (code, doc["status"]) == (0, "COMPLETED"), doc
        finally:
            up.stop()
        status = json.loads(run_viano("status", "--json", "--store", store).stdout)[0]
        assert status["status"] == "COMPLETED" and status["reason"] == "awaiting_confirmation"
        assert run_viano("verify", "--store", store).returncode == 0


POINTS = ["phase.entered", "phase.answered", "phase.recorded", "phase.judged",
          "txn.before_commit:2", "txn.after_commit:3", "blob.write"]


@pytest.mark.slow
class TestSigkill:
    @pytest.mark.parametrize("point", POINTS)
    def test_killed_at_a_step_then_resumed(self, tmp_path: Path, provider: Provider,
                                           point: str) -> None:
        """`viano interpret` dies (os._exit, no cleanup) at a named step; the next one
        finishes with exactly one accepted interpretation, `viano verify` is clean, and no
        model call came after a checkpointed answer."""
        store = tmp_path / "s"
        _intake(store)
        cfg = _config(tmp_path, provider.port)
        r = run_viano("interpret", "BUG-20", "--store", store, "--config", cfg,
                      env=_env(VIANO_CRASH_AT=point))
        crashed = r.returncode == 137
        calls_before = len(provider.calls)
        show = json.loads(run_viano("show", "BUG-20", "--json", "--store", store).stdout)
        checkpointed = any(p.endswith(".answer.json") for p in show["files"])
        code, doc = _interpret(store, cfg)
        assert code == 0 and doc["status"] == "COMPLETED", doc
        if checkpointed:
            assert len(provider.calls) == calls_before
        show = json.loads(run_viano("show", "BUG-20", "--json", "--store", store).stdout)
        assert sum(p.endswith("/interpretation.json") for p in show["files"]) == 1
        v = run_viano("verify", "--json", "--store", store)
        assert v.returncode == 0, v.stdout
        assert crashed or point == "blob.write"  # (only large blobs hit blob.write)

    def test_sigkill_mid_call_then_resumed(self, tmp_path: Path, answers: Path) -> None:
        """SIGKILL while the model is being asked (the provider answers slowly): the next
        dispatch asks again, and the round record counts the repeat."""
        slow = start_provider(tmp_path, answers, delay_ms=60_000)
        store = tmp_path / "s"
        _intake(store)
        try:
            proc = subprocess.Popen(
                [*VIANO, "interpret",
                 "BUG-20", "--store", str(store), "--config", str(_config(tmp_path,
                                                                            slow.port))],
                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not slow.calls:
                if proc.poll() is not None:
                    raise AssertionError("interpret ended before asking")
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            slow.stop()
        fast = start_provider(tmp_path, answers)
        try:
            code, doc = _interpret(store, _config(tmp_path, fast.port))
        finally:
            fast.stop()
        assert code == 0, doc
        record = json.loads(run_viano(
            "cat", "BUG-20", "analysis/interpretation/0001/rounds/0001-0001.answer.json",
            "--store", store).stdout)
        assert record["calls_started"] == 2
        assert run_viano("verify", "--store", store).returncode == 0


class TestTwoProcesses:
    def test_one_proceeds_the_other_is_deferred(self, tmp_path: Path,
                                                provider: Provider) -> None:
        """Process A is paused inside its dispatch (holding the case); process B gets
        DEFERRED locked (exit 11) at once; A then finishes; one accepted interpretation."""
        store = tmp_path / "s"
        _intake(store)
        cfg = _config(tmp_path, provider.port)
        argv = [*VIANO, "interpret", "BUG-20", "--json", "--store", str(store), "--config",
                str(cfg)]
        with paused_child(argv, "phase.entered", tmp_path / "paused", env=_env) as a:
            code, doc = _interpret(store, cfg)
            assert (code, doc["status"], doc["reason"]) == (11, "DEFERRED", "locked"), doc
            out, err = a.resume(timeout=120)
        assert a.returncode == 0, err
        assert json.loads(out)["status"] == "COMPLETED"
        assert len(provider.calls) == 1
        show = json.loads(run_viano("show", "BUG-20", "--json", "--store", store).stdout)
        assert sum(p.endswith("/interpretation.json") for p in show["files"]) == 1


class TestTheKeyGoesNowhere:
    def test_an_echoed_key_across_a_whole_phase(self, tmp_path: Path, answers: Path) -> None:
        """The first provider echoes the key in its 401s (and fails over), the second is
        down twice (retries) and then answers; with --log-json on: the key's bytes are in no
        file of the store (SQLite, WAL, blobs), no log, no output and no export."""
        echo = start_provider(tmp_path, answers, mode="401")
        flaky = start_provider(tmp_path, answers, script="503,503")
        store = tmp_path / "s"
        _intake(store)
        cfg = _config(tmp_path, 0, providers=f"""
[[providers]]
name = "echo"
kind = "openai"
base_url = "http://127.0.0.1:{echo.port}/v1?api_key={KEY}"
model = "m"
api_key_env = "VIANO_CLI_KEY"
retries = 0

[[providers]]
name = "flaky"
kind = "anthropic"
base_url = "http://127.0.0.1:{flaky.port}"
model = "m"
api_key_env = "VIANO_CLI_KEY"
retries = 2
""", extra="[gateway]\nbackoff_base_s = 0.01\nbackoff_max_s = 0.02\n")
        log = tmp_path / "events.jsonl"
        try:
            r = run_viano("interpret", "BUG-20", "--store", store, "--config", cfg,
                          "--log-json", log, env=_env())
            assert r.returncode == 0, r.stdout + r.stderr
            exported = tmp_path / "case.zip"
            assert run_viano("export", "BUG-20", exported, "--store", store).returncode == 0
        finally:
            echo.stop()
            flaky.stop()
        assert len(echo.calls) == 1 and len(flaky.calls) == 3
        haystack = [r.stdout.encode(), r.stderr.encode(), log.read_bytes(),
                    exported.read_bytes()]
        haystack += [p.read_bytes() for p in store.rglob("*") if p.is_file()]
        for blob in haystack:
            assert KEY.encode() not in blob
        record = run_viano("cat", "BUG-20",
                           "analysis/interpretation/0001/rounds/0001-0001.answer.json",
                           "--store", store).stdout
        attempts = json.loads(record)["attempts"]
        assert [(a["provider"], a["status"]) for a in attempts] == [
            ("echo", 401), ("flaky", 503), ("flaky", 503), ("flaky", 200)]
        assert "[REDACTED]" in attempts[0]["response_body"]
