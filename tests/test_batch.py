"""Many cases at once through the supervisor: the embedding API (dispatch, submit and its
results channel, run_until_idle, the event stream, shutdown order and cancellation from the
host), and a batch of 500+ cases through the loopback server with a mix of faults, some of
them real bug reports from SWE-bench Lite."""

from __future__ import annotations

import csv
import functools
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import TrioClock
from engine import Attachment
from tests.batch_helpers import (
    batch_config,
    generic_server,
    intake_many,
    verified,
)
from tests.loopback import LoopbackServer, dead_port
from tests.phase_helpers import ENV, SAMPLE, http_provider
from tests.store_helpers import open_ro
from viano_bug_analysis import open_engine

pytestmark = pytest.mark.usefixtures("backend")

SWEBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "swebench-lite-issues.csv"


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv = generic_server()
    await nursery.start(srv.serve)
    return srv


class TestEmbeddingApi:
    async def test_dispatch_submit_results_events(self, tmp_path: Path,
                                                  server: LoopbackServer) -> None:
        """dispatch advances a case through every phase (auto_confirm); submit puts the
        result on the results channel; the event stream sees each step; run_until_idle
        takes every case with work now."""
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["A-1", "A-2", "A-3", "A-4"])
            events = engine.subscribe()
            one = await engine.dispatch("A-1")
            assert (one.result.status, one.result.phase) == ("COMPLETED",
                                                             "GENERATING_HYPOTHESES")
            assert engine.submit("A-2") and not engine.submit("A-2")  # joined, not twice
            got = await engine.results.receive()
            while got.case_id != "A-2":
                got = await engine.results.receive()
            assert got.result.status == "COMPLETED"
            rest = await engine.run_until_idle()
            assert sorted(r.case_id for r in rest) == ["A-3", "A-4"]
            assert await engine.run_until_idle() == []  # nothing left with work now
            seen = []
            while True:
                try:
                    seen.append(events.receive_nowait())
                except trio.WouldBlock:
                    break
            steps = {(e["case_id"], e.get("step")) for e in seen if e["event"] == "step"}
            assert ("A-1", "enter") in steps and ("A-1", "accept") in steps
            assert sum(e["event"] == "result" for e in seen) >= 8
        verified(tmp_path / "s")

    async def test_an_engine_reserves_document_room_for_its_concurrency(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """While an engine is open the phases' document cache has PER_CASE more room for
        each case it may run at once (a fixed bound made 512 in flight read every case's
        documents back from the store 17 times, not 3); closing it gives the room back."""
        from engine._phases import _view

        base = _view.DOCUMENTS.max_bytes
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               concurrency=300) as engine:
            assert _view.DOCUMENTS.max_bytes == base + 300 * _view._Documents.PER_CASE
            await intake_many(engine, tmp_path, ["R-1"])
            assert (await engine.dispatch("R-1")).result.status == "COMPLETED"
        assert _view.DOCUMENTS.max_bytes == base
        for bad in (float("inf"), 0, 2.5):  # refused before the store is created
            with pytest.raises(ValueError, match="concurrency"):
                async with open_engine(store=tmp_path / "new", config=config, environ=ENV,
                                       concurrency=bad):  # type: ignore[arg-type]
                    pass
            assert not (tmp_path / "new").exists()
        assert _view.DOCUMENTS.max_bytes == base

    async def test_an_engine_with_a_shard_takes_only_its_cases(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Two engines on one store, one per shard: each run_until_idle advances exactly
        its shard's cases, together all of them; serve's due index is the shard's too."""
        from viano_bug_analysis import Shard

        config = batch_config([http_provider("p", "openai", server.openai_url)])
        ids = [f"SH-{i}" for i in range(10)]
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               shard=Shard(0, 2)) as first:
            await intake_many(first, tmp_path, ids)
            mine = {c for c in ids if Shard(0, 2).holds(c)}
            assert 0 < len(mine) < len(ids)
            assert set(await first.waiting(100)) == mine
            assert {r.case_id for r in await first.run_until_idle()} == mine
            assert await first.run_until_idle() == []
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               shard=Shard.parse("2/2")) as second:
            assert {r.case_id for r in await second.run_until_idle()} == set(ids) - mine
        verified(tmp_path / "s")

    @pytest.mark.parametrize("bad", [123, None, b"A-1", ["A-1"], "BAD!", ""],
                             ids=["int", "none", "bytes", "list", "rule", "empty"])
    async def test_what_is_no_case_id_is_refused_at_once(
            self, tmp_path: Path, server: LoopbackServer, bad: Any) -> None:
        """dispatch(123) was an ERROR result with a number for its case id, and
        dispatch(["A-1"]) a TypeError from inside the engine; submit the same. Both refuse
        it as invalid_case_id before anything runs, and the engine goes on."""
        from engine import InvalidCaseId

        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["A-1"])
            with pytest.raises(InvalidCaseId):
                await engine.dispatch(bad)
            with pytest.raises(InvalidCaseId):
                engine.submit(bad)
            assert engine.in_flight == 0
            assert (await engine.dispatch("A-1")).result.status == "COMPLETED"

    async def test_without_auto_confirm_a_case_waits_for_a_person(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        config = batch_config([http_provider("p", "openai", server.openai_url)], auto_confirm=False)
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["W-1"])
            r = await engine.dispatch("W-1")
            assert (r.result.status, r.result.reason) == ("COMPLETED", "awaiting_confirmation")
            assert r.done and await engine.run_until_idle() == []

    async def test_cancelling_the_host_leaves_only_checkpointed_state(
            self, tmp_path: Path, nursery: trio.Nursery) -> None:
        """The host cancels its scope while cases are mid-flight (their model calls held at
        the server): nothing half-done is left; a second open_engine finishes every case
        with one batch each."""
        srv = generic_server()
        srv.default_mode = "held"
        await nursery.start(srv.serve)
        config = batch_config([http_provider("p", "openai", srv.openai_url)])
        ids = [f"C-{i}" for i in range(12)]
        with trio.CancelScope() as host:
            async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                                   concurrency=4) as engine:
                await intake_many(engine, tmp_path, ids)
                for case_id in ids:
                    engine.submit(case_id)
                while srv.held < 4:
                    await trio.testing.wait_all_tasks_blocked()
                host.cancel()
                await trio.sleep_forever()
        assert host.cancelled_caught
        verified(tmp_path / "s")
        srv.default_mode = "ok"
        srv.release.set()
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            results = await engine.run_until_idle()
        assert {r.result.status for r in results} == {"COMPLETED"}
        check = open_ro(tmp_path / "s")
        for case_id in ids:
            m = check.head(case_id)[1]
            assert sum(p.endswith("/hypotheses.json") for p in m.files) == 1, case_id
        check.close()
        verified(tmp_path / "s")

    async def test_the_readme_service_example(self, tmp_path: Path,
                                              server: LoopbackServer) -> None:
        """The README's trio-service example, run as written (in this test's own run)."""
        from tests.test_readme import _snippet

        code = _snippet("engine-service")
        namespace: dict[str, Any] = {}
        exec(compile(code, "README.md", "exec"), namespace)
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["R-1", "R-2"])
        lines: list[str] = []
        both = trio.Event()

        def emit(line: str) -> None:
            lines.append(line)
            if len(lines) == 2:
                both.set()

        async with trio.open_nursery() as host:  # the host's own nursery, cancelled by it
            host.start_soon(functools.partial(namespace["serve"], tmp_path / "s", config,
                                              emit, environ=ENV))
            with trio.fail_after(60):
                await both.wait()
            host.cancel_scope.cancel()
        assert sorted(lines) == ["R-1 COMPLETED completed", "R-2 COMPLETED completed"]


