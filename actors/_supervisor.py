"""The supervisor: many cases at once, over one gateway pool and one publisher.

It owns a nursery and routes each dispatch to a **case actor**: one task per case with work,
holding that case's lease for the whole of it and running the case as far as it can go now —
interpretation, confirmation when ``auto_confirm``, hypotheses — each phase decided from
durable state. A second dispatch of a case whose actor is running joins it instead of
competing for the lease. In-flight cases are bounded by ``concurrency`` (a capacity
limiter), so 10,000 queued cases hold no leases, no file descriptors and no tasks beyond
that bound; provider requests are bounded by each provider's ``max_concurrency`` in the
gateway pool, and the actors' publications share the publisher's group commits.

Work is found through the store's due index (READY cases and RETRY_PENDING ones whose time
has come), never by scanning every package. Results go to a channel, and every phase step
and result to the subscribers of the event stream; a slow subscriber loses events (counted)
rather than slowing the cases down.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from engine import (
    BLOCKED,
    COMPLETED,
    DEFERRED,
    ERROR,
    HYPOTHESES,
    INTERPRETATION,
    CaseLocked,
    CaseStatus,
    Config,
    DispatchRequest,
    DispatchResult,
    VianoError,
    confirm_change,
)

from ._case_actor import (
    Clock,
    PhaseServices,
    SystemClock,
    locked_result,
    log_event,
    run_phase,
    view_of,
)
from ._gateway_pool import GatewayHandle
from ._store_handle import StoreHandle

_ORDER = {1: 0, 13: 1, 12: 2, 2: 3, 10: 4, 11: 5, 0: 6}  # CONTRACT: 1 > 13 > 12 > 2 > 10 > 11 > 0


def worst_exit(codes: Sequence[int]) -> int:
    """The exit code of a multi-case command: the worst of its cases'."""
    return min(codes, key=lambda c: _ORDER.get(c, 0)) if codes else 0


@attrs.frozen
class CaseResult:
    """Where one case got to in one advance: the last phase's dispatch result."""

    case_id: str
    result: DispatchResult
    elapsed_s: float = 0.0   # the advance itself, from taking a slot to its result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def done(self) -> bool:
        """Nothing more a dispatch can do for it by itself now or later."""
        return self.result.status in (COMPLETED, BLOCKED, ERROR)

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()


@attrs.define
class _Running:
    done: trio.Event = attrs.field(factory=trio.Event)
    result: CaseResult | None = None
    error: BaseException | None = None


