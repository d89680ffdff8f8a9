"""``viano run``, ``viano batch`` and ``viano daemon`` as real processes against a loopback
provider in its own process: SIGTERM mid-batch (exit 0) and a restart that finishes every
case with exactly one batch, a case taken in while the daemon runs, Ctrl-C and resume, two
batches on one store at once, and the JSON summary."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import sqlite3
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import trio

from actors import open_store
from engine import Attachment, IntakeLimits, prepare_intake
from tests.batch_helpers import write_generic_answers
from tests.conftest import PYTHON, REPO, VIANO, child_env, run_viano
from tests.loopback import dead_port
from tests.loopback.process import Provider
from tests.store_helpers import open_ro

KEY = "sk-VIANO-BATCH-5e4d3c2b1a09f8e7"
pytestmark = pytest.mark.slow


@pytest.fixture
def answers(tmp_path: Path) -> Path:
    return write_generic_answers(tmp_path / "answers")


@pytest.fixture
def slow_provider(tmp_path: Path, answers: Path) -> Iterator[Provider]:
    """Every answer takes 150 ms: there is always a call in flight to interrupt."""
    p = Provider(tmp_path, answers, delay_ms=150)
    yield p
    p.stop()


def _config(tmp: Path, port: int, *, auto_confirm: bool = True) -> Path:
    cfg = tmp / "viano.toml"
    cfg.write_text(f"""
[interpretation]
auto_confirm = {'true' if auto_confirm else 'false'}

