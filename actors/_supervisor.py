"""The supervisor: many cases at once, over one gateway pool and one publisher.

It owns a nursery and routes each dispatch to a **case actor**: one task per case with work,
holding that case's lease for the whole of it and running the case as far as it can go now —
interpretation, confirmation when ``auto_confirm``, hypotheses — each phase decided from
durable state. A second dispatch of a case whose actor is running joins it instead of
competing for the lease. In-flight cases are bounded by ``concurrency``: a dispatched or
submitted case waits in a FIFO queue (an entry, no task) and its case actor is started only
when one of the ``concurrency`` slots is free, so 10,000 submitted cases hold no leases, no
file descriptors and no tasks beyond that bound; provider requests are bounded by each
provider's ``max_concurrency`` in the gateway pool, and the actors' publications share the
publisher's group commits.

Every advance ends in a result, never an exception that would take other cases down: an
error of one case (a store hiccup, an unknown id, a bug) is that case's ERROR result. An
advance that ends with nothing more to do by itself leaves a durable status that says so
(:meth:`Engine._settled`), so the due index stops offering it. The passes over the due
index (``run_until_idle``, ``serve``) are in ``_passes.py``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
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
    HYPOTHESES_PHASE,
    INTERPRETATION,
    RETRY_PENDING,
    CaseLocked,
    CaseStatus,
    Config,
    DispatchRequest,
    DispatchResult,
    Shard,
    VianoError,
    confirm_change,
    hypotheses_paths,
    reserve_documents,
    validate_case_id,
)

from ._case_actor import (
    Clock,
    PhaseServices,
    SystemClock,
    locked_result,
    log_event,
    made_on,
    run_phase,
)
from ._gateway_pool import GatewayHandle
from ._passes import Passes
from ._store_handle import StoreHandle

_ORDER = {1: 0, 13: 1, 12: 2, 2: 3, 10: 4, 11: 5, 0: 6}  # CONTRACT: 1 > 13 > 12 > 2 > 10 > 11 > 0
RESULTS_BUFFER = 10_000  # results of submitted cases nobody has read yet (then: dropped)
FAILURE_MAX_WAIT_S = 300.0  # the longest a failing case is held back between tries
log = logging.getLogger("viano.engine")


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
    """A case taken for an advance: queued until a slot is free, then its actor's."""

    report: bool                      # submitted: its result goes to Engine.results
    done: trio.Event = attrs.field(factory=trio.Event)
    result: CaseResult | None = None


