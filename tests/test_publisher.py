"""The publisher actor: group commit, durable acknowledgement, draining, cancellation safety;
and the SQLite backend's own WAL upkeep."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from actors import PublishMsg, mailbox, open_store, run_publisher
from engine import (
    BytesSource,
    CaseStatus,
    Change,
    Outcome,
    Published,
    PublishRequest,
    Request,
    SimulatedCrash,
    StatusRequest,
    StorageError,
    arm_crash_point,
    new_package_id,
    verify_store,
)
from tests.store_helpers import create, fail_first_commit, open_ro, open_rw

pytestmark = pytest.mark.usefixtures("backend")


class TestGroupCommit:
    async def test_waiting_requests_share_one_transaction(self, tmp_path: Path) -> None:
        """200 concurrent publications commit in far fewer transactions, all acknowledged."""
        async with open_store(tmp_path / "s") as store:
            results = []

            async def one(i: int) -> None:
                results.append(await store.publish(create(f"G-{i}", str(i).encode())))

            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, i)
            assert len(results) == 200
            assert store.stats.requests == 200
            assert store.stats.batches < 50
            assert store.store.stats().transactions == store.stats.batches
            assert store.stats.largest_batch > 1

    async def test_one_transaction_per_publication_when_disabled(self, tmp_path: Path) -> None:
        """With group commit off each publication is its own transaction (the baseline)."""
        async with open_store(tmp_path / "s", group_commit=False) as store:
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(store.publish, create(f"N-{i}"))
            assert store.stats.batches == 20 and store.stats.largest_batch == 1

    async def test_acknowledged_means_durable(self, tmp_path: Path) -> None:
        """Once publish returns, a fresh read-only connection sees the generation."""
        async with open_store(tmp_path / "s") as store:
            out = await store.publish(create("D-1"))
            fresh = open_ro(tmp_path / "s")
            assert fresh.case("D-1").generation == out.generation == 1
            fresh.close()


class TestDraining:
    async def test_closing_the_handle_commits_everything_already_queued(
            self, tmp_path: Path) -> None:
        """Requests still in the mailbox when the block exits are committed, not failed:
        the actor drains its mailbox (an actor cancelled at close would answer these with
        store_unavailable). Several batches' worth are queued, so draining is more than
        finishing the batch already taken."""
        async with open_store(tmp_path / "s", max_batch=8) as store:
            msgs = [store.enqueue(create(f"Q-{i}")) for i in range(40)]
            assert not any(m.done.is_set() for m in msgs)  # none taken yet
        assert all(isinstance(m.outcome, Published) for m in msgs), \
            [m.outcome for m in msgs if not isinstance(m.outcome, Published)]
        check = open_ro(tmp_path / "s")
        assert len(check.list_cases()) == 40
        check.close()

    async def test_handle_used_after_close_says_so(self, tmp_path: Path) -> None:
        """Publishing through a handle whose store is closed is a clear StorageError."""
        async with open_store(tmp_path / "s") as store:
            pass
        with pytest.raises(StorageError, match="not running"):
            await store.publish(create("LATE-1"))


class TestCancellation:
    async def test_cancelled_callers_never_leave_partial_generations(self,
                                                                     tmp_path: Path) -> None:
        """Callers cancelled at many different points: every generation in the store is
        whole, every acknowledged one is present, and a caller cancelled before it sent
        left nothing."""
        rng = random.Random(7)
        acked: list[str] = []
        never_sent: list[str] = []
        async with open_store(tmp_path / "s") as store:

            async def caller(i: int, scope: trio.CancelScope) -> None:
                with scope:
                    for _ in range(1 + i % 7):
                        await trio.lowlevel.checkpoint()
                    out = await store.publish(create(f"C-{i}", bytes([i % 256]) * 64))
                    acked.append(out.case_id)

            for rnd in range(5):
                async with trio.open_nursery() as nursery:
                    scopes = []
                    for i in range(rnd * 60, rnd * 60 + 60):
                        scope = trio.CancelScope()
                        if i % 5 == 0:
                            scope.cancel()  # cancelled before its first step
                            never_sent.append(f"C-{i}")
                        scopes.append(scope)
                        nursery.start_soon(caller, i, scope)
                    for scope in rng.sample(scopes, 30):
                        for _ in range(rng.randrange(12)):
                            await trio.lowlevel.checkpoint()
                        scope.cancel()
        check = open_ro(tmp_path / "s")
        report = verify_store(check)
        assert report.ok, report.violations
        present = {r.case_id for r in check.list_cases()}
        assert set(acked) <= present
        assert not set(never_sent) & present
        assert 0 < len(acked) < 300
        check.close()

    async def test_commit_in_progress_finishes_when_everything_is_cancelled(
            self, tmp_path: Path) -> None:
        """Cancelling the actor while its commit runs: the commit completes and its caller
        is answered."""
        committing, release = threading.Event(), threading.Event()

        store = open_rw(tmp_path / "s")
        real = store.commit_batch

        def slow(requests: Sequence[Request]) -> list[Outcome]:
            committing.set()
            release.wait()
            return real(requests)

        store.commit_batch = slow
        send, recv = mailbox()
        msg = PublishMsg(create("S-1"))
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda **ts: run_publisher(recv, store, **ts))
            await send.send(msg)
            await trio.to_thread.run_sync(committing.wait)
            nursery.cancel_scope.cancel()
            release.set()
        assert msg.done.is_set() and isinstance(msg.outcome, Published)
        check = open_ro(tmp_path / "s")
        assert check.case("S-1").generation == 1
        assert verify_store(check).ok
        check.close()
        store.close()


class TestFailures:
    async def test_storage_error_fails_the_batch_not_the_actor(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A batch whose transaction fails answers its callers with the error; the
        publisher keeps serving."""
        async with open_store(tmp_path / "s") as store:
            fail_first_commit(store.store, monkeypatch,  # type: ignore[arg-type]
                              StorageError("disk full (simulated)", reason="store_unavailable"))
            with pytest.raises(StorageError, match="disk full"):
                await store.publish(create("F-1"))
            out = await store.publish(create("F-1"))
            assert out.generation == 1

    async def test_unexpected_error_fails_the_batch_and_keeps_serving(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A bug inside a commit fails that batch with a StorageError; the next one commits."""
        async with open_store(tmp_path / "s") as store:
            fail_first_commit(store.store, monkeypatch, KeyError("bug"))  # type: ignore[arg-type]
            with pytest.raises(StorageError, match="KeyError"):
                await store.publish(create("B-1"))
            assert (await store.publish(create("B-1"))).generation == 1

    async def test_body_errors_propagate_unwrapped(self, tmp_path: Path) -> None:
        """An error raised inside `async with open_store()` reaches the caller as itself."""
        with pytest.raises(KeyError):
            async with open_store(tmp_path / "s"):
                raise KeyError("mine")

    async def test_no_caller_waits_forever_when_the_publisher_dies(self,
                                                                   tmp_path: Path) -> None:
        """A publisher that dies mid-commit answers every taken and queued request with an
        error instead of leaving its callers waiting."""
        store = open_rw(tmp_path / "s")
        send, recv = mailbox()
        msgs = [PublishMsg(create(f"H-{i}")) for i in range(5)]
        for m in msgs:
            send.send_nowait(m)
        arm_crash_point("txn.before_commit")
        with pytest.raises(SimulatedCrash):
            await run_publisher(recv, store, max_batch=2)
        assert all(m.done.is_set() for m in msgs)
        assert all(isinstance(m.outcome, StorageError) for m in msgs)
        store.close()


@pytest.mark.sqlite_only  # SQLite's write-ahead log
class TestWalUpkeep:
    """Checkpoints are the SQLite backend's own business (engine/_store/_wal.py)."""

    async def test_checkpoints_run_in_the_background_by_volume(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """One checkpoint per CHECKPOINT_BYTES committed, on its own thread; the writer
        itself never checkpoints."""
        import engine._store._wal as wal

        monkeypatch.setattr(wal, "CHECKPOINT_BYTES", 50_000)
        store = open_rw(tmp_path / "s")
        for i in range(10):  # ~20 KB each: about 4 checkpoints, not 10
            store.commit_batch([create(f"W-{i}", bytes([i]) * 20_000)])
            store._checkpointer.settle()
        assert store.writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert 2 <= store._checkpointer.passes <= 5
        store.close()

    async def test_status_changes_alone_still_bring_checkpoints(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A batch of status changes writes no blob and no manifest, but its case rows fill
        the WAL all the same: it counts toward the next checkpoint (it counted nothing, so a
        workload of status changes grew the WAL with none)."""
        import engine._store._wal as wal

        store = open_rw(tmp_path / "s")
        made = [store.commit_batch([create(f"S-{i}")])[0] for i in range(20)]
        store._checkpointer.settle()
        monkeypatch.setattr(wal, "CHECKPOINT_BYTES", 50_000)
        before = store._checkpointer.passes
        for round_ in range(5):
            outs = store.commit_batch([
                StatusRequest(p.package_id, p.case_id, p.generation, CaseStatus(
                    status="BLOCKED", phase="INTAKE", reason=f"round_{round_}"))
                for p in made if isinstance(p, Published)])
            assert all(isinstance(o, Published) for o in outs), outs
            store._checkpointer.settle()
        assert store._checkpointer.passes - before >= 2  # 100 rows: ~400 KB of WAL
        store.close()

    async def test_wal_is_restarted_under_continuous_writes(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Under writers that never pause the WAL stays bounded: passive checkpoints alone
        never catch the tail, so a RESTART pass follows once it passes WAL_RESTART_BYTES."""
        import engine._store._sqlite_open as sqlite_open
        import engine._store._wal as wal

        monkeypatch.setattr(wal, "CHECKPOINT_BYTES", 256_000)
        monkeypatch.setattr(wal, "WAL_RESTART_BYTES", 1_000_000)
        monkeypatch.setattr(sqlite_open, "WAL_SIZE_LIMIT", 1_000_000)
        peak = written = 0
        async with open_store(tmp_path / "s") as store:
            wal_file = tmp_path / "s" / "store.sqlite3-wal"

            async def writer(w: int) -> None:
                nonlocal written, peak
                pkg, head = new_package_id(), None
                for i in range(60):
                    change = Change(files={f"d/{i % 3}": BytesSource.of(
                        f"{w}:{i}:".encode() * 1000)}, phase="INTAKE" if head is None else None)
                    out = await store.publish(PublishRequest(pkg, f"R-{w}", head, change))
                    head = out.generation
                    written += 7000
                    peak = max(peak, wal_file.stat().st_size if wal_file.exists() else 0)

            async with trio.open_nursery() as nursery:
                for w in range(64):
                    nursery.start_soon(writer, w)
            restarts = store.store._checkpointer.restarts  # type: ignore[attr-defined]
        assert written > 20_000_000, "the writers did not keep the WAL busy"
        assert restarts > 0
        assert 0 < peak < 12_000_000, (peak, written)

    async def test_checkpoint_failure_does_not_stop_commits(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A failing checkpoint is counted and logged; publications go on."""
        import engine._store._wal as wal

        monkeypatch.setattr(wal, "CHECKPOINT_BYTES", 1000)

        class Broken:
            def execute(self, *_a: object) -> None:
                raise sqlite3.OperationalError("disk I/O error (simulated)")

            def close(self) -> None:
                pass

        store = open_rw(tmp_path / "s")
        monkeypatch.setattr(store._checkpointer, "_connect", lambda: Broken())
        for i in range(5):
            store.commit_batch([create(f"K-{i}", bytes([i]) * 5000)])
            store._checkpointer.settle()
        assert store._checkpointer.failures >= 3
        assert store.case("K-4").generation == 1
        store.close()