[[providers]]
name = "loopback"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "m"
api_key_env = "VIANO_BATCH_KEY"
retries = 0
timeout_s = 30
""")
    return cfg


def _env(cfg: Path) -> dict[str, str]:
    return child_env(VIANO_CONFIG=str(cfg), VIANO_BATCH_KEY=KEY)


async def _intake(store: Path, tmp: Path, ids: list[str]) -> None:
    async with open_store(store) as handle:
        for case_id in ids:
            report = tmp / f"{case_id}.txt"
            report.write_text(f"Crash in {case_id}\nIt crashes on start.\n")
            await handle.intake(prepare_intake(report, [], case_id=case_id,
                                               limits=IntakeLimits()))


_CHILDREN: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_orphans() -> Iterator[None]:
    """A test that fails midway leaves no daemon running after it."""
    yield
    while _CHILDREN:
        proc = _CHILDREN.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


class _Process:
    """A ``viano`` child whose stdout and stderr lines arrive on queues (read by threads,
    so a test waits on lines, never on the clock)."""

    def __init__(self, *args: str | Path, env: dict[str, str],
                 stdout: IO[str] | int = subprocess.PIPE,
                 stderr: IO[str] | int = subprocess.PIPE):
        self.proc = subprocess.Popen(
            [*VIANO,
             *[str(a) for a in args]], stdout=stdout, stderr=stderr,
            text=True, env=env, cwd=REPO)
        _CHILDREN.append(self.proc)
        self.queues: dict[str, queue.Queue[str | None]] = {"out": queue.Queue(),
                                                            "err": queue.Queue()}
        self.seen: list[str] = []
        self.errors: list[str] = []
        for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            if pipe is None:  # it went elsewhere: nothing to read on it
                self.queues[name].put(None)
        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            if stream is not None:
                threading.Thread(target=self._pump, args=(stream, self.queues[name]),
                                 daemon=True).start()

    @staticmethod
    def _pump(stream: IO[str], into: queue.Queue[str | None]) -> None:
        for line in stream:
            into.put(line.rstrip("\n"))
        into.put(None)

    def next_line(self, stream: str = "out", timeout: float = 60) -> str | None:
        line = self.queues[stream].get(timeout=timeout)
        if line is not None:
            (self.seen if stream == "out" else self.errors).append(line)
        return line

    def until(self, predicate: Any, stream: str = "out", timeout: float = 120) -> None:
        """Read lines until ``predicate(lines_so_far)`` holds (each line at most
        ``timeout`` seconds after the one before)."""
        lines = self.seen if stream == "out" else self.errors
        while not predicate(lines):
            if self.next_line(stream, timeout) is None:
                raise AssertionError(f"the process ended first: {lines[-5:]}, "
                                     f"{self.finish()[1][-2000:]}")

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        rc = self.proc.wait(timeout=timeout)
        for stream in ("out", "err"):
            while self.next_line(stream, timeout) is not None:
                pass
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return rc, "\n".join(self.errors)


def _completed(lines: list[str]) -> set[str]:
    return {line.split()[0] for line in lines
            if " COMPLETED completed (phase GENERATING_HYPOTHESES" in line}


def _completed_in(store: Path) -> set[str]:
    """The cases whose durable status is COMPLETED in the hypotheses phase (a case whose
    commit finished as the daemon stopped is done even if its line was never printed)."""
    check = open_ro(store)
    try:
        return {ref.case_id for ref in check.list_cases()
                if ref.status is not None and ref.status.status == "COMPLETED"
                and ref.status.phase == "GENERATING_HYPOTHESES"}
    finally:
        check.close()


def _one_batch_each(store: Path, ids: list[str]) -> None:
    check = open_ro(store)
    try:
        for case_id in ids:
            files = check.head(case_id)[1].files
            assert sum(p.endswith("/hypotheses.json") for p in files) == 1, case_id
            assert sum(p.endswith("/registry.json") for p in files) == 1, case_id
    finally:
        check.close()
    r = run_viano("verify", "--store", store)
    assert r.returncode == 0, r.stdout + r.stderr


class TestDaemon:
    async def test_sigterm_mid_batch_then_a_restart_finishes_everything(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """SIGTERM while calls are in flight: exit 0 promptly, committed state kept. The
        restarted daemon finishes every case, with exactly one accepted batch each, and
        picks up a case taken in while it runs."""
        store = tmp_path / "s"
        ids = [f"D-{i}" for i in range(6)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow_provider.port))
        first = _Process("daemon", "--store", store, "--concurrency", "2", "--poll-s", "0.2",
                         env=env)
        first.until(lambda seen: len(seen) >= 1)   # a result: the daemon is mid-batch
        first.proc.send_signal(signal.SIGTERM)
        rc, err = first.finish(timeout=30)
        assert rc == 0, err
        assert "viano daemon stopped" in err

        second = _Process("daemon", "--store", store, "--concurrency", "3", "--poll-s",
                          "0.2", "--log-json", "-", env=env)
        remaining = set(ids) - _completed_in(store)
        assert remaining  # it really was stopped mid-batch
        second.until(lambda seen: _completed(seen) >= remaining)
        report = tmp_path / "late.txt"
        report.write_text("Late crash\nIt crashes too.\n")
        r = run_viano("intake", "--store", store, "--report", report, "--case-id", "D-LATE",
                      env=env)
        assert r.returncode == 0, r.stderr
        second.until(lambda seen: "D-LATE" in _completed(seen))
        second.proc.send_signal(signal.SIGTERM)
        rc, err = second.finish(timeout=30)
        assert rc == 0, err
        events = [json.loads(x) for x in second.errors if x.startswith("{")]
        kinds = Counter(e["event"] for e in events)
        assert kinds["step"] > 0 and kinds["result"] > 0, kinds  # every transition, logged
        rounds = [e for e in events if e.get("step") == "round"]
        assert rounds and all(e["provider"] == "loopback" and e["attempts"] for e in rounds)
        last = [e for e in events if e["event"] == "providers"][-1]
        providers = last["providers"]
        assert providers["loopback"]["answers"] > 0
        # ... and the cases by phase and status, as `viano status --summary` gives them.
        summary = json.loads(run_viano("status", "--summary", "--json", "--store", store,
                                       env=env).stdout)
        assert last["by_phase_and_status"] == summary["by_phase_and_status"]
        assert last["cases"] == summary["cases"] == len(ids) + 1
        _one_batch_each(store, [*ids, "D-LATE"])
        hyp_calls = Counter(c["case_id"] for c in slow_provider.calls
                            if c["prompt_id"] == "hypotheses_v1")
        # at most one repeat per case: a call cancelled by SIGTERM before its checkpoint
        assert all(n <= 2 for n in hyp_calls.values()), hyp_calls


class TestBatch:
    async def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """SIGINT after the first result: exit 130 with a JSON summary that says so; the
        same command again finishes the rest (what was done is skipped because the store
        says it is done)."""
        store = tmp_path / "s"
        ids = [f"B-{i}" for i in range(6)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow_provider.port))
        first = _Process("batch", "--store", store, "--all", "--concurrency", "2", env=env)
        # plain lines on a pipe: one per result, then the summary
        first.until(lambda seen: len(seen) >= 1)
        first.proc.send_signal(signal.SIGINT)
        rc, _err = first.finish(timeout=30)
        assert rc == 130, first.seen
        assert "interrupted: run the same command to resume" in first.seen[-1]
        # The cases stopped with no result are named, not left out of "N cases".
        named = [x for x in first.seen if "stopped before a result" in x]
        assert len(named) == 1, first.seen
        stopped = named[0].split(": ", 1)[1].split(", ")
        assert stopped and set(stopped) <= set(ids), named
        assert not any(x.startswith(tuple(f"{c} " for c in stopped)) for x in first.seen)

        calls_before = len(slow_provider.calls)
        again = run_viano("batch", "--store", store, "--all", "--concurrency", "3", "--json",
                          env=env)
        assert again.returncode == 0, again.stderr
        doc = json.loads(again.stdout)
        assert doc["summary"]["interrupted"] is False
        assert {r["case_id"] for r in doc["results"]} <= set(ids)
        assert all(r["status"] == "COMPLETED" for r in doc["results"])
        store_stats = doc["summary"]["store"]
        assert store_stats["publications"] > 0 and store_stats["transactions"] > 0
        _one_batch_each(store, ids)
        assert len(slow_provider.calls) > calls_before
        done = run_viano("batch", "--store", store, "--all", "--json", env=env)
        assert done.returncode == 0 and json.loads(done.stdout)["summary"]["cases"] == 0

    async def test_interrupted_under_json_still_prints_one_document(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        store = tmp_path / "s"
        await _intake(store, tmp_path, [f"J-{i}" for i in range(4)])
        env = _env(_config(tmp_path, slow_provider.port))
        proc = _Process("batch", "--store", store, "--all", "--concurrency", "1", "--json",
                        "--log-json", "-", env=env)
        proc.until(lambda lines: any('"step": "enter"' in x for x in lines), stream="err")
        proc.proc.send_signal(signal.SIGINT)
        rc, _err = proc.finish(timeout=30)
        assert rc == 130
        doc = json.loads("\n".join(proc.seen))
        assert doc["summary"]["interrupted"] is True
        stopped = doc["summary"]["interrupted_cases"]
        assert stopped and set(stopped) <= {f"J-{i}" for i in range(4)}, doc["summary"]
        assert not set(stopped) & {r["case_id"] for r in doc["results"]}

    async def test_two_batches_on_one_store_at_once(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """No case is dispatched by both at the same time (one model call per case and
        phase) and none gets two batches."""
        store = tmp_path / "s"
        ids = [f"T-{i}" for i in range(8)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow_provider.port))
        a = _Process("batch", "--store", store, "--all", "--concurrency", "3", "--json",
                     env=env)
        b = _Process("batch", "--store", store, "--all", "--concurrency", "3", "--json",
                     env=env)
        (ra, _), (rb, _) = a.finish(timeout=120), b.finish(timeout=120)
        assert (ra, rb) == (0, 0), (a.seen[-3:], b.seen[-3:])
        _one_batch_each(store, ids)
        calls = Counter((c["case_id"], c["prompt_id"]) for c in slow_provider.calls)
        assert set(calls.values()) == {1}, calls
        assert len(calls) == 2 * len(ids)

    async def test_run_is_one_pass_and_waits_for_nobody(
            self, tmp_path: Path, answers: Path) -> None:
        """`viano run` without auto_confirm: each case's interpretation, then it waits for
        a person (exit 0, the results say awaiting_confirmation)."""
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            await _intake(store, tmp_path, ["R-1", "R-2"])
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            r = run_viano("run", "--store", store, "R-1", "R-2", "--json", env=env)
        finally:
            provider.stop()
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert {(x["case_id"], x["reason"]) for x in doc["results"]} == {
            ("R-1", "awaiting_confirmation"), ("R-2", "awaiting_confirmation")}
        unknown = run_viano("run", "--store", store, "NOPE", env=env)
        assert unknown.returncode == 2 and "unknown_case" in unknown.stderr


def _damage_catalogue(store: Path, case: str) -> int:
    """Overwrite the bytes of ``case``'s catalogue blob (same size) in the SQLite store;
    the head's generation."""
    shown = json.loads(run_viano("show", "--store", store, case, "--json").stdout)
    sha = bytes.fromhex(shown["files"]["case/catalogue.json"]["sha256"])
    with contextlib.closing(sqlite3.connect(store / "store.sqlite3")) as db, db:
        damaged = db.execute("UPDATE blob_rows SET data = zeroblob(size) WHERE sha256 = ?",
                             (sha,)).rowcount
    assert damaged == 1
    return int(shown["package_generation"])


