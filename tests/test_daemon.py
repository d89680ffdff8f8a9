"""The daemon's loop (``Engine.serve``) in virtual time: it picks up cases taken in while it
runs, honours due times (no round before its time, and no waiting past it), settles a case
whose advance refused (the due index stops offering it), and offers a case another process
holds again only after a pause — never a busy loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Engine, TrioClock
from engine import BytesSource, Change, artifact_json
from tests.batch_helpers import batch_config, generic_server, intake_many
from tests.loopback import LoopbackServer
from tests.phase_helpers import ENV, http_provider
from viano_bug_analysis import open_engine

LONG = 3600.0  # provider timeouts far beyond every virtual wait in these tests


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 20 ms of real idleness: the store works on
    threads, and a clock that jumped the moment every task waited on one would fire
    deadlines (a poll, a test's guard) while a publication is still being written."""
    return trio.testing.MockClock(autojump_threshold=0.02)


async def _serving(nursery: trio.Nursery, tmp: Path, server: LoopbackServer,
                   before: Callable[[Engine], Awaitable[None]] | None = None,
                   concurrency: int = 16, **kw: Any) -> Engine:
    """An engine serving in ``nursery`` (cancel the nursery to stop it), after
    ``before(engine)`` if given."""
    config = batch_config([http_provider("p", "openai", server.openai_url, timeout_s=LONG)],
                          **kw)

    async def run(task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_engine(store=tmp / "s", config=config, environ=ENV,
                               clock=TrioClock(), concurrency=concurrency) as engine:
            if before is not None:
                await before(engine)
            await nursery.start(lambda task_status: engine.serve(poll_s=1.0,
                                                                 task_status=task_status))
            task_status.started(engine)
            await trio.sleep_forever()

    engine: Engine = await nursery.start(run)
    return engine


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
            engine = await _serving(nursery, tmp_path, server, base_delay_s=30.0)
            await intake_many(engine, tmp_path, ["LATE-1"])
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
                held.enter_context(engine.store.lease("HELD-1"))

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
