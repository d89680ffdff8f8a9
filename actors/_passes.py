"""The engine's passes over the store's due index: ``run_until_idle`` (every case with work
now, then return) and ``serve`` (the daemon's loop, until cancelled).

Work is found through the (status, due_at) index, never by scanning every package. A case
held back (DEFERRED because another process holds it, or failed) is skipped for a while,
and the index is read past the cases already tried or held back, so a window full of cases
another process holds never starves the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import trio

from engine import Shard, StorageError

if TYPE_CHECKING:
    from ._case_actor import Clock
    from ._store_handle import StoreHandle
    from ._supervisor import CaseResult


log = logging.getLogger("viano.engine")
OUTAGE_MAX_WAIT_S = 30.0


class Passes:
    """Mixed into :class:`Engine` (which supplies everything declared here)."""

    store: StoreHandle
    clock: Clock
    config: Any
    shard: Shard | None
    _not_before: dict[str, float]
    _running: dict[str, Any]
    _finished: trio.Event

    @property
    def concurrency(self) -> int:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    async def dispatch(self, case_id: str) -> CaseResult:
        raise NotImplementedError

    def submit(self, case_id: str) -> bool:
        raise NotImplementedError

    async def wait_for_slot(self) -> None:
        raise NotImplementedError

    async def due(self, limit: int, *, skip: Collection[str] = ()) -> list[str]:
        """Up to ``limit`` case ids with work now, from the store's due index, leaving out
        ``skip`` and the cases held back (claimed for this worker where the backend hands
        each due case to one); of the engine's ``shard`` only, when it has one."""
        return await self._due(limit, skip, claim=True)

    async def waiting(self, limit: int) -> list[str]:
        """What :meth:`due` finds, but taking nothing: no lease on a backend that hands
        each due case to one worker. For counting (a progress bar's total): ``batch
        --all`` leased every due case of a shared database just to count them, so the
        other workers got none, and after a SIGKILL none could resume them for
        ``lease_s``. It includes cases other workers have claimed: "is there work for
        me?" is :meth:`due`'s question."""
        return await self._due(limit, (), claim=False)

    async def _due(self, limit: int, skip: Collection[str], *, claim: bool) -> list[str]:
        now_trio = trio.current_time()
        self._not_before = {c: t for c, t in self._not_before.items() if t > now_trio}
        left_out = set(skip) | set(self._not_before)
        now = self.clock.now()  # read here: a TrioClock needs the trio thread
        confirm = self.config.interpretation.auto_confirm
        store, shard = self.store.store, self.shard
        if claim:
            refs = await self.store.run_sync(
                lambda: store.claim_due(now, limit, skip=left_out,
                                        awaiting_confirmation=confirm, shard=shard))
            return [r.case_id for r in refs]
        refs = await self.store.run_sync(
            lambda: store.due_cases(now, limit + len(left_out),
                                    awaiting_confirmation=confirm, shard=shard))
        return [r.case_id for r in refs if r.case_id not in left_out][:limit]

    async def run_until_idle(self, cases: Sequence[str] | None = None, *,
                             on_result: Callable[[CaseResult], None] | None = None,
                             ) -> list[CaseResult]:
        """Advance every case with work now (or the given ones), each once, until none
        left has any; returns each advance's result, in the order they finished
        (``on_result`` hears of each as it finishes). Never sleeps for a due time."""
        out: list[CaseResult] = []
        tried: set[str] = set()
        while True:
            if cases is None:
                batch = await self.due(self._pass_size(), skip=tried)
            else:
                batch = [c for c in dict.fromkeys(cases) if c not in tried]
            if not batch:
                return out
            # Tasks are started as slots free up, not one per case at once: 10,000 ids
            # given never make 10,000 tasks (nor 10,000 case actors waiting for a slot).
            slots = trio.Semaphore(2 * self.concurrency)
            async with trio.open_nursery() as pass_nursery:
                for case_id in batch:
                    tried.add(case_id)
                    await slots.acquire()
                    pass_nursery.start_soon(self._collect, case_id, out, on_result, slots)

    def _pass_size(self) -> int:
        """How many due cases a pass takes at once. A backend that hands each due case to
        one worker (a lease per claim) takes no more than it starts soon (the slots of
        one pass), so the rest stay free for the other workers."""
        if self.store.store.leases_block:
            return 2 * self.concurrency
        return self.concurrency * 4 + 64

    async def _collect(self, case_id: str, out: list[CaseResult],
                       on_result: Callable[[CaseResult], None] | None,
                       slots: trio.Semaphore) -> None:
        try:
            result = await self.dispatch(case_id)
        finally:
            slots.release()
        out.append(result)
        if on_result is not None:
            on_result(result)

    async def serve(self, *, poll_s: float = 1.0,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The daemon's loop, until cancelled: take the cases with work from the store's
        due index (new cases, due retries, interpretations to confirm under auto_confirm)
        into free case actors, then wait for whichever comes first — a case actor
        finishing, the earliest due time, the end of a hold-back, or the next poll (which
        finds cases taken in by other processes). Results arrive on ``results``."""
        task_status.started()
        outage = 0
        while True:
            # Taken before looking: an actor that finishes while we look (or while the nap
            # reads the next due time) has set it, so the nap returns at once instead of
            # missing that wake-up until the next poll.
            woken = self._finished
            free = self.concurrency - self.in_flight
            try:
                if free > 0:
                    for case_id in await self.due(free, skip=self._running):
                        self.submit(case_id)
                await self._nap(poll_s, woken)
                outage = 0
            except StorageError as exc:
                # The store went away for a moment (a database restart, a dropped
                # connection): the daemon waits and looks again, it does not end.
                if exc.reason != "store_unavailable":
                    raise
                outage += 1
                wait = min(poll_s * 2 ** min(outage, 10), OUTAGE_MAX_WAIT_S)
                log.warning("the store is unavailable (%s); looking again in %.1f s",
                            exc.message, wait)
                await trio.sleep(wait)

    async def next_due(self) -> float | None:
        """The earliest due time of a retry (of the engine's shard), by ``clock``."""
        store, shard = self.store.store, self.shard
        return await self.store.run_sync(lambda: store.next_due(shard))

    async def _nap(self, poll_s: float, woken: trio.Event) -> None:
        next_due = await self.next_due()
        wait = poll_s
        if next_due is not None:
            wait = min(wait, max(0.0, next_due - self.clock.now()))
        if self._not_before:
            wait = min(wait, max(0.0, min(self._not_before.values()) - trio.current_time()))
        with trio.move_on_after(wait):
            await woken.wait()