class TestWhatToDoNext:
    """A multi-case command's summary says what to do about the results that need a
    person, as `viano interpret` does for one case: per reason code, its cases and the
    step. It said only the counts ("BLOCKED 2000")."""

    async def test_cases_awaiting_a_person_are_named_with_the_step(
            self, tmp_path: Path, answers: Path) -> None:
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            await _intake(store, tmp_path, ["R-1", "R-2"])
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            both = run_viano("run", "--store", store, "R-1", "R-2", env=env)
            one = run_viano("run", "--store", store, "R-2", env=env)
        finally:
            provider.stop()
        assert both.returncode == 0 and one.returncode == 0, both.stderr + one.stderr
        assert ("what to do about awaiting_confirmation (2 case(s): R-1, R-2): read it "
                "('viano report <case>'), then 'viano confirm <case>'") in both.stdout
        assert ("what to do about awaiting_confirmation (1 case(s): R-2): read it ('viano "
                "report R-2'), then 'viano confirm R-2'") in one.stdout
        # ... and the steps it names work as written.
        assert run_viano("report", "--store", store, "R-2", env=env).returncode == 0
        confirmed = run_viano("confirm", "--store", store, "R-2", env=env)
        assert confirmed.returncode == 0, confirmed.stderr

    async def test_a_misconfigured_provider_names_the_command_that_takes_it_up(
            self, tmp_path: Path, answers: Path) -> None:
        """An ERROR case: the step names `viano batch <case>`, because `--all` (and the
        daemon) never take an ERROR case up again; and that command does."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["P-1"])
        bad = Provider(tmp_path, answers, mode="401")
        try:
            env = _env(_config(tmp_path, bad.port))
            first = run_viano("batch", "--store", store, "--all", env=env)
        finally:
            bad.stop()
        assert first.returncode == 13, first.stderr
        assert ("what to do about provider_configuration (1 case(s): P-1): fix the provider "
                "configuration (keys, base_url, model), then 'viano batch P-1'") in first.stdout
        good = Provider(tmp_path, answers)
        try:
            env = _env(_config(tmp_path, good.port))
            again_all = run_viano("batch", "--store", store, "--all", "--json", env=env)
            by_id = run_viano("batch", "--store", store, "P-1", "--json", env=env)
        finally:
            good.stop()
        assert json.loads(again_all.stdout)["results"] == []
        assert [r["status"] for r in json.loads(by_id.stdout)["results"]] == ["COMPLETED"]

    async def test_hypotheses_before_an_interpretation_say_the_way_there(
            self, tmp_path: Path, answers: Path) -> None:
        """`viano hypothesize` right after intake: the step names interpret, report and
        confirm, and following it to the letter ends with the hypotheses built."""
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            await _intake(store, tmp_path, ["H-1"])
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            early = run_viano("hypothesize", "--store", store, "H-1", env=env)
            assert early.returncode == 13, early.stderr
            assert ("what to do: without an interpretation yet, 'viano interpret H-1' first; "
                    "then read it ('viano report H-1') and 'viano confirm H-1'") in early.stdout
            for step in (["interpret"], ["report"], ["confirm"], ["hypothesize"]):
                r = run_viano(*step, "--store", store, "H-1", env=env)
                assert r.returncode == 0, (step, r.stdout, r.stderr)
        finally:
            provider.stop()
        assert "H-1: COMPLETED" in r.stdout, r.stdout

    async def test_a_limit_passed_is_raised_and_the_case_taken_up_by_id(
            self, tmp_path: Path, answers: Path) -> None:
        """limit_exceeded: the message under --json names the limit, and once it is
        raised (nothing was pinned yet), `viano batch <case>` finishes the case."""
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            await _intake(store, tmp_path, ["L-1"])
            cfg = _config(tmp_path, provider.port)
            good = cfg.read_text()
            cfg.write_text(good + "\n[interpretation.limits]\nmax_context_bytes = 200\n")
            env = _env(cfg)
            first = run_viano("batch", "--store", store, "--all", env=env)
            assert first.returncode == 13, first.stderr
            assert ("what to do about limit_exceeded (1 case(s): L-1): raise the limit it "
                    "passed") in first.stdout
            shown = json.loads(run_viano("batch", "--store", store, "L-1", "--json",
                                         env=env).stdout)
            assert "max_context_bytes=200" in shown["results"][0]["message"]
            cfg.write_text(good)
            again = run_viano("batch", "--store", store, "L-1", "--json", env=env)
        finally:
            provider.stop()
        assert [r["status"] for r in json.loads(again.stdout)["results"]] == ["COMPLETED"]

    async def test_no_human_source_grounded_is_reopened_and_interpreted_anew(
            self, tmp_path: Path, answers: Path) -> None:
        """missing_observations: an interpretation whose grounded statements cite only an
        attachment. The step names report and reopen (its message once asked for
        observations added to the case, whose originals never change), and following it
        with a provider that grounds the report ends with the hypotheses built."""
        store = tmp_path / "s"
        report, log = tmp_path / "M-1.txt", tmp_path / "run.log"
        report.write_text("Crash in M-1\nIt crashes on start.\n")
        log.write_text("ERROR at start\n")
        async with open_store(store) as handle:
            await handle.intake(prepare_intake(report, [Attachment("attachment", log)],
                                               case_id="M-1", limits=IntakeLimits()))
        only_log = write_generic_answers(tmp_path / "only-log")
        interpretation = only_log / "interpretation_v1.json"
        interpretation.write_text(interpretation.read_text().replace('"S1"', '"S2"'))
        first = Provider(tmp_path, only_log)
        try:
            env = _env(_config(tmp_path, first.port))
            r = run_viano("batch", "--store", store, "M-1", env=env)
        finally:
            first.stop()
        assert r.returncode == 13 and "M-1 ERROR missing_observations" in r.stdout, r.stdout
        assert ("what to do about missing_observations (1 case(s): M-1): read it ('viano "
                "report M-1'): 'viano reopen M-1 --reason TEXT' has it interpreted anew") \
            in r.stdout
        good = Provider(tmp_path, answers)
        try:
            env = _env(_config(tmp_path, good.port))
            assert run_viano("report", "--store", store, "M-1", env=env).returncode == 0
            reopened = run_viano("reopen", "--store", store, "M-1", "--reason",
                                 "ground it in the report", env=env)
            assert reopened.returncode == 0, reopened.stderr
            again = run_viano("batch", "--store", store, "M-1", "--json", env=env)
        finally:
            good.stop()
        [result] = json.loads(again.stdout)["results"]
        assert (result["status"], result["analysis_revision"]) == ("COMPLETED", 2), result

    async def test_a_damaged_blob_is_named_as_the_store_s_damage(
            self, tmp_path: Path, answers: Path) -> None:
        """A case whose catalogue blob was overwritten: its result names ``store_corrupt``
        and the step ``viano verify``, in a batch and in ``viano interpret``; it was
        ``unsupported_history``, a history this version did not write, which sent the
        reader to look for another version of Viano. The other case completes."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["D-1", "D-2"])
        _damage_catalogue(store, "D-1")
        provider = Provider(tmp_path, answers)
        try:
            env = _env(_config(tmp_path, provider.port))
            batch = run_viano("batch", "--store", store, "--all", env=env)
            one = run_viano("interpret", "--store", store, "D-1", env=env)
        finally:
            provider.stop()
        assert batch.returncode == 13, batch.stderr
        assert "D-1 ERROR store_corrupt" in batch.stdout, batch.stdout
        assert "D-2 COMPLETED" in batch.stdout, batch.stdout
        assert ("what to do about store_corrupt (1 case(s): D-1): 'viano verify D-1' names "
                "what is damaged") in batch.stdout
        assert one.returncode == 13 and "D-1: ERROR (store_corrupt)" in one.stdout, one.stdout
        assert "what to do: 'viano verify D-1' names what is damaged" in one.stdout
        verify = run_viano("verify", "--store", store, "D-1")
        assert verify.returncode == 1 and "is damaged" in verify.stdout, verify.stdout

    async def test_a_damaged_case_under_a_confirmed_interpretation_is_the_store_s_damage(
            self, tmp_path: Path, answers: Path) -> None:
        """The case's catalogue damaged after its interpretation was confirmed: the builder
        cannot read the case to verify the interpretation against, which said
        ``interpretation_mismatch`` (and a reopen, which cannot help). It is the store's
        damage: ``store_corrupt``."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["E-1"])
        provider = Provider(tmp_path, answers)
        try:
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            assert run_viano("interpret", "--store", store, "E-1", env=env).returncode == 0
            assert run_viano("confirm", "--store", store, "E-1", env=env).returncode == 0
            _damage_catalogue(store, "E-1")
            r = run_viano("hypothesize", "--store", store, "E-1", env=env)
        finally:
            provider.stop()
        assert r.returncode == 13 and "E-1: ERROR (store_corrupt)" in r.stdout, r.stdout
        assert [c["prompt_id"] for c in provider.calls] == ["interpretation_v1"]

    async def test_confirming_a_damaged_case_is_the_store_s_damage(
            self, tmp_path: Path, answers: Path) -> None:
        """`viano confirm` of an interpretation whose case cannot be read: store_corrupt
        (it said interpretation_mismatch, as the builder did)."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["F-1"])
        provider = Provider(tmp_path, answers)
        try:
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            assert run_viano("interpret", "--store", store, "F-1", env=env).returncode == 0
        finally:
            provider.stop()
        generation = _damage_catalogue(store, "F-1")
        r = run_viano("confirm", "--store", store, "F-1", env=env)
        assert r.returncode != 0 and "error[store_corrupt]" in r.stderr, r.stderr
        after = json.loads(run_viano("show", "--store", store, "F-1", "--json").stdout)
        assert after["package_generation"] == generation

    async def test_an_unreachable_provider(self, tmp_path: Path) -> None:
        """Every case pending on a provider that refuses connections: one line for the
        reason, and no line for a reason that needs nothing (the JSON is unchanged)."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["U-1", "U-2", "U-3"])
        env = _env(_config(tmp_path, dead_port()))
        r = run_viano("batch", "--store", store, "--all", env=env)
        assert r.returncode == 10, r.stderr
        steps = [line for line in r.stdout.splitlines() if line.startswith("what to do")]
        assert steps == ["what to do about providers_unavailable (3 case(s): U-1, U-2, "
                         "U-3): nothing to fix if the outage is temporary: run again after "
                         "the due time, or let 'viano batch --wait' or 'viano daemon' do "
                         "it"], r.stdout
        doc = json.loads(run_viano("batch", "--store", store, "--all", "--json",
                                   env=env).stdout)
        assert set(doc) == {"summary", "results"}

    async def test_the_daemon_says_it_under_its_result_line(
            self, tmp_path: Path, answers: Path) -> None:
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            await _intake(store, tmp_path, ["W-1"])
            env = _env(_config(tmp_path, provider.port, auto_confirm=False))
            daemon = _Process("daemon", "--store", store, "--poll-s", "0.2", env=env)
            daemon.until(lambda seen: any(x.startswith("  what to do") for x in seen))
            daemon.proc.send_signal(signal.SIGTERM)
            rc, err = daemon.finish(timeout=30)
        finally:
            provider.stop()
        assert rc == 0, err
        at = next(i for i, x in enumerate(daemon.seen) if x.startswith("W-1 COMPLETED"))
        assert daemon.seen[at + 1] == (
            "  what to do: read it ('viano report W-1'), then 'viano confirm W-1'")

class TestTheReaderGoesAway:
    """``viano batch | head -1``: the lines were a report of the work, not the work. It
    went on to the end (the same exit as with a reader), where it used to stop at the
    first line it could not write and exit 0 with most cases untouched."""

    def test_batch_finishes_every_case(self, tmp_path: Path, answers: Path) -> None:
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            ids = [f"P-{i}" for i in range(12)]
            trio.run(_intake, store, tmp_path, ids)
            child = subprocess.Popen([*VIANO, "batch", "--all", "--concurrency", "2",
                                      "--store", str(store)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=_env(_config(tmp_path, provider.port)), cwd=REPO)
            _CHILDREN.append(child)
            assert child.stdout is not None and child.stderr is not None
            first = child.stdout.readline()
            child.stdout.close()  # as head -1 does
            rc = child.wait(timeout=120)
            err = child.stderr.read()
            child.stderr.close()
        finally:
            provider.stop()
        assert " COMPLETED " in first, first
        assert rc == 0, err
        assert "Traceback" not in err and "internal_error" not in err, err
        assert _completed_in(store) == set(ids)
        _one_batch_each(store, ids)

    @pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
    @pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
    def test_a_full_stdout_finishes_every_case_and_fails(
            self, tmp_path: Path, answers: Path, json_flag: list[str]) -> None:
        """``viano batch > /dev/full``: the batch stopped at its first line, most cases
        untouched. Now it goes on to the end, says once on stderr that its lines are
        lost, and exits 1 (output_unwritable): the report is lost, the work is not."""
        provider = Provider(tmp_path, answers)
        try:
            store = tmp_path / "s"
            ids = [f"F-{i}" for i in range(12)]
            trio.run(_intake, store, tmp_path, ids)
            with open("/dev/full", "w") as full:
                r = subprocess.run([*VIANO, *json_flag, "batch", "--all", "--concurrency",
                                    "2", "--store", str(store)], stdout=full,
                                   stderr=subprocess.PIPE, text=True, timeout=120,
                                   env=_env(_config(tmp_path, provider.port)), cwd=REPO,
                                   check=False)
        finally:
            provider.stop()
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("error[output_unwritable]") == 1, r.stderr
        assert "Traceback" not in r.stderr and "internal_error" not in r.stderr, r.stderr
        assert _completed_in(store) == set(ids)
        _one_batch_each(store, ids)
        assert run_viano("verify", "--store", store).returncode == 0


# SIGTERM just before the command takes the signals over (while the engine starts): the
# child sends it to itself as _stoppable is entered, the moment it used to be fatal.
EARLY_SIGTERM = """
import os, signal, sys
import viano_bug_analysis.cli._batch_commands as commands
real = commands.stoppable
def early(**kw):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(**kw)
commands.stoppable = early
from viano_main import run
run()
"""


@pytest.mark.parametrize(("command", "code"), [("batch", 130), ("daemon", 0)])
def test_sigterm_before_the_signals_are_taken_over(
        tmp_path: Path, answers: Path, command: str, code: int) -> None:
    """Reported as the interruption it is, in one JSON document, never a silent death
    (exit 143, nothing on stdout)."""
    provider = Provider(tmp_path, answers)
    try:
        store = tmp_path / "s"
        trio.run(_intake, store, tmp_path, ["T-1"])
        args = ["--all"] if command == "batch" else []
        r = subprocess.run([PYTHON, "-c", EARLY_SIGTERM, "--json", command, *args,
                            "--store", str(store)], capture_output=True, text=True,
                           env=_env(_config(tmp_path, provider.port)), cwd=REPO,
                           timeout=120, check=False)
    finally:
        provider.stop()
    assert r.returncode == code, r.stderr
    doc = json.loads(r.stdout)  # exactly one document
    if command == "batch":
        assert doc["error"]["reason"] == "interrupted", doc
    else:
        assert doc["summary"]["stopped_before_start"] is True, doc
    assert "Traceback" not in r.stderr
    assert run_viano("verify", "--store", store).returncode == 0


class TestHeldElsewhere:
    async def test_a_case_held_by_another_process_is_reported_once_while_it_waits(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """viano batch tries a case another process holds again every 0.2 s until it is
        released: it says DEFERRED once, not on every try, then the case's result."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["H-1"])
        holder = subprocess.Popen([PYTHON, "-c", (  # noqa: ASYNC220 - a child that holds
            "import sys\nfrom engine import open_backend\n"
            "store = open_backend(sys.argv[1], write=True)\n"
            "with store.lease('H-1'):\n    print('locked', flush=True)\n"
            "    sys.stdin.read()\n"), str(store)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=child_env())
        _CHILDREN.append(holder)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        batch = _Process("batch", "H-1", "--store", store, "--log-json", "-",
                         env=_env(_config(tmp_path, slow_provider.port)))
        # Tried at least three times (each try is a result event), then released.
        batch.until(lambda lines: sum('"event": "result"' in x and '"locked"' in x
                                      for x in lines) >= 3, stream="err")
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()
        rc, _err = batch.finish(timeout=60)
        assert rc == 0, _err
        lines = [x for x in batch.seen if x.startswith("H-1 ")]
        assert [x.split()[1] for x in lines] == ["DEFERRED", "COMPLETED"], lines


class TestInterrupts:
    async def test_ctrl_c_during_a_single_dispatch_under_json(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """Ctrl-C while `viano interpret --json` waits on the model: exit 130 and still one
        JSON document on stdout, with the reason and what to do."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["I-1"])
        env = _env(_config(tmp_path, slow_provider.port))
        proc = _Process("interpret", "--store", store, "I-1", "--json", "--log-json", "-",
                        env=env)
        proc.until(lambda lines: any('"step": "enter"' in x for x in lines), stream="err")
        proc.proc.send_signal(signal.SIGINT)
        rc, _err = proc.finish(timeout=30)
        assert rc == 130
        error = json.loads("\n".join(proc.seen))["error"]
        assert error["reason"] == "interrupted" and "again" in error["hint"]


class TestRefusedBeforeAnyWork:
    @pytest.mark.parametrize("args", [["batch", "--all"], ["batch", "X-1"], ["run", "--all"],
                                      ["daemon"]])
    def test_a_mistyped_store_is_not_created(self, tmp_path: Path, answers: Path,
                                             args: list[str]) -> None:
        env = _env(_config(tmp_path, 9))
        r = run_viano(*args, "--store", tmp_path / "typo", "--json", env=env)
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "no_store"
        assert not (tmp_path / "typo").exists()

    @pytest.mark.parametrize(("flag", "value"), [("--concurrency", "99999999999999999999"),
                                                 ("--concurrency", "20000"),
                                                 ("--poll-s", "0")])
    def test_bounds(self, tmp_path: Path, flag: str, value: str) -> None:
        store = tmp_path / "s"
        cmd = "daemon" if flag == "--poll-s" else "batch"
        extra = [] if cmd == "daemon" else ["--all"]
        r = run_viano(cmd, *extra, "--store", store, flag, value, "--json",
                      env=_env(_config(tmp_path, 9)))
        assert r.returncode == 2, r.stdout + r.stderr
        assert json.loads(r.stdout)["error"]["reason"] == "usage_error"


def _finished_one_and_another_is_calling(lines: list[str]) -> bool:
    """A case has its result, and since then another case has started a model call (it
    is in flight: the provider takes 150 ms). Waiting for the result alone raced: both
    first cases could finish before the next was dispatched, leaving none in flight."""
    finished: set[str] = set()
    calling: set[str] = set()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("event") == "result":
            finished.add(event.get("case_id", ""))
            calling.clear()
        elif event.get("event") == "step" and event.get("status") == "RUNNING" and finished:
            calling.add(event.get("case_id", ""))
    return bool(calling - finished)


def _results_in(lines: list[str]) -> set[str]:
    """The cases completed by a result event among ``lines`` (``--log-json -``)."""
    ids = set()
    for line in lines:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if (isinstance(event, dict) and event.get("event") == "result"
                    and event.get("status") == "COMPLETED"
                    and event.get("phase") == "GENERATING_HYPOTHESES"):
                ids.add(event["case_id"])
    return ids


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_daemon_whose_stdout_is_full_goes_on_and_fails_when_stopped(
        tmp_path: Path, answers: Path) -> None:
    """``viano daemon > /dev/full``: it stopped at its first line. Now it says so at once
    on stderr, finishes every case, and exits 1 (output_unwritable) when stopped."""
    provider = Provider(tmp_path, answers)
    try:
        store = tmp_path / "s"
        ids = [f"DF-{i}" for i in range(8)]
        trio.run(_intake, store, tmp_path, ids)
        with open("/dev/full", "w") as full:
            proc = _Process("daemon", "--store", store, "--concurrency", "2", "--log-json",
                            "-", env=_env(_config(tmp_path, provider.port)), stdout=full)
        proc.until(lambda lines: any("warning:" in x for x in lines), stream="err")
        proc.until(lambda lines: _results_in(lines) >= set(ids), stream="err")
        proc.proc.send_signal(signal.SIGTERM)
        rc, err = proc.finish(timeout=30)
    finally:
        provider.stop()
    assert rc == 1, err
    assert err.count("error[output_unwritable]") == 1, err
    assert "Traceback" not in err and "internal_error" not in err, err
    assert _completed_in(store) == set(ids)
    _one_batch_each(store, ids)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_daemon_whose_stderr_is_full_goes_on(tmp_path: Path, answers: Path) -> None:
    """``viano daemon 2>/dev/full`` (or ``>>log 2>&1`` on a full disk): its first note
    ended it with internal_error before any case ran. Notes are lost, the work is not."""
    provider = Provider(tmp_path, answers)
    try:
        store = tmp_path / "s"
        ids = [f"DE-{i}" for i in range(6)]
        trio.run(_intake, store, tmp_path, ids)
        with open("/dev/full", "w") as full:
            proc = _Process("daemon", "--store", store, "--concurrency", "2",
                            env=_env(_config(tmp_path, provider.port)), stderr=full)
        proc.until(lambda seen: _completed(seen) >= set(ids))
        proc.proc.send_signal(signal.SIGTERM)
        rc, _err = proc.finish(timeout=30)
    finally:
        provider.stop()
    assert rc == 0
    assert _completed_in(store) == set(ids)


class TestDaemonEndings:
    @pytest.mark.sqlite_only  # a store folder, removed under the daemon
    async def test_a_store_removed_under_the_daemon_stops_it(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """The store folder removed (and another store made in its place) while the daemon
        runs: it went on with the removed database, dispatching into files nobody could
        read again, never saw the new store's cases and exited 0. It stops now, saying
        store_replaced, and the new store is left as it was."""
        import shutil

        store = tmp_path / "s"
        await _intake(store, tmp_path, ["OLD-1"])
        env = _env(_config(tmp_path, slow_provider.port))
        proc = _Process("daemon", "--store", store, "--poll-s", "0.05", env=env)
        proc.until(lambda seen: "OLD-1" in _completed(seen))
        shutil.rmtree(store)
        await _intake(store, tmp_path, ["NEW-1"])
        rc, err = proc.finish(timeout=60)
        assert rc == 1, err
        assert "store_replaced" in err, err
        check = open_ro(store)
        try:
            [ref] = check.list_cases()
            assert (ref.case_id, ref.generation) == ("NEW-1", 1)
        finally:
            check.close()
    async def test_a_second_signal_during_shutdown_is_ignored_and_json_summarises(
            self, tmp_path: Path, slow_provider: Provider) -> None:
        """SIGTERM, then SIGINT and SIGTERM again at once: still exit 0, with --json one
        summary document (results by status, providers) and nothing else on stdout."""
        store = tmp_path / "s"
        await _intake(store, tmp_path, [f"S-{i}" for i in range(4)])
        proc = _Process("daemon", "--store", store, "--concurrency", "2", "--json",
                        "--log-json", "-", env=_env(_config(tmp_path, slow_provider.port)))
        proc.until(_finished_one_and_another_is_calling, stream="err")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
            proc.proc.send_signal(sig)
        rc, err = proc.finish(timeout=30)
        assert rc == 0, err
        doc = json.loads("\n".join(proc.seen))
        assert set(doc["summary"]) >= {"results_by_status", "providers", "store",
                                       "interrupted_in_flight"}
        assert doc["summary"]["providers"]["loopback"]["answers"] >= 2
        # Counted before the engine closes: the first case done, the others were in flight.
        assert doc["summary"]["interrupted_in_flight"] >= 1, doc["summary"]
        assert "event" not in doc["summary"]


@pytest.mark.no_store
@pytest.mark.parametrize("soft", [64, 100, 129])
def test_an_open_files_limit_too_low_for_any_concurrency_says_so(
        monkeypatch: pytest.MonkeyPatch, soft: int) -> None:
    """Under ``ulimit -n 100`` every --concurrency was refused as "at most -14", with the
    hint to lower it. The limit is what to raise."""
    import resource

    from engine import UsageError
    from viano_bug_analysis.cli import _batch_commands

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft, 4096))
    with pytest.raises(UsageError) as info:
        _batch_commands.check_concurrency(1)
    assert f"only {soft} files" in info.value.message and "-" not in info.value.message
    assert "ulimit -n" in info.value.hint
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (131, 4096))
    _batch_commands.check_concurrency(1)  # one case fits
