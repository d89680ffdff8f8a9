"""Gaps an audit of #9 found in the engine: ``submit`` bounded (many submitted cases never
make many case actors), with its result channel unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.lowlevel

from actors import Engine
from tests.batch_helpers import batch_config, generic_server, intake_many, verified
from tests.loopback import LoopbackServer
from tests.phase_helpers import ENV, http_provider
from viano_bug_analysis import open_engine

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv = generic_server()
    await nursery.start(srv.serve)
    return srv


def _live_case_actors() -> int:
    """Every task of this trio run that is a case actor (counted by walking the task tree:
    what exists, not what the engine says of itself)."""
    count = 0
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        count += task.name.endswith("Engine._actor")
        todo += [t for n in task.child_nurseries for t in n.child_tasks]
    return count


class TestSubmitIsBounded:
    async def test_many_submitted_cases_never_make_many_case_actors(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """200 cases submitted at once, concurrency 2: every submission is accepted (a
        second one of a waiting case is refused: it is already taken), each result arrives
        once on ``engine.results``, and at no time — right after the submissions, at every
        provider request, at every result — do more than 2 case actors exist."""
        config = batch_config([http_provider("p", "openai", server.openai_url)])
        ids = [f"Q-{i:03d}" for i in range(200)]
        peak_tasks = peak_active = 0

        def sample(_: object = None) -> None:
            nonlocal peak_tasks, peak_active
            peak_tasks = max(peak_tasks, _live_case_actors())
            peak_active = max(peak_active, engine.active)

        async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                               concurrency=2) as engine:
            await intake_many(engine, tmp_path, ids)
            server.on_request = sample
            assert all(engine.submit(c) for c in ids)
            assert not engine.submit(ids[-1])      # waiting for a slot: already taken
            assert engine.in_flight == 200 and engine.queued == 198
            await trio.testing.wait_all_tasks_blocked()
            sample()
            got: dict[str, str] = {}
            with trio.fail_after(240):
                for _ in ids:
                    r = await engine.results.receive()
                    sample()
                    assert r.case_id not in got
                    got[r.case_id] = r.result.status
            assert engine.in_flight == 0 and engine.queued == 0
        assert set(got) == set(ids) and set(got.values()) == {"COMPLETED"}
        assert len(server.requests) == 400  # interpretation and hypotheses, once each
        assert 1 <= peak_tasks <= 2, peak_tasks
        assert 1 <= peak_active <= 2, peak_active
        verified(tmp_path / "s")

    async def test_leaving_the_engine_ends_the_waiting_cases(
            self, tmp_path: Path, nursery: trio.Nursery) -> None:
        """Cases waiting for a slot when the block is left are not advanced (no task was
        ever started for them), and a dispatch joined to one of them is told the engine
        stopped instead of waiting forever."""
        from engine import VianoError

        srv = generic_server()
        srv.default_mode = "held"
        await nursery.start(srv.serve)
        config = batch_config([http_provider("p", "openai", srv.openai_url)])
        ids = [f"W-{i}" for i in range(6)]
        outcome: list[str] = []
        joined = trio.Event()

        async def join_last(engine: Engine) -> None:
            try:
                await engine.dispatch(ids[-1])
                outcome.append("advanced")
            except VianoError as exc:
                outcome.append(exc.reason)
            joined.set()

        with trio.fail_after(60):
            async with trio.open_nursery() as host:
                async with open_engine(store=tmp_path / "s", config=config, environ=ENV,
                                       concurrency=1) as engine:
                    await intake_many(engine, tmp_path, ids)
                    for case_id in ids:
                        assert engine.submit(case_id)
                    host.start_soon(join_last, engine)
                    while srv.held < 1:
                        await trio.testing.wait_all_tasks_blocked()
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    assert engine.active == 1 and engine.queued == 5
                await joined.wait()
        assert outcome == ["engine_stopped"]
        assert srv.held == 1  # only the first case ever reached the provider

    async def test_a_dispatch_after_the_engine_stopped_is_engine_stopped(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Nothing is queued (or waited for) once the engine takes no work."""
        from engine import VianoError

        config = batch_config([http_provider("p", "openai", server.openai_url)])
        async with open_engine(store=tmp_path / "s", config=config, environ=ENV) as engine:
            await intake_many(engine, tmp_path, ["L-1"])
        assert not engine.submit("L-1")
        with trio.fail_after(5), pytest.raises(VianoError) as caught:
            await engine.dispatch("L-1")
        assert caught.value.reason == "engine_stopped"
        assert engine.in_flight == 0 and server.requests == []
