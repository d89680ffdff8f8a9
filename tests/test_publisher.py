"""The publisher actor: group commit, durable acknowledgement, cancellation safety."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from actors import PublishMsg, mailbox, open_store, run_publisher
from engine import (
    BytesSource,
    Change,
    Outcome,
    PublishRequest,
    Request,
    SqliteStore,
    StorageError,
    new_package_id,
    verify_store,
)


def _create(case: str, payload: bytes = b"x") -> PublishRequest:
    return PublishRequest(new_package_id(), case, None, Change(
        files={"inputs/a.bin": BytesSource.of(payload), "case/c.json": BytesSource.of(b"{}")},
        phase="INTAKE"))


def _fail_first_commit(store: SqliteStore, monkeypatch: pytest.MonkeyPatch,
                       error: Exception) -> None:
    """Make the store's next commit raise ``error``; later ones commit normally."""
    real = store.commit_batch
    calls = {"n": 0}

    def failing(requests: Sequence[Request]) -> list[Outcome]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return real(requests)

    monkeypatch.setattr(store, "commit_batch", failing)


class TestGroupCommit:
    async def test_waiting_requests_share_one_transaction(self, tmp_path: Path) -> None:
        """200 concurrent publications commit in far fewer transactions, all acknowledged."""
        async with open_store(tmp_path) as store:
            results = []

            async def one(i: int) -> None:
                results.append(await store.publish(_create(f"G-{i}", str(i).encode())))

            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, i)
            assert len(results) == 200
            assert store.stats.requests == 200
            assert store.stats.batches < 50
            assert store.store.transactions == store.stats.batches
            assert store.stats.largest_batch > 1

    async def test_one_transaction_per_publication_when_disabled(self, tmp_path: Path) -> None:
        """With group commit off each publication is its own transaction (the baseline)."""
        async with open_store(tmp_path, group_commit=False) as store:
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(store.publish, _create(f"N-{i}"))
            assert store.stats.batches == 20 and store.stats.largest_batch == 1

    async def test_acknowledged_means_durable(self, tmp_path: Path) -> None:
        """Once publish returns, a fresh connection sees the generation."""
        async with open_store(tmp_path) as store:
            out = await store.publish(_create("D-1"))
            fresh = SqliteStore.open(tmp_path, create=False)
            assert fresh.case("D-1").generation == out.generation == 1
            fresh.close()


class TestCancellation:
    async def test_cancelled_callers_never_leave_partial_generations(self,
                                                                     tmp_path: Path) -> None:
        """Callers cancelled at random moments: every generation in the store is whole, and
        every acknowledged one is present."""
        rng = random.Random(7)
        acked: list[tuple[str, int]] = []
        async with open_store(tmp_path) as store:

            async def caller(i: int) -> None:
                with trio.move_on_after(rng.uniform(0, 0.004)):
                    out = await store.publish(_create(f"C-{i}", bytes([i % 256]) * 64))
                    acked.append((out.case_id, out.generation))

            for _round in range(5):
                async with trio.open_nursery() as nursery:
                    for i in range(_round * 60, _round * 60 + 60):
                        nursery.start_soon(caller, i)
        store2 = SqliteStore.open(tmp_path, create=False)
        report = verify_store(store2)
        assert report.ok, report.violations
        present = {(r.case_id, r.generation) for r in store2.list_cases()}
        assert set(acked) <= present
        assert 0 < len(acked) < 300  # the run really cancelled some callers
        store2.close()

    async def test_commit_in_progress_finishes_when_everything_is_cancelled(
            self, tmp_path: Path) -> None:
        """Cancelling the actor and its caller mid-commit: the shielded commit completes."""

        class SlowStore(SqliteStore):
            def commit_batch(self, requests: Sequence[Request]) -> list[Outcome]:
                committing.set()
                time.sleep(0.3)
                return super().commit_batch(requests)

        committing = threading.Event()
        store = SlowStore.open(tmp_path, create=True)
        send, recv = mailbox()
        msg = PublishMsg(_create("S-1"))
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(lambda **ts: run_publisher(recv, store, **ts))
                await send.send(msg)
                await trio.to_thread.run_sync(committing.wait)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        assert msg.done.is_set() and msg.outcome is not None
        check = SqliteStore.open(tmp_path, create=False)
        assert check.case("S-1").generation == 1
        assert verify_store(check).ok
        check.close()
        store.close()


class TestFailures:
    async def test_storage_error_fails_the_batch_not_the_actor(self, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               ) -> None:
        """A batch whose transaction fails answers its callers with the error; the
        publisher keeps serving."""
        async with open_store(tmp_path) as store:
            _fail_first_commit(store.store, monkeypatch,
                               StorageError("disk full (simulated)", reason="store_unavailable"))
            with pytest.raises(StorageError, match="disk full"):
                await store.publish(_create("F-1"))
            out = await store.publish(_create("F-1"))
            assert out.generation == 1

    async def test_shutdown_drains_queued_requests(self, tmp_path: Path) -> None:
        """Requests already in the mailbox when the handle closes are still committed."""
        results = []
        async with open_store(tmp_path) as store, trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(lambda i=i: _append(results, store.publish(_create(f"Q-{i}"))))
        assert len(results) == 30

    async def test_handle_used_after_close_says_so(self, tmp_path: Path) -> None:
        """Publishing through a handle whose store is closed is a clear StorageError."""
        async with open_store(tmp_path) as store:
            pass
        with pytest.raises(StorageError, match="not running"):
            await store.publish(_create("LATE-1"))

    async def test_body_errors_propagate_unwrapped(self, tmp_path: Path) -> None:
        """An error raised inside `async with open_store()` reaches the caller as itself."""
        with pytest.raises(KeyError):
            async with open_store(tmp_path):
                raise KeyError("mine")


