"""The store's worker threads (``actors._workers``): the cancellation rule of
``trio.to_thread.run_sync`` (never abandoned once started), errors carried back, the bound
on threads, and thread-local state made once per thread for the pool's whole life."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from actors import open_store
from actors._workers import Workers, open_workers
from engine import StorageError


async def test_a_cancelled_caller_waits_for_its_started_job() -> None:
    """Cancelling the caller while its job runs neither abandons nor interrupts the job:
    the caller gets the job's result, and the cancellation arrives at its next
    checkpoint."""
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []
    while_cancelled: list[list[str]] = []
    returned: list[str] = []

    def job() -> str:
        started.set()
        release.wait()
        finished.append("done")
        return "done"

    async with open_workers(1, "t") as workers, trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def canceller() -> None:
            await trio.to_thread.run_sync(started.wait)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            while_cancelled.append(list(finished))  # the caller is still waiting
            release.set()

        nursery.start_soon(canceller)
        with scope:
            returned.append(await workers.run(job))
            await trio.lowlevel.checkpoint()
            returned.append("past a checkpoint")
    assert scope.cancelled_caught
    assert while_cancelled == [[]]
    assert returned == ["done"]
    assert finished == ["done"]


async def test_a_caller_cancelled_before_its_job_is_queued_runs_nothing() -> None:
    ran: list[int] = []
    async with open_workers(2, "t") as workers:
        with trio.CancelScope() as scope:
            scope.cancel()
            await workers.run(ran.append, 1)
        assert scope.cancelled_caught
        assert await workers.run(lambda: 7) == 7
    assert ran == []


async def test_a_job_still_queued_is_cancelled_with_its_caller() -> None:
    """Like a task waiting for a limiter's slot: a caller cancelled while its job waits
    in the queue (no thread has taken it) leaves at once, and the job never runs."""
    started, release = threading.Event(), threading.Event()
    ran: list[object] = []

    def slow() -> None:
        started.set()
        release.wait()
        ran.append("slow")

    async with open_workers(1, "t") as workers, trio.open_nursery() as nursery:
        try:
            nursery.start_soon(workers.run, slow)
            await trio.to_thread.run_sync(started.wait)  # the only thread is taken
            with trio.CancelScope() as queued:
                async with trio.open_nursery() as waiting:
                    for i in range(10):
                        waiting.start_soon(workers.run, ran.append, i)
                    await trio.testing.wait_all_tasks_blocked()
                    assert workers.running == 11
                    queued.cancel()
            assert queued.cancelled_caught
            assert workers.running == 1 and ran == []  # left before the slow job returned
        finally:
            release.set()  # whatever failed above, the slow job ends
    assert ran == ["slow"]
    assert workers.running == 0


async def test_an_idle_thread_holds_nothing_of_its_last_job() -> None:
    class Big:
        pass

    big = Big()
    gone = weakref.ref(big)

    def job(arg: Big) -> None:
        assert arg is not None

    async with open_workers(1, "t") as workers:
        await workers.run(job, big)
        del big
        gc.collect()
        assert gone() is None  # while the pool's thread waits for its next job


async def test_the_jobs_errors_reach_the_caller_and_the_pool_goes_on() -> None:
    def bad() -> None:
        raise KeyError("the job's own error")

    async with open_workers(2, "t") as workers:
        with pytest.raises(KeyError, match="the job's own error") as info:
            await workers.run(bad)
        assert info.traceback[-1].name == "bad"  # raised with the job's traceback
        assert await workers.run(sum, [1, 2, 3]) == 6
        assert workers.running == 0


async def test_jobs_run_only_on_the_pools_threads() -> None:
    lock = threading.Lock()
    names: set[str] = set()

    def job() -> None:
        with lock:
            names.add(threading.current_thread().name)

    async with open_workers(3, "t") as workers, trio.open_nursery() as nursery:
        for _ in range(60):
            nursery.start_soon(workers.run, job)
    assert names <= {"t-0", "t-1", "t-2"}


async def test_a_closed_pool_refuses_work_and_its_threads_are_gone() -> None:
    workers = Workers(2, "t-closed")
    await workers.run(lambda: None)
    workers.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("t-closed-")]
    with pytest.raises(StorageError, match="closed") as info:
        await workers.run(lambda: None)
    assert info.value.reason == "store_unavailable"


async def test_reader_connections_do_not_pile_up_as_threads_come_and_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite backend keeps one reader connection per thread that reads. trio's thread
    cache ends a thread after 10 s idle and starts a new one for the next hop, so a daemon
    idle now and then kept opening connections and never closed the old ones. Here trio's
    threads end at once after every job: reads through the handle still use only the
    pool's threads and connections."""
    import trio._core._thread_cache as cache

    monkeypatch.setattr(cache, "IDLE_TIMEOUT", 0)
    async with open_store(tmp_path / "s") as store:
        backend = store.store
        for _ in range(40):
            await store.run_sync(backend.list_cases)
        assert len(backend._readers) <= backend.reader_threads  # type: ignore[attr-defined]