class Engine(Passes):
    """Use through :func:`open_engine`."""

    def __init__(self, store: StoreHandle, gateway: GatewayHandle, config: Config,
                 nursery: trio.Nursery, *, concurrency: int, clock: Clock,
                 shard: Shard | None = None):
        self.store, self.gateway, self.config = store, gateway, config
        self.shard = shard  # the part of the due index this engine takes work from
        self.clock = clock
        self._nursery = nursery
        self._limiter = trio.CapacityLimiter(concurrency)
        self._running: dict[str, _Running] = {}  # taken: queued or with a case actor
        self._queue: deque[str] = deque()        # taken, waiting for a slot (no task yet)
        self._active = 0                         # case actors (tasks) alive
        self._results_send, self.results = trio.open_memory_channel[CaseResult](
            RESULTS_BUFFER)
        self.dropped_results = 0
        # Cases whose advance was cut short (a case actor cancelled, or a case still
        # waiting for a slot when the engine stopped): counted as they end, so a count
        # read after the close is exact, not a race with the actors' unwinding.
        self.interrupted_cases: list[str] = []
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self.dropped_events = 0
        self.accepting = True
        self._finished = trio.Event()
        self._not_before: dict[str, float] = {}  # trio time before which a case that was
        self.locked_retry_s = 0.2                 # DEFERRED (held elsewhere) is not offered
        self.failure_retry_s = 5.0                # again; or that failed, or stays due
        self._failures: dict[str, int] = {}       # failures in a row, by case (backoff)
        self.services = PhaseServices(store, gateway, clock, self._event)

    @property
    def concurrency(self) -> int:
        return int(self._limiter.total_tokens)

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

    def _step(self, case_id: str, step: str, status: CaseStatus, revision: int,
              generation: int) -> None:
        """A step of the engine's own (a confirmation, a settled status), in the shape of
        the case actor's step events."""
        self._event({"event": "step", "case_id": case_id, "phase": status.phase,
                     "analysis_revision": revision, "package_generation": generation,
                     "step": step,
                     "status": status.status, "reason": status.reason,
                     "round": status.round})

    # -- dispatching -------------------------------------------------------------------

    def request(self, spec_key: str, attempt_id: str = "default") -> DispatchRequest:
        spec = INTERPRETATION if spec_key == "interpretation" else HYPOTHESES
        return DispatchRequest(policy=spec.configured(self.config), retry=self.config.retry,
                               attempt_id=attempt_id,
                               auto_confirm=self.config.interpretation.auto_confirm)

    async def dispatch(self, case_id: str) -> CaseResult:
        """Advance ``case_id`` as far as it can go now and return where it got to (an error
        of this case is its ERROR result, never an exception). A case already being
        advanced is joined, not dispatched twice. An id that is not a case id at all (not
        text, or against the case-id rule) is refused at once (:class:`InvalidCaseId`):
        ``dispatch(123)`` was an ERROR result with a number for its case id, and
        ``dispatch(["X"])`` a TypeError."""
        validate_case_id(case_id)
        running = self._running.get(case_id)
        if running is None:
            running = self._start(case_id, report=False)
        await running.done.wait()
        if running.result is None:
            raise VianoError(f"the engine stopped before case {case_id!r} was advanced; "
                             "only what was committed is kept", reason="engine_stopped",
                             hint="Dispatch the case again: it resumes from durable state.")
        return running.result

    def submit(self, case_id: str) -> bool:
        """Advance ``case_id`` in the background; its result arrives on :attr:`results`
        (an unknown case, or any error of it, as an ERROR result). False if it is already
        being advanced or waiting for a slot (its result arrives once), or the engine no
        longer takes work. Bounded: a submitted case waits in the engine's queue (an entry,
        no task) until one of the ``concurrency`` slots is free, so however many cases are
        submitted, at most ``concurrency`` case actors exist. An id that is not a case id
        is refused at once, as :meth:`dispatch` refuses it."""
        validate_case_id(case_id)
        if not self.accepting or case_id in self._running:
            return False
        self._start(case_id, report=True)
        return True

    @property
    def in_flight(self) -> int:
        """Cases taken for an advance and not finished: waiting for a slot, or running."""
        return len(self._running)

    @property
    def active(self) -> int:
        """Case actors alive now (at most ``concurrency``)."""
        return self._active

    @property
    def queued(self) -> int:
        """Cases waiting for a slot (they hold no task, lease or descriptor)."""
        return len(self._queue)

    def _start(self, case_id: str, *, report: bool) -> _Running:
        running = _Running(report)
        if not self.accepting:  # stopped: never advanced (a dispatch says engine_stopped)
            running.done.set()
            return running
        self._running[case_id] = running
        self._queue.append(case_id)
        self._fill_slots()
        return running

    def _fill_slots(self) -> None:
        """Start case actors for the queue's first cases while slots are free."""
        while self._queue and self.accepting and self._active < self.concurrency:
            case_id = self._queue.popleft()
            self._active += 1
            self._nursery.start_soon(self._actor, case_id, self._running[case_id])

    async def _actor(self, case_id: str, running: _Running) -> None:
        """A case actor: the case's lease for its whole advance, bounded by concurrency
        (started by :meth:`_fill_slots` only for a free slot; the limiter is a second
        guard)."""
        try:
            async with self._limiter:
                started = trio.current_time()
                try:
                    result = await self._advance(case_id)
                except Exception as exc:  # this case's error, not the engine's
                    result = await self._failure(case_id, exc)
                running.result = attrs.evolve(result, elapsed_s=trio.current_time() - started)
            self._hold_back(running.result)
            if running.report:
                try:
                    self._results_send.send_nowait(running.result)
                except trio.WouldBlock:
                    self.dropped_results += 1
        finally:
            if running.result is None:
                self.interrupted_cases.append(case_id)
            del self._running[case_id]
            self._active -= 1
            running.done.set()
            self._fill_slots()
            self._finished.set()
            self._finished = trio.Event()

    @property
    def interrupted(self) -> int:
        """How many cases' advances were cut short (exact once the engine has closed)."""
        return len(self.interrupted_cases)

    def _stop(self) -> None:
        """No new work; the cases still waiting for a slot end unadvanced (a dispatch
        waiting for one raises engine_stopped)."""
        self.accepting = False
        while self._queue:
            case_id = self._queue.popleft()
            self._running.pop(case_id).done.set()
            self.interrupted_cases.append(case_id)

    def _hold_back(self, result: CaseResult) -> None:
        """Keep a case out of the passes for a while when offering it again now would only
        repeat this result: DEFERRED (another process holds it, or it is not due), or a
        failure of the case (a store hiccup, an unknown id, a bug)."""
        r = result.result
        now = trio.current_time()
        case = result.case_id
        if r.status == DEFERRED:
            self._not_before[case] = now + self.locked_retry_s
        elif r.status == ERROR or r.reason in ("internal_error", "store_unavailable",
                                               "unknown_case"):
            # Any failure: an ERROR whose status could not be settled durably (a damaged
            # row, a refused value, a store outage) stays due, and offering it again at
            # once would spin. Each repeat waits twice as long, up to FAILURE_MAX_WAIT_S.
            n = self._failures[case] = self._failures.get(case, 0) + 1
            self._not_before[case] = now + min(self.failure_retry_s * 2 ** min(n - 1, 16),
                                               FAILURE_MAX_WAIT_S)
        else:
            self._failures.pop(case, None)

    async def wait_for_slot(self) -> None:
        """Until a case actor finishes (a slot frees up)."""
        await self._finished.wait()

    async def _advance(self, case_id: str) -> CaseResult:
        ref, head = await self.store.head(case_id)
        s = ref.status
        done = hypotheses_paths(head.manifest.analysis_revision)["hypotheses"]
        if s is not None and (s.status, s.phase, s.reason) == (
                COMPLETED, HYPOTHESES_PHASE, "completed") and \
                head.manifest.pointers.get("hypotheses") == done:
            # Done, as the index and the head say: no lease, no audit (viano verify audits).
            return CaseResult(case_id, DispatchResult(
                case_id, ref.package_id, HYPOTHESES_PHASE, COMPLETED, "completed",
                "the case is complete (its durable status says so)", ref.analysis_revision,
                ref.generation, "default"))
        interpretation = self.request("interpretation")
        try:
            async with self.store.lease(case_id):
                first = await run_phase(self.services, INTERPRETATION, case_id, interpretation)
                if first.status != COMPLETED:
                    return await self._settled(CaseResult(case_id, first))
                if self.config.interpretation.auto_confirm:
                    await self._confirm(case_id)
                second = await run_phase(self.services, HYPOTHESES, case_id,
                                         self.request("hypotheses"))
                if second.reason == "interpretation_not_confirmed":
                    waiting = attrs.evolve(
                        first, reason="awaiting_confirmation",
                        message="the interpretation is accepted; confirm it with 'viano "
                                "confirm' before hypotheses are built")
                    return await self._settled(CaseResult(case_id, waiting))
                return await self._settled(CaseResult(case_id, second))
        except CaseLocked as exc:
            return CaseResult(case_id, await locked_result(self.services, INTERPRETATION,
                                                           case_id, interpretation, exc))

    async def _settled(self, result: CaseResult) -> CaseResult:
        """A case whose advance ended with nothing more to do by itself (COMPLETED, BLOCKED,
        ERROR) gets the durable status its result says, if the status says anything else:
        a refusal publishes nothing, so a status left READY by intake, RETRY_PENDING by a
        round (before a policy change or a lower max_rounds made the next round
        impossible), or awaiting confirmation would keep the due index offering the case
        forever. A round not yet due (DEFERRED not_due) gets the RETRY_PENDING status with
        its due time. Done after the whole advance: a crash before it leaves the case due,
        which only costs a dispatch."""
        r = result.result
        if r.status == DEFERRED and r.reason == "not_due" and r.due_at is not None:
            # The history's next round is not due, yet the index offered the case: a
            # status that lost its due time (an import sets READY). Offered again every
            # locked_retry_s until then (hours), it was a busy loop; the status the round
            # would have left stops it.
            status = CaseStatus(status=RETRY_PENDING, phase=r.phase,
                                reason="providers_unavailable", round=r.round,
                                max_rounds=r.max_rounds, due_at=r.due_at,
                                attempt_id=r.attempt_id)
        elif r.status in (COMPLETED, BLOCKED, ERROR):
            status = CaseStatus(status=r.status, phase=r.phase, reason=str(r.reason))
        else:
            return result
        ref, snap = await self.store.head(result.case_id)
        s = ref.status
        if s is None or (s.status, s.phase, s.reason, s.due_at) != (
                status.status, status.phase, status.reason, status.due_at):
            await snap.set_status(status)
            self._step(result.case_id, "settle", status, ref.analysis_revision,
                       ref.generation)
        return result

    async def _confirm(self, case_id: str) -> None:
        _ref, snap, made = await self.store.head_with(
            case_id, lambda snap: made_on(
                snap, lambda view: confirm_change(view, "policy:auto_confirm")))
        if made is not None:
            after = await snap.publish(*made)
            self._step(case_id, "confirm", made[1], after.manifest.analysis_revision,
                       after.generation)

    async def _failure(self, case_id: str, exc: Exception) -> CaseResult:
        """``exc`` as this case's ERROR result (and an event): the other cases go on."""
        if isinstance(exc, VianoError):
            reason, message = exc.reason, exc.message
        else:
            reason, message = "internal_error", f"unexpected {type(exc).__name__} (a bug)"
            log.error("case %s: unexpected error", case_id, exc_info=exc)
        try:
            ref = await self.store.case(case_id)
            where: tuple[str, str, int, int] = (ref.package_id, ref.phase,
                                                ref.analysis_revision, ref.generation)
        except VianoError:
            where = ("", "", 0, 0)
        result = DispatchResult(case_id, where[0], where[1], ERROR, reason, message, where[2],
                                where[3], "default")
        self._event({"event": "result", **result.to_json()})
        return CaseResult(case_id, result)