class Engine:
    """Use through :func:`open_engine`."""

    def __init__(self, store: StoreHandle, gateway: GatewayHandle, config: Config,
                 nursery: trio.Nursery, *, concurrency: int, clock: Clock):
        self.store, self.gateway, self.config = store, gateway, config
        self.clock = clock
        self._nursery = nursery
        self._limiter = trio.CapacityLimiter(concurrency)
        self._running: dict[str, _Running] = {}
        self._results_send, self.results = trio.open_memory_channel[CaseResult](math.inf)
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self.dropped_events = 0
        self.accepting = True
        self._finished = trio.Event()
        self._not_before: dict[str, float] = {}  # trio time before which a DEFERRED case
        self.locked_retry_s = 0.2                 # (held elsewhere) is not offered again
        self.services = PhaseServices(store, gateway, clock, self._event)

    # -- events ------------------------------------------------------------------------

    def subscribe(self, buffer: int = 1000) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """A stream of events: every phase step and dispatch result, as dicts."""
        send, recv = trio.open_memory_channel[dict[str, Any]](buffer)
        self._subscribers.append(send)
        return recv

    def _event(self, event: dict[str, Any]) -> None:
        log_event(event)
        for sub in list(self._subscribers):
            try:
                sub.send_nowait(event)
            except trio.WouldBlock:
                self.dropped_events += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(sub)

    # -- dispatching -------------------------------------------------------------------

    def request(self, spec_key: str, attempt_id: str = "default") -> DispatchRequest:
        spec = INTERPRETATION if spec_key == "interpretation" else HYPOTHESES
        return DispatchRequest(policy=spec.configured(self.config), retry=self.config.retry,
                               attempt_id=attempt_id,
                               auto_confirm=self.config.interpretation.auto_confirm)

    async def dispatch(self, case_id: str) -> CaseResult:
        """Advance ``case_id`` as far as it can go now and return where it got to. A case
        already being advanced is joined, not dispatched twice."""
        running = self._running.get(case_id)
        if running is None:
            running = self._start(case_id)
        await running.done.wait()
        if running.error is not None:
            raise running.error
        if running.result is None:
            raise VianoError(f"the engine stopped before case {case_id!r} was advanced; "
                             "only what was committed is kept", reason="engine_stopped",
                             hint="Dispatch the case again: it resumes from durable state.")
        return running.result

    def submit(self, case_id: str) -> bool:
        """Advance ``case_id`` in the background; its result arrives on :attr:`results`.
        False if it is already being advanced (its result arrives once) or the engine no
        longer takes work."""
        if not self.accepting or case_id in self._running:
            return False
        self._start(case_id)
        return True

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def _start(self, case_id: str) -> _Running:
        running = _Running()
        self._running[case_id] = running
        self._nursery.start_soon(self._actor, case_id, running)
        return running

    async def _actor(self, case_id: str, running: _Running) -> None:
        """A case actor: the case's lease for its whole advance, bounded by concurrency."""
        try:
            async with self._limiter:
                started = trio.current_time()
                result = await self._advance(case_id)
                running.result = attrs.evolve(result, elapsed_s=trio.current_time() - started)
            if running.result.result.status == DEFERRED:  # not now: held elsewhere, not due
                self._not_before[case_id] = trio.current_time() + self.locked_retry_s
            self._results_send.send_nowait(running.result)
        except Exception as exc:
            running.error = exc
        finally:
            del self._running[case_id]
            running.done.set()
            self._finished.set()
            self._finished = trio.Event()

    async def wait_for_slot(self) -> None:
        """Until a case actor finishes (a slot frees up)."""
        await self._finished.wait()

    async def _advance(self, case_id: str) -> CaseResult:
        interpretation = self.request("interpretation")
        try:
            with self.store.lease(case_id):
                first = await run_phase(self.services, INTERPRETATION, case_id, interpretation)
                if first.status != COMPLETED:
                    return await self._settled(CaseResult(case_id, first))
                if self.config.interpretation.auto_confirm:
                    await self._confirm(case_id)
                second = await run_phase(self.services, HYPOTHESES, case_id,
                                         self.request("hypotheses"))
                if second.reason == "interpretation_not_confirmed":
                    # waiting for a person to confirm
                    return await self._settled(CaseResult(case_id, first))
                return await self._settled(CaseResult(case_id, second))
        except CaseLocked as exc:
            return CaseResult(case_id, await locked_result(self.services, INTERPRETATION,
                                                           case_id, interpretation, exc))

    async def _settled(self, result: CaseResult) -> CaseResult:
        """A case whose advance ended with nothing more to do by itself (COMPLETED, BLOCKED,
        ERROR) but whose durable status still says it has work (READY, RUNNING: a refusal
        publishes nothing, so the status a person or an import left stays) gets the status
        its result says, so that the due index stops offering it. Done after the whole
        advance: a crash before it leaves the case due, which only costs a dispatch."""
        r = result.result
        if r.status not in (COMPLETED, BLOCKED, ERROR):
            return result
        ref, snap = await self.store.head(result.case_id)
        if ref.status is None or ref.status.status in ("READY", "RUNNING"):
            await snap.set_status(CaseStatus(status=r.status, phase=r.phase,
                                             reason=str(r.reason)))
        return result

    async def _confirm(self, case_id: str) -> None:
        _ref, snap = await self.store.head(case_id)
        made = await trio.to_thread.run_sync(confirm_change, view_of(snap), "policy:auto_confirm")
        if made is not None:
            await snap.publish(*made)

    # -- passes ------------------------------------------------------------------------

    async def due(self, limit: int) -> list[str]:
        """Case ids with work now, from the store's due index."""
        now = self.clock.now()  # read here: a TrioClock needs the trio thread
        refs = await trio.to_thread.run_sync(
            lambda: self.store.store.due_cases(
                now, limit, awaiting_confirmation=self.config.interpretation.auto_confirm))
        return [r.case_id for r in refs]

    async def run_until_idle(self, cases: Sequence[str] | None = None, *,
                             on_result: Callable[[CaseResult], None] | None = None,
                             ) -> list[CaseResult]:
        """Advance every case with work now (or the given ones) until none of them has
        any; returns each advance's result, in the order they finished (``on_result``
        hears of each as it finishes). Never sleeps for a due time."""
        out: list[CaseResult] = []
        wanted = set(cases) if cases is not None else None
        tried: set[str] = set()
        while True:
            if wanted is None:
                batch = [c for c in await self.due(int(self._limiter.total_tokens) * 4 + 64)
                         if c not in tried]
            else:
                batch = [c for c in wanted - tried]
            if not batch:
                return out
            async with trio.open_nursery() as pass_nursery:
                for case_id in batch:
                    tried.add(case_id)
                    pass_nursery.start_soon(self._collect, case_id, out, on_result)

    async def _collect(self, case_id: str, out: list[CaseResult],
                       on_result: Callable[[CaseResult], None] | None) -> None:
        result = await self.dispatch(case_id)
        out.append(result)
        if on_result is not None:
            on_result(result)

    async def serve(self, *, poll_s: float = 1.0,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The daemon's loop, until cancelled: take the cases with work from the store's
        due index (new cases, due retries, interpretations to confirm under auto_confirm)
        into free case actors, then wait for whichever comes first — a case actor
        finishing, the earliest due time, or the next poll (which finds cases taken in by
        other processes). A case another process holds is offered again only after
        ``locked_retry_s``. Results arrive on :attr:`results`."""
        task_status.started()
        while True:
            free = int(self._limiter.total_tokens) - self.in_flight
            now = trio.current_time()
            self._not_before = {c: t for c, t in self._not_before.items() if t > now}
            if free > 0:
                for case_id in await self.due(free + self.in_flight + len(self._not_before)):
                    if case_id not in self._not_before:
                        self.submit(case_id)
            await self._nap(poll_s)

    async def _nap(self, poll_s: float) -> None:
        next_due = await trio.to_thread.run_sync(self.store.store.next_due)
        wait = poll_s
        if next_due is not None:
            wait = min(wait, max(0.0, next_due - self.clock.now()))
        if self._not_before:
            wait = min(wait, max(0.0, min(self._not_before.values()) - trio.current_time()))
        with trio.move_on_after(wait):
            await self.wait_for_slot()


@asynccontextmanager
async def open_engine_on(store: StoreHandle, gateway: GatewayHandle, config: Config, *,
                         concurrency: int = 16, clock: Clock | None = None
                         ) -> AsyncIterator[Engine]:
    """The supervisor over handles the caller opened (and will close, gateway after store).
    Leaving the block takes no new work and cancels the case actors still running — their
    model calls are cancelled; a publication already sent still commits whole (the
    publisher's commit is shielded), so only checkpointed state is left."""
    async with trio.open_nursery() as nursery:
        engine = Engine(store, gateway, config, nursery, concurrency=concurrency,
                        clock=clock or SystemClock())
        try:
            yield engine
        finally:
            engine.accepting = False
            nursery.cancel_scope.cancel()
            engine._results_send.close()
            for sub in engine._subscribers:
                sub.close()