def _swebench(n: int) -> dict[str, str]:
    if not SWEBENCH.exists():
        return {}
    csv.field_size_limit(10**9)
    out = {}
    with SWEBENCH.open(newline="") as f:
        for row in csv.DictReader(f):
            case_id = row["instance_id"].replace("/", "_")[:64]
            out[case_id] = row["problem_statement"] or "untitled\n"
            if len(out) == n:
                break
    return out


@pytest.mark.slow
class TestWorkerThreads:
    async def test_reads_never_hold_more_than_the_backends_threads(
            self, tmp_path: Path, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
            ) -> None:
        """A case step's head read holds at most ``Store.reader_threads`` worker threads
        at once, however many cases are in flight (trio's default of 40 threads had the
        GIL handed back and forth thousands of times per case: bench/throughput.py); on a
        backend whose reads wait on no network (SQLite) it holds none: every head runs on
        the event loop's own thread (``StoreHandle.run_local``)."""
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        ids = [f"T-{i}" for i in range(24)]
        loop_thread = threading.get_ident()
        async with open_engine(store=tmp_path / "s", config=config, concurrency=16,
                               environ=ENV) as engine:
            await intake_many(engine, tmp_path, ids)
            store = engine.store.store
            bound = store.reader_threads
            lock = threading.Lock()
            enough = threading.Event()  # set once `bound` heads ran together
            now = peak = 0
            on_loop: Counter[bool] = Counter()
            real = store.head

            def head(case_id: str) -> Any:
                nonlocal now, peak
                here = threading.get_ident() == loop_thread
                on_loop[here] += 1
                if here:
                    return real(case_id)
                with lock:
                    now += 1
                    peak = max(peak, now)
                    if now >= bound:
                        enough.set()
                try:
                    # Hold this thread until the others could pile in (a guard, not a
                    # timing check: if they never come, the peak below says so).
                    if not enough.wait(timeout=5):
                        enough.set()
                    return real(case_id)
                finally:
                    with lock:
                        now -= 1

            monkeypatch.setattr(store, "head", head)
            results = await engine.run_until_idle()
        assert sorted(r.case_id for r in results) == sorted(ids)
        assert {r.result.status for r in results} == {"COMPLETED"}
        if store.reads_block:
            assert bound < 16 and peak == bound and set(on_loop) == {False}
        else:
            assert set(on_loop) == {True} and on_loop[True] >= 3 * len(ids)