def check_concurrency(concurrency: object) -> None:
    """``ValueError`` unless ``concurrency`` is an integer >= 1 (``math.inf`` was taken,
    and the document cache's reservation then left ``nan`` behind it: never evicting)."""
    if type(concurrency) is not int or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, not {concurrency!r}")


@asynccontextmanager
async def open_engine_on(store: StoreHandle, gateway: GatewayHandle, config: Config, *,
                         concurrency: int = 16, clock: Clock | None = None,
                         shard: Shard | None = None) -> AsyncIterator[Engine]:
    """The supervisor over handles the caller opened (and will close, gateway after store).
    Leaving the block takes no new work and cancels the case actors still running — their
    model calls are cancelled; a publication already sent still commits whole (the
    publisher's commit is shielded), so only checkpointed state is left. ``shard``: the
    engine finds work (``due``, ``run_until_idle``, ``serve``) among that shard's cases
    only, so that processes sharing a store each take their own part; cases given by id
    are advanced whatever their shard."""
    check_concurrency(concurrency)
    # The phases' document cache holds each case in flight's documents between its
    # steps: without the room, 512 in flight read each case's back 17 times, not 3.
    with reserve_documents(concurrency):
        async with trio.open_nursery() as nursery:
            engine = Engine(store, gateway, config, nursery, concurrency=concurrency,
                            clock=clock or SystemClock(), shard=shard)
            try:
                yield engine
            finally:
                engine._stop()
                nursery.cancel_scope.cancel()
                engine._results_send.close()
                for sub in engine._subscribers:
                    sub.close()