async def test_the_daemons_case_counts_read_on_the_pools_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's periodic ``providers`` event counts the cases every 30 s, longer than
    trio's 10 s idle timeout: through trio's threads, every count opened a reader
    connection that stayed open."""
    import types

    import trio._core._thread_cache as cache

    from viano_bug_analysis.cli._batch_commands import _case_counts

    monkeypatch.setattr(cache, "IDLE_TIMEOUT", 0)
    async with open_store(tmp_path / "s") as store:
        engine = types.SimpleNamespace(store=store)
        for _ in range(20):
            assert await _case_counts(engine) == {  # type: ignore[arg-type]
                "cases": 0, "by_phase_and_status": {}}
        backend = store.store
        assert len(backend._readers) <= backend.reader_threads  # type: ignore[attr-defined]


# -- StoreHandle.run_local: a case step's plan, on the loop's thread where reads are local --


async def test_run_local_runs_on_the_loops_thread_for_sqlite_and_on_the_pool_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's reads wait on no network, so a plan is done where it is asked for (a hop
    costs more than it saves: ~490 futex calls per case, bench/throughput.py); a backend
    whose reads block (PostgreSQL) keeps them on the pool's threads."""
    async with open_store(tmp_path / "s") as store:
        assert store.store.reads_block is False
        here = threading.current_thread().name
        assert await store.run_local(lambda: threading.current_thread().name) == here
        monkeypatch.setattr(store.store, "reads_block", True)
        names = {await store.run_local(lambda: threading.current_thread().name)
                 for _ in range(8)}
        assert names and all(n.startswith("viano-store-") for n in names)


async def test_run_local_keeps_the_hops_cancellation_rules(tmp_path: Path) -> None:
    """Cancelled before it starts, the job never runs; a cancellation that comes while it
    runs does not discard its result, and is delivered at the caller's next checkpoint."""
    ran: list[str] = []
    async with open_store(tmp_path / "s") as store:
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.run_local(ran.append, "cancelled before")
        assert scope.cancelled_caught and ran == []

        got: str | None = None
        with trio.CancelScope() as scope:
            def job() -> str:
                scope.cancel()  # as if the caller's deadline passed while it ran
                ran.append("ran")
                return "its result"

            result = await store.run_local(job)
            got = result  # reached: the result came back despite the cancellation
            await trio.lowlevel.checkpoint()
            got = "not delivered"
        assert ran == ["ran"] and got == "its result" and scope.cancelled_caught


async def test_run_local_lets_other_tasks_run_between_jobs(tmp_path: Path) -> None:
    """Each job ends with a schedule point: a task doing plan after plan does not starve
    the others (the gateway's reads, the publisher) on the loop it now shares."""
    turns: list[str] = []
    async with open_store(tmp_path / "s") as store:
        async def planner() -> None:
            for _ in range(3):
                await store.run_local(turns.append, "plan")

        async def other() -> None:
            for _ in range(3):
                turns.append("other")
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(planner)
            nursery.start_soon(other)
    # Both move one turn per scheduler batch (trio may run a batch in either order, so
    # two plans can meet at a batch's edge, never three): without the schedule point, the
    # planner's three run in one go.
    assert turns.count("plan") == 3 and turns.count("other") == 3
    assert "plan,plan,plan" not in ",".join(turns), turns


@pytest.mark.parametrize("reads_block", [False, True], ids=["inline", "pool"])
async def test_run_local_lets_other_tasks_run_when_its_job_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_block: bool) -> None:
    """A job that raises still passes through a schedule point, on both paths: a caller
    retrying a failing plan in a loop cannot starve the loop. Inline, the only schedule
    point came after the job, so a raising job skipped it (the other task got 0 turns in
    100 calls)."""
    def boom(n: int) -> None:
        raise ValueError(n)

    turns = 0
    async with open_store(tmp_path / "s") as store:
        monkeypatch.setattr(store.store, "reads_block", reads_block)

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()  # it has started (it never blocks)
            start = turns
            for i in range(20):
                with pytest.raises(ValueError, match=str(i)):
                    await store.run_local(boom, i)
            # A turn per call, give or take the batches' edges (trio may run a batch in
            # either order); without the schedule point, none.
            assert turns - start >= 10
            nursery.cancel_scope.cancel()