class TestAMixedBatch:
    async def test_five_hundred_cases_end_as_their_faults_dictate(
            self, tmp_path: Path, server: LoopbackServer, nursery: trio.Nursery,
            backend: str) -> None:
        """520 cases, 120 of them real SWE-bench Lite reports, through three providers in
        order — one down, one refusing the key, one serving — with a mix of faults by case:
        invalid interpretation answers (ERROR invalid_answer), a 429 with Retry-After once
        (COMPLETED after a retry), a first round without any provider (COMPLETED after the
        due time), no provider at all (BLOCKED after max_rounds). Every case ends as its
        fault dictates, and verify is clean. On PostgreSQL 280 cases (every fault, fewer
        plain ones): 500 there took 35 s of the suite's 10 minutes."""
        real = _swebench(120)
        plain = 400 if backend == "sqlite" else 160
        ids = [f"N-{i:03d}" for i in range(plain - len(real))] + sorted(real)
        ids += [f"INV-{i:02d}" for i in range(40)] + [f"RL-{i:02d}" for i in range(30)]
        ids += [f"LATE-{i:02d}" for i in range(25)] + [f"DOWN-{i:02d}" for i in range(25)]
        assert len(ids) == plain + 120
        limited: set[str] = set()
        first_round: set[str] = set()

        def mode_for(r: Any) -> str | None:
            case = r.case_id or ""
            if case.startswith("RL-") and case not in limited:
                limited.add(case)
                return "429"
            if case.startswith("DOWN-"):
                return "503"
            if case.startswith("LATE-") and case not in first_round:
                first_round.add(case)
                return "503"
            return None

        def content_for(r: Any) -> str | None:
            if (r.case_id or "").startswith("INV-") and r.prompt_id == "interpretation_v1":
                return json.dumps({"summary": "x", "statements": "S1",
                                   "missing_observations": []})
            return None

        server.mode_for = mode_for
        server.content_for = content_for
        refuser = LoopbackServer(default_mode="401")  # refuses the key, echoing it
        await nursery.start(refuser.serve)
        providers = [http_provider("down", "openai", f"http://127.0.0.1:{dead_port()}/v1"),
                     http_provider("refused", "openai", refuser.openai_url),
                     http_provider("main", "anthropic", server.anthropic_url, retries=1,
                                   max_concurrency=32)]
        # (No cooldown here: the per-case 503s would otherwise cool "main" down for all.)
        config = batch_config(providers, max_rounds=2, base_delay_s=0.05)
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               concurrency=64, clock=TrioClock(0.0)) as engine:
            await intake_many(engine, tmp_path, ids, real)
            final: dict[str, Any] = {}
            for _ in range(4):  # passes, waiting for due retries between them
                for r in await engine.run_until_idle():
                    final[r.case_id] = r.result
                if not await engine.due(1):
                    await trio.sleep(0.06)
                if not await engine.due(1):
                    break
            per_txn = engine.store.stats.per_transaction
        assert len(final) == plain + 120
        expected = {"N-": ("COMPLETED", "completed"), "INV": ("ERROR", "invalid_answer"),
                    "RL-": ("COMPLETED", "completed"), "LAT": ("COMPLETED", "completed"),
                    "DOW": ("BLOCKED", "rounds_exhausted")}
        for case_id, result in final.items():
            want = expected.get(case_id[:3], ("COMPLETED", "completed"))
            assert (result.status, result.reason) == want, (case_id, result)
        counts = Counter(r.status for r in final.values())
        assert counts == {"COMPLETED": plain + 55, "ERROR": 40, "BLOCKED": 25}
        assert per_txn > 1.5, per_txn  # the actors' publications shared transactions
        assert refuser.requests  # it was asked, and refused every time
        verified(tmp_path / "s")
        if real:
            check = open_ro(tmp_path / "s")
            some = sorted(real)[0]
            files = check.head(some)[1].files
            assert "analysis/hypotheses/0001/hypotheses.json" in files
            check.close()


def test_sample_attachments_helper_is_used() -> None:
    """(keeps the sample import honest for the helpers above)"""
    assert (SAMPLE / "report.json").exists() and Attachment