async def _append(results: list[object], coro: object) -> None:
    results.append(await coro)  # type: ignore[misc]


class TestCheckpointer:
    async def test_checkpoints_run_in_the_background_by_volume(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The publisher checkpoints the WAL once per CHECKPOINT_BYTES committed, not per commit."""
        import actors._publisher as publisher

        calls: list[tuple[int, int, int]] = []
        real = SqliteStore.checkpoint

        def counting(self: SqliteStore) -> tuple[int, int, int]:
            result = real(self)
            calls.append(result)
            return result

        monkeypatch.setattr(SqliteStore, "checkpoint", counting)
        monkeypatch.setattr(publisher, "CHECKPOINT_BYTES", 50_000)
        async with open_store(tmp_path) as store:
            for i in range(10):  # ~20 KB each: about 4 checkpoints, not 10
                await store.publish(_create(f"W-{i}", bytes([i]) * 20_000))
            await trio.sleep(0.2)
            # The writer no longer checkpoints inside COMMIT.
            assert store.store.writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert 2 <= len(calls) <= 5
        assert all(busy == 0 for busy, _, _ in calls)
        assert any(done > 0 for _, _, done in calls)

    async def test_wal_is_restarted_under_continuous_writes(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Under writers that never pause the WAL stays bounded: passive checkpoints alone
        never catch the tail, so a RESTART pass follows once it passes WAL_RESTART_BYTES."""
        import actors._publisher as publisher
        import engine._store._sqlite as sqlite_store

        monkeypatch.setattr(publisher, "CHECKPOINT_BYTES", 256_000)
        monkeypatch.setattr(sqlite_store, "WAL_RESTART_BYTES", 1_000_000)
        monkeypatch.setattr(sqlite_store, "WAL_SIZE_LIMIT", 1_000_000)
        peak = 0
        written = 0
        async with open_store(tmp_path) as store:
            deadline = trio.current_time() + 2.0

            async def writer(w: int) -> None:
                nonlocal written
                pkg = new_package_id()
                head = None
                i = 0
                while trio.current_time() < deadline:
                    change = Change(files={f"d/{i % 3}": BytesSource.of(
                        f"{w}:{i}:".encode() * 1000)}, phase="INTAKE" if head is None else None)
                    out = await store.publish(PublishRequest(pkg, f"R-{w}", head, change))
                    head, i = out.generation, i + 1
                    written += 7000

            async def watch() -> None:
                nonlocal peak
                while trio.current_time() < deadline:
                    peak = max(peak, store.store.wal_bytes())
                    await trio.sleep(0.02)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                for w in range(64):
                    nursery.start_soon(writer, w)
        assert written > 20_000_000, "the writers did not keep the WAL busy"
        assert 0 < peak < 12_000_000, (peak, written)


class TestActorEnds:
    async def test_no_caller_waits_forever_when_the_publisher_dies(self,
                                                                   tmp_path: Path) -> None:
        """A publisher that dies mid-commit answers every taken and queued request with an
        error instead of leaving its callers waiting."""
        from engine import SimulatedCrash, arm_crash_point

        store = SqliteStore.open(tmp_path, create=True)
        send, recv = mailbox()
        msgs = [PublishMsg(_create(f"H-{i}")) for i in range(5)]
        for m in msgs:
            send.send_nowait(m)
        arm_crash_point("txn.before_commit")
        with pytest.RaisesGroup(SimulatedCrash):
            await run_publisher(recv, store, max_batch=2)
        assert all(m.done.is_set() for m in msgs)
        assert all(isinstance(m.outcome, StorageError) for m in msgs)
        store.close()

    async def test_unexpected_error_fails_the_batch_and_keeps_serving(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A bug inside a commit fails that batch with a StorageError; the next one commits."""
        async with open_store(tmp_path) as store:
            _fail_first_commit(store.store, monkeypatch, KeyError("bug"))
            with pytest.raises(StorageError, match="KeyError"):
                await store.publish(_create("B-1"))
            assert (await store.publish(_create("B-1"))).generation == 1

    async def test_checkpoint_failure_does_not_stop_the_publisher(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A failing checkpoint is logged; publications go on."""
        import actors._publisher as publisher

        def broken(self: SqliteStore, mode: str = "PASSIVE") -> tuple[int, int, int]:
            raise StorageError("disk full (simulated)")

        monkeypatch.setattr(SqliteStore, "checkpoint", broken)
        monkeypatch.setattr(publisher, "CHECKPOINT_BYTES", 1000)
        async with open_store(tmp_path) as store:
            for i in range(5):
                await store.publish(_create(f"K-{i}", bytes([i]) * 5000))
                await trio.sleep(0.01)
            assert store.store.case("K-4").generation == 1
