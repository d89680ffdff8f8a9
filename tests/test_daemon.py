"""The daemon's loop (``Engine.serve``) in virtual time: it picks up cases taken in while it
runs, honours due times (no round before its time, and no waiting past it), settles a case
whose advance refused (the due index stops offering it), and offers a case another process
holds again only after a pause — never a busy loop."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Engine, TrioClock
from actors._workers import Workers
from engine import BytesSource, Change, StorageError, artifact_json
from tests.batch_helpers import batch_config, generic_server, intake_many
from tests.loopback import LoopbackServer
from tests.phase_helpers import ENV, http_provider
from viano_bug_analysis import open_engine

pytestmark = pytest.mark.usefixtures("backend")

LONG = 3600.0  # provider timeouts far beyond every virtual wait in these tests


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """Virtual time that jumps after 20 ms of real idleness, but never while a job on a
    worker thread (the store's ``Workers``, or ``trio.to_thread.run_sync``) is still
    queued or running. The store works on threads; a plain autojump clock takes a task
    waiting on one for idle and jumps to the next deadline: under load, straight to a test's guard
    (``fail_after``) while a publication is still being written. (MockClock cannot be
    subclassed; its ``_autojump`` hook, which the run loop calls, is wrapped on the
    instance.)"""
    clock = trio.testing.MockClock(autojump_threshold=0.02)
    jump = clock._autojump
    assert callable(jump), "trio's MockClock no longer has the _autojump hook used here"
    threads = 0

    def autojump() -> None:
        if not threads:
            jump()

    def counted(real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def run(*args: Any, **kw: Any) -> Any:
            nonlocal threads
            threads += 1
            try:
                return await real(*args, **kw)
            finally:
                threads -= 1
        return run

    monkeypatch.setattr(clock, "_autojump", autojump)
    monkeypatch.setattr(trio.to_thread, "run_sync", counted(trio.to_thread.run_sync))
    monkeypatch.setattr(Workers, "run", counted(Workers.run))
    return clock


async def _serving(nursery: trio.Nursery, tmp: Path, server: LoopbackServer,
                   before: Callable[[Engine], Awaitable[None]] | None = None,
                   concurrency: int = 16, poll_s: float = 1.0, **kw: Any) -> Engine:
    """An engine serving in ``nursery`` (cancel the nursery to stop it), after
    ``before(engine)`` if given."""
    config = batch_config([http_provider("p", "openai", server.openai_url, timeout_s=LONG)],
                          **kw)

    async def run(task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_engine(store=tmp / "s", config=config, environ=ENV,
                               clock=TrioClock(), concurrency=concurrency) as engine, \
                trio.open_nursery() as inner:  # serve never outlives its engine
            if before is not None:
                await before(engine)
            await inner.start(lambda task_status: engine.serve(poll_s=poll_s,
                                                               task_status=task_status))
            task_status.started(engine)
            await trio.sleep_forever()

    engine: Engine = await nursery.start(run)
    return engine


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    return await _server(nursery)


async def _server(nursery: trio.Nursery) -> LoopbackServer:
    srv = generic_server()
    await nursery.start(srv.serve)
    return srv


class TestServe:
    async def test_a_case_taken_in_while_it_runs_is_picked_up(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            engine = await _serving(nursery, tmp_path, server)
            await trio.sleep(10)
            assert server.requests == []  # nothing to do yet
            await intake_many(engine, tmp_path, ["NEW-1"])
            with trio.fail_after(30):
                result = await engine.results.receive()
            assert (result.case_id, result.result.status, result.result.phase) == (
                "NEW-1", "COMPLETED", "GENERATING_HYPOTHESES")
            assert [r.prompt_id for r in server.requests] == ["interpretation_v1",
                                                              "hypotheses_v1"]
            nursery.cancel_scope.cancel()

    async def test_the_store_going_away_for_a_moment_does_not_end_the_daemon(
            self, tmp_path: Path, clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
            ) -> None:
        """The due index unreachable (a database restart, a dropped connection) three
        times in a row: the loop waits, looks again, and serves the case once the store
        is back; any other storage error still ends it."""
        failures = {"left": 3}

        async def flaky(engine: Engine) -> None:
            real = engine.store.store.claim_due

            def claim_due(*a: Any, **kw: Any) -> Any:
                if failures["left"]:
                    failures["left"] -= 1
                    raise StorageError("the database restarted (simulated)",
                                       reason="store_unavailable")
                return real(*a, **kw)

            monkeypatch.setattr(engine.store.store, "claim_due", claim_due)
            await intake_many(engine, tmp_path, ["BACK-1"])

        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            engine = await _serving(nursery, tmp_path, server, flaky)
            with trio.fail_after(120):
                result = await engine.results.receive()
            assert (result.case_id, result.result.status) == ("BACK-1", "COMPLETED")
            assert failures["left"] == 0
            nursery.cancel_scope.cancel()

    async def test_a_case_that_keeps_failing_is_offered_less_and_less(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        """A case whose failure cannot even be recorded (its manifest damaged) stays due:
        the loop offers it again after 5 s, then 10, 20 … (at most 300), never at once
        (that spun thousands of times a second); a healthy case beside it completes."""
        async def damage(engine: Engine) -> None:
            await intake_many(engine, tmp_path, ["BAD-1", "OK-1"])
            real = engine.store.store.head

            def head(case_id: str) -> Any:
                if case_id == "BAD-1":
                    raise StorageError("generation 1 of BAD-1 is damaged (simulated)",
                                       reason="store_corrupt")
                return real(case_id)

            engine.store.store.head = head  # type: ignore[method-assign]

        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            engine = await _serving(nursery, tmp_path, server, damage, poll_s=60)
            seen: dict[str, list[str]] = {"BAD-1": [], "OK-1": []}
            with trio.move_on_after(320):  # tries at 0, 5, 15, 35, 75, 155, 315 s
                async for r in engine.results:
                    seen[r.case_id].append(f"{r.result.status} {r.result.reason}")
            nursery.cancel_scope.cancel()
        assert seen["OK-1"] == ["COMPLETED completed"]
        assert 4 <= len(seen["BAD-1"]) <= 9, seen["BAD-1"]
        assert all(x.startswith("ERROR") for x in seen["BAD-1"])

    async def test_a_damaged_store_still_ends_the_loop(self, tmp_path: Path,
                                                       clock: trio.abc.Clock) -> None:
        async with open_engine(store=tmp_path / "s", config=batch_config([]), environ=ENV,
                               clock=TrioClock()) as engine:
            def broken(*_a: Any, **_kw: Any) -> Any:
                raise StorageError("damaged (simulated)", reason="store_corrupt")

            engine.store.store.claim_due = broken  # type: ignore[method-assign]
            with pytest.raises(StorageError), trio.fail_after(60):
                await engine.serve(poll_s=1.0)

    async def test_due_times_are_honoured(self, tmp_path: Path,
                                          clock: trio.abc.Clock) -> None:
        """The first round finds no provider: the retry is due in 30 s. Nothing is asked
        before then, and the daemon asks at that time without being told."""
        asked: list[float] = []
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)

            def mode_for(_r: Any) -> str | None:
                asked.append(trio.current_time())
                return "503" if len(asked) == 1 else None

            server.mode_for = mode_for
            # A poll far beyond the due time: only the due index's next due time wakes it
            # (the case is taken in before serving starts, so no poll is needed to find it).
            async def take_in(engine: Engine) -> None:
                await intake_many(engine, tmp_path, ["LATE-1"])

            engine = await _serving(nursery, tmp_path, server, take_in, base_delay_s=30.0,
                                    poll_s=10_000.0)
            with trio.fail_after(5):
                first = await engine.results.receive()
            assert first.result.status == "RETRY_PENDING"
            with trio.fail_after(60):
                second = await engine.results.receive()
            assert second.result.status == "COMPLETED"
            assert len(asked) == 3  # the refused round, its retry, the hypotheses
            assert 30 <= asked[1] - asked[0] < 32, asked
            nursery.cancel_scope.cancel()

    async def test_a_refused_case_is_settled_not_offered_forever(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        """A case whose history does not stand up is refused without publishing; its
        status (READY from intake) becomes ERROR, so a minute of serving dispatches it
        once."""
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)

            async def forged(engine: Engine) -> None:
                await intake_many(engine, tmp_path, ["BAD-1"])
                snap = await engine.store.snapshot("BAD-1")
                await snap.publish(Change(files={
                    "analysis/interpretation/0001/rounds/0001-0001.answer.json":
                        BytesSource.of(artifact_json({"forged": True}))}))

            engine = await _serving(nursery, tmp_path, server, forged)
            results = []
            with trio.move_on_after(60):
                async for r in engine.results:
                    results.append(r)
            assert [(r.result.status, r.result.reason) for r in results
                    if r.result.status != "DEFERRED"] == [("ERROR", "unsupported_history")]
            status = (await engine.store.case("BAD-1")).status
            assert status is not None and (status.status, status.reason) == (
                "ERROR", "unsupported_history")
            assert server.requests == []
            nursery.cancel_scope.cancel()

    async def test_a_case_held_elsewhere_is_offered_again_after_a_pause(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        """One case held by another process while 30 others are served: each of their
        results wakes the loop, yet the held case is offered again only once per
        locked_retry_s (not on every wake-up: no busy loop); released, it completes."""
        others = [f"FREE-{i:02d}" for i in range(30)]
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            held = ExitStack()

            async def hold(engine: Engine) -> None:
                await intake_many(engine, tmp_path, ["HELD-1", *others])
                held.enter_context(engine.store.store.lease("HELD-1"))

            engine = await _serving(nursery, tmp_path, server, hold, concurrency=4)
            start = trio.current_time()
            done: set[str] = set()
            locked = 0
            with held, trio.fail_after(600):
                async for r in engine.results:
                    if r.case_id == "HELD-1":
                        locked += r.result.reason == "locked"
                    elif r.result.status == "COMPLETED":
                        done.add(r.case_id)
                    if done == set(others):
                        break
            elapsed = trio.current_time() - start
            assert 1 <= locked <= elapsed / engine.locked_retry_s + 2, (locked, elapsed)
            with trio.fail_after(30):
                while (r := await engine.results.receive()).case_id != "HELD-1" or \
                        r.result.status == "DEFERRED":
                    pass
            assert r.result.status == "COMPLETED"
            nursery.cancel_scope.cancel()


class TestNothingSpinsNothingStarves:
    @pytest.mark.parametrize("trigger", ["max_rounds lowered", "policy edited"])
    async def test_a_due_retry_that_can_no_longer_run_is_settled(
            self, tmp_path: Path, clock: trio.abc.Clock, trigger: str) -> None:
        """A retry comes due after the configuration changed under it (fewer rounds
        allowed: BLOCKED; another hypotheses policy: ERROR policy_changed). Neither
        publishes anything, yet the case is offered once and settles, and the cases
        taken in next are served."""
        from engine import HypothesisPolicy

        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            prompt = "interpretation_v1" if trigger == "max_rounds lowered" else "hypotheses_v1"
            server.mode_for = lambda r: "503" if r.prompt_id == prompt else None
            first = await _serving(nursery, tmp_path, server, base_delay_s=1.0)
            await intake_many(first, tmp_path, ["LATE-1"])
            with trio.fail_after(30):
                assert (await first.results.receive()).result.status == "RETRY_PENDING"
            nursery.cancel_scope.cancel()
        changed: dict[str, Any] = ({"max_rounds": 1} if trigger == "max_rounds lowered"
                                   else {})
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            engine = await _serving(
                nursery, tmp_path, server, base_delay_s=1.0, **changed,
                **({} if changed else {"hypotheses": HypothesisPolicy(max_hypotheses=4)}))
            await trio.sleep(2)  # the retry is due
            await intake_many(engine, tmp_path, ["NEXT-1", "NEXT-2"])
            results = []
            with trio.move_on_after(60):
                async for r in engine.results:
                    results.append((r.case_id, r.result.status, r.result.reason))
            late = [x for x in results if x[0] == "LATE-1"]
            want = (("LATE-1", "BLOCKED", "rounds_exhausted") if changed else
                    ("LATE-1", "ERROR", "policy_changed"))
            assert late == [want], results
            assert {x for x in results if x[0] != "LATE-1"} == {
                ("NEXT-1", "COMPLETED", "completed"), ("NEXT-2", "COMPLETED", "completed")}
            status = (await engine.store.case("LATE-1")).status
            assert status is not None and (status.status, status.reason) == want[1:]
            nursery.cancel_scope.cancel()

    async def test_a_retry_whose_status_lost_its_due_time_waits_for_it(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        """A case whose next round is due in two minutes but whose status says READY (what an
        import of it sets) was dispatched every 0.2 s until then (DEFERRED not_due,
        each taking its lease and reading its history). It is dispatched once: that
        result gives it the RETRY_PENDING status, with the round's due time, and the
        round runs when due."""
        from engine import CaseStatus

        DELAY = 120.0

        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            server.mode_for = lambda r: "503" if not server.requests[1:] else None
            first = await _serving(nursery, tmp_path, server, base_delay_s=DELAY)
            await intake_many(first, tmp_path, ["IMP-1"])
            with trio.fail_after(30):
                pending = (await first.results.receive()).result
            assert (pending.status, pending.due_at is not None) == ("RETRY_PENDING", True)
            snap = await first.store.snapshot("IMP-1")
            await snap.set_status(CaseStatus(status="READY", phase=pending.phase,
                                             reason="imported"))
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            engine = await _serving(nursery, tmp_path, server, base_delay_s=DELAY)
            results = []
            with trio.move_on_after(DELAY / 2):
                async for r in engine.results:
                    results.append((r.result.status, r.result.reason))
            assert results == [("DEFERRED", "not_due")], results[:5]
            status = (await engine.store.case("IMP-1")).status
            assert status is not None and status.status == "RETRY_PENDING"
            assert status.due_at == pending.due_at
            with trio.fail_after(2 * DELAY):
                while (r := await engine.results.receive()).result.status != "COMPLETED":
                    pass
            assert len(server.requests) == 2  # the retry and the hypotheses, once each
            nursery.cancel_scope.cancel()

    @pytest.mark.parametrize("how", ["run_until_idle", "serve"])
    async def test_cases_held_elsewhere_never_starve_the_rest(
            self, tmp_path: Path, clock: trio.abc.Clock, how: str) -> None:
        """Twenty cases another process holds (first in the index's order) and five free
        ones, one slot: the free ones complete."""
        held_ids = [f"A-{i:02d}" for i in range(20)]
        free_ids = [f"Z-{i}" for i in range(5)]
        leases = ExitStack()

        async def hold(engine: Engine) -> None:
            await intake_many(engine, tmp_path, held_ids + free_ids)
            for case_id in held_ids:
                leases.enter_context(engine.store.store.lease(case_id))

        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            if how == "serve":
                engine = await _serving(nursery, tmp_path, server, hold, concurrency=1)
                done: set[str] = set()
                offered = 0
                with leases:
                    async for r in engine.results:
                        offered += 1
                        if r.result.status == "COMPLETED":
                            done.add(r.case_id)
                        if done >= set(free_ids):
                            break
                        # Starvation is counted in offers, not in virtual time: the clock
                        # jumps whenever the store's threads take over 20 ms, which a loaded
                        # machine's PostgreSQL round trips do (600 "seconds" passed so).
                        # 25 when nothing is slow (each held case once, each free one once);
                        # starving would be without bound.
                        assert offered < 400, (offered, sorted(done))
            else:
                config = batch_config([http_provider("p", "openai", server.openai_url,
                                                     timeout_s=LONG)])
                async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                                       clock=TrioClock(), concurrency=1) as engine:
                    await hold(engine)
                    with leases:
                        results = await engine.run_until_idle()
                by_case = {r.case_id: r.result for r in results}
                assert {c: by_case[c].status for c in free_ids} == dict.fromkeys(
                    free_ids, "COMPLETED")
                assert all(by_case[c].reason == "locked" for c in held_ids)
                assert len(results) == len(by_case)  # each case once in one pass
            nursery.cancel_scope.cancel()


class TestOneCaseNeverTakesOthersDown:
    async def test_an_error_of_one_case_is_its_result(self, tmp_path: Path,
                                                      server: LoopbackServer) -> None:
        """An unknown id among real ones (run_until_idle), and submitted alone: an ERROR
        result for it, on the channel too; the others complete."""
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["C-1", "C-2"])
            results = {r.case_id: r.result for r in await engine.run_until_idle(
                ["C-1", "NOPE", "C-2"])}
            assert (results["NOPE"].status, results["NOPE"].reason) == ("ERROR",
                                                                         "unknown_case")
            assert results["C-1"].status == results["C-2"].status == "COMPLETED"
            assert engine.submit("ALSO-NOPE")
            with trio.fail_after(10):
                r = await engine.results.receive()
            assert (r.case_id, r.result.reason) == ("ALSO-NOPE", "unknown_case")

    async def test_dispatch_results_do_not_pile_up_on_the_channel(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Only submitted cases report on ``results`` (a host that dispatches and never
        reads it does not grow)."""
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["C-1", "C-2"])
            await engine.dispatch("C-1")
            await engine.run_until_idle()
            with pytest.raises(trio.WouldBlock):
                engine.results.receive_nowait()


class TestTheBounds:
    async def test_in_flight_model_calls_never_pass_the_concurrency(
            self, tmp_path: Path, nursery: trio.Nursery) -> None:
        """Ten cases submitted, concurrency 3, every answer held: exactly 3 calls are
        waiting at the provider, however long everything settles."""
        server = generic_server()
        server.default_mode = "held"
        await nursery.start(server.serve)
        config = batch_config([http_provider("p", "openai", server.openai_url,
                                             max_concurrency=64)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               concurrency=3) as engine:
            await intake_many(engine, tmp_path, [f"C-{i}" for i in range(10)])
            for i in range(10):
                assert engine.submit(f"C-{i}")
            while server.held < 3:
                await trio.testing.wait_all_tasks_blocked()
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert server.held == 3
            server.release.set()
            with trio.fail_after(60):
                got = {(await engine.results.receive()).case_id for _ in range(10)}
            assert len(got) == 10

    async def test_a_daemon_confirms_under_auto_confirm(
            self, tmp_path: Path, clock: trio.abc.Clock) -> None:
        """A case whose interpretation waits for a person, then a daemon configured to
        confirm by policy: it confirms (policy:auto_confirm) and builds the hypotheses."""
        async with trio.open_nursery() as nursery:
            server = await _server(nursery)
            config = batch_config([http_provider("p", "openai", server.openai_url,
                                                 timeout_s=LONG)], auto_confirm=False)
            async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                                   clock=TrioClock()) as engine:
                await intake_many(engine, tmp_path, ["W-1"])
                first = await engine.dispatch("W-1")
                assert first.result.reason == "awaiting_confirmation"
            engine = await _serving(nursery, tmp_path, server)
            events = engine.subscribe()
            with trio.fail_after(60):
                r = await engine.results.receive()
            assert (r.result.status, r.result.phase) == ("COMPLETED", "GENERATING_HYPOTHESES")
            snap = await engine.store.snapshot("W-1")
            conf = json.loads(await snap.read("analysis/interpretation/0001/confirmation.json"))
            assert conf["confirmed_by"] == "policy:auto_confirm"
            steps = []
            while True:
                try:
                    steps.append(events.receive_nowait())
                except trio.WouldBlock:
                    break
            assert any(e.get("step") == "confirm" for e in steps)  # logged like any step
            nursery.cancel_scope.cancel()


def test_the_worst_exit_code_of_many_cases() -> None:
    """CONTRACT: 1 > 13 > 12 > 2 > 10 > 11 > 0."""
    from actors import worst_exit

    assert worst_exit([0, 11, 10, 2, 12, 13, 1]) == 1
    assert worst_exit([0, 11, 10, 2, 12, 13]) == 13
    assert worst_exit([0, 11, 10, 2, 12]) == 12
    assert worst_exit([0, 11, 10, 2]) == 2
    assert worst_exit([0, 11, 10]) == 10
    assert worst_exit([11, 0]) == 11
    assert worst_exit([]) == 0


async def test_a_status_that_claims_completion_does_not_skip_the_work(
        tmp_path: Path, server: LoopbackServer) -> None:
    """The index says COMPLETED (hypotheses) but the package holds no batch: the engine
    does the work instead of trusting the status (it trusts it only with the batch's
    pointer in the head)."""
    from engine import CaseStatus

    config = batch_config([http_provider("p", "openai", server.openai_url)])
    async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
        await intake_many(engine, tmp_path, ["F-1"])
        snap = await engine.store.snapshot("F-1")
        await snap.set_status(CaseStatus(status="COMPLETED", phase="GENERATING_HYPOTHESES",
                                         reason="completed"))
        r = await engine.dispatch("F-1")
        assert r.result.status == "COMPLETED"
        snap = await engine.store.snapshot("F-1")
        assert "analysis/hypotheses/0001/hypotheses.json" in snap.manifest.files
        again = await engine.dispatch("F-1")
        assert again.result.message.startswith("the case is complete")  # now trusted


async def test_many_given_cases_never_make_many_actors(tmp_path: Path,
                                                       server: LoopbackServer) -> None:
    """Forty ids given to run_until_idle at concurrency 2: never more than 4 case actors
    exist at once (tasks are started as slots free up)."""
    config = batch_config([http_provider("p", "openai", server.openai_url)])
    ids = [f"M-{i:02d}" for i in range(40)]
    peak = 0
    async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                           concurrency=2) as engine:
        await intake_many(engine, tmp_path, ids)

        def seen(_r: object) -> None:
            nonlocal peak
            peak = max(peak, engine.in_flight)

        events = engine.subscribe(buffer=100_000)
        results = await engine.run_until_idle(ids, on_result=seen)
        while True:
            try:
                events.receive_nowait()
                peak = max(peak, engine.in_flight)
            except trio.WouldBlock:
                break
    assert len(results) == 40 and {r.result.status for r in results} == {"COMPLETED"}
    assert 1 <= peak <= 4, peak
