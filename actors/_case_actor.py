"""The case actor: one dispatch of one phase of one case, carried out step by step.

It takes the case's lease without waiting (busy → DEFERRED ``locked``) and holds it for the
whole dispatch. Each step is decided from durable state alone (``engine.decide`` over the
head generation and the case's status), carried out — a publication through the publisher,
or a round through the gateway pool — and the next step decided again from what is now
durable, never from memory of an earlier call. The first step reads the head; a later one
starts from the generation and status its own step committed, which is what the head is
while the lease is held (reading it again was ~5 of a case's 7 head reads, ~7% of its CPU);
each such step checks first that the lease is still held (``check_lease``, as a head read
does: a lease lost to another host raises ``StaleGeneration`` ``lease_lost`` before any
model call, and that store refuses the worker's commits for the case from then on).
A writer that ignores the lease is still caught: every publication and status is fenced by
the generation it was decided on (``StaleGeneration``: DEFERRED ``stale_generation``). It
never sleeps for a due time.

Cancellation at any await leaves only committed generations: a publication that was sent
commits whole or not at all (the publisher's commit is shielded), a round that was not
recorded is simply asked again by a later dispatch (at-least-once, counted in the status as
``calls_started``), and the next dispatch resumes from what is durable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import attrs
import trio

from engine import (
    COMPLETED,
    DEFERRED,
    ERROR,
    CaseLocked,
    CaseStatus,
    Change,
    DispatchRequest,
    DispatchResult,
    Enter,
    Finish,
    HistoryProblem,
    Judge,
    PackageView,
    PhaseRefused,
    PhaseSpec,
    Refusal,
    RoundRequest,
    RunRound,
    StaleGeneration,
    VianoError,
    crash_point,
    decide,
    enter_change,
    judge_change,
    load_state,
    prompt_for,
    reading_bound,
    round_change,
    running,
    store_errors_first,
    utc_now_iso,
)

from ._gateway_pool import GatewayHandle
from ._store_handle import Snapshot, StoreHandle

MAX_STEPS = 16
# A case whose files add up to more (engine.reading_bound: a tar counted at what it may
# expand to) is planned on a worker thread, also on SQLite: a plan derives the case's
# context, which reads every attachment it excerpts to its end (the store's hash check),
# ~2 ms per MiB here, and inflates a compressed tar up to its members' heads; inline that
# would hold every other case's event loop for as long.
INLINE_PLAN_BYTES = 4 << 20
R = TypeVar("R")
log = logging.getLogger("viano.events")


class Clock(Protocol):
    """Wall-clock time (POSIX seconds) for due times and records; injectable so tests run
    in virtual time."""

    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


@attrs.frozen
class TrioClock:
    """Wall time that follows trio's clock: ``start`` plus ``trio.current_time()`` (with
    ``autojump_clock``, due times pass in virtual time)."""

    start: float = 1_800_000_000.0

    def now(self) -> float:
        return self.start + trio.current_time()


Events = Callable[[dict[str, Any]], None]


def log_event(event: dict[str, Any]) -> None:
    """The default event sink: one record on the ``viano.events`` logger (the CLI's
    ``--log-json`` turns those into JSON lines)."""
    log.info("%s", event.get("event"), extra={"viano_event": event})


@attrs.frozen
class PhaseServices:
    store: StoreHandle
    gateway: GatewayHandle
    clock: Clock = attrs.field(factory=SystemClock)
    events: Events = log_event


async def dispatch_phase(services: PhaseServices, spec: PhaseSpec, case_id: str,
                         request: DispatchRequest, *, package_id: str | None = None,
                         ) -> DispatchResult:
    """One dispatch of ``spec`` for ``case_id``: as far as the phase can go now, holding
    the case's lease (busy: DEFERRED ``locked``)."""
    try:
        async with services.store.lease(case_id):
            return await run_phase(services, spec, case_id, request, package_id=package_id)
    except CaseLocked as exc:
        return await locked_result(services, spec, case_id, request, exc)


async def locked_result(services: PhaseServices, spec: PhaseSpec, case_id: str,
                        request: DispatchRequest, exc: CaseLocked) -> DispatchResult:
    ref = await services.store.case(case_id)
    result = DispatchResult(case_id, ref.package_id, spec.phase, DEFERRED, "locked",
                            exc.message, ref.analysis_revision, ref.generation,
                            request.attempt_id)
    _emit(services, result)
    return result


async def run_phase(services: PhaseServices, spec: PhaseSpec, case_id: str,
                    request: DispatchRequest, *, package_id: str | None = None,
                    ) -> DispatchResult:
    """The body of a dispatch, for a caller that already holds the case's lease (a case
    actor running several phases of one case under one lease)."""
    return await _Dispatch(services, spec, case_id, request, package_id).run()


class _Dispatch:
    def __init__(self, services: PhaseServices, spec: PhaseSpec, case_id: str,
                 request: DispatchRequest, package_id: str | None):
        self.s, self.spec, self.case_id = services, spec, case_id
        self.request, self.package_id = request, package_id
        self.fresh_intent: tuple[int, str] | None = None  # an intent just made durable
        self._last: Snapshot | None = None  # the head of the step being planned (its errors)
        # What this dispatch's own last step committed (its generation and the status that
        # went with it): the next step's head, without reading it again.
        self._committed: tuple[Snapshot, CaseStatus | None] | None = None
        # The store's own error on a read of this step's head (a damaged blob, a store that
        # cannot be read): the phases see it as a file that cannot be read, a history
        # problem, but the result names the store's reason, which says what to do.
        self._store_fault: VianoError | None = None
        self._big = False  # the case is planned on a worker thread (INLINE_PLAN_BYTES)

    async def run(self) -> DispatchResult:
        for _ in range(MAX_STEPS):
            # One job per step: read the head, derive the state, decide, and prepare what
            # the step needs (on this thread for SQLite: StoreHandle.run_local).
            now = self.s.clock.now()
            try:
                planned = None
                if not self._big:
                    planned = await self.s.store.run_local(self._plan, now, True)
                if planned is None:  # a big case: planned on a worker thread
                    planned = await self.s.store.run_sync(self._plan, now, False)
                assert planned is not None  # not local: never put off
            except HistoryProblem as exc:
                if self._last is None:
                    raise
                return self._result(self._last, ERROR, "unsupported_history", str(exc))
            snap, step, work = planned
            try:
                if isinstance(step, Finish):
                    if step.durable:
                        await snap.set_status(CaseStatus(
                            status=step.status, phase=self.spec.phase,
                            reason=str(step.reason), round=step.round,
                            max_rounds=step.max_rounds, attempt_id=self.request.attempt_id))
                    return self._result(snap, step.status, step.reason, step.message,
                                        step.round, step.max_rounds, step.due_at)
                if isinstance(step, Enter):
                    done = await self._enter(snap, work)
                elif isinstance(step, RunRound):
                    done = await self._round(snap, step, work)
                else:
                    done = await self._judge(snap, step, work)
            except StaleGeneration as exc:
                return self._result(snap, DEFERRED, "stale_generation",
                                    f"another writer moved the case: {exc.message}")
            except HistoryProblem as exc:  # what a step read back does not stand up
                return self._result(snap, ERROR, "unsupported_history", str(exc))
            if done is not None:
                return done
        raise VianoError(f"the dispatch of {self.case_id!r} did not settle in {MAX_STEPS} "
                         "steps")

    def _plan(self, now: float, local: bool) -> tuple[Snapshot, Any, Any] | None:
        """In one job (``run_local``): the head, the state it gives, the step, and that step's
        pure work (enter: the change; round: the prompt; judge: the verdict). ``None``, with
        the head kept for the next call, when it runs on the event loop's thread
        (``local``, SQLite) and the case's files are too big to read there (see
        :data:`INLINE_PLAN_BYTES`)."""
        store = self.s.store
        committed, self._committed = self._committed, None
        status: CaseStatus | None
        if committed is not None:
            # The lease still held is what makes the committed state the head (the check
            # a head read makes; on PostgreSQL a stall can lose the lease to another host).
            store.store.check_lease(self.case_id)
            snap, status = committed
        else:
            ref, manifest = store.store.head(self.case_id)
            if self.package_id is not None and manifest.package_id != self.package_id:
                raise PhaseRefused(f"case {self.case_id!r} is package "
                                   f"{manifest.package_id}, not {self.package_id}",
                                   reason="package_mismatch",
                                   hint="Pass the package_id from the case's manifest "
                                        "('viano show CASE').")
            snap, status = Snapshot(store, manifest), ref.status
        self._last = snap
        self._store_fault = None
        view = view_of(snap, self._fault)
        if local and committed is None and not store.store.reads_block and \
                reading_bound(view, INLINE_PLAN_BYTES) > INLINE_PLAN_BYTES:
            self._big, self._committed = True, (snap, status)
            return None
        step = decide(load_state(self.spec, view, status, self.request), self.request, now)
        work: Any = None
        if isinstance(step, Enter):
            work = enter_change(self.spec, view, self.request)
        elif isinstance(step, RunRound):
            work = (view, prompt_for(self.spec, view))
        elif isinstance(step, Judge):
            work = judge_change(self.spec, view, step, self.request)
        return snap, step, work

    async def _enter(self, snap: Snapshot, made: Any) -> DispatchResult | None:
        if isinstance(made, Refusal):
            return self._result(snap, made.status, made.reason, made.message)
        change, status = made
        after = await snap.publish(change, status)
        self._committed = (after, status)
        crash_point("phase.entered")
        self.fresh_intent = (1, self.request.attempt_id)
        self._step(after, "enter", status)
        return None

    async def _round(self, snap: Snapshot, step: RunRound, work: Any
                     ) -> DispatchResult | None:
        view, prompt = work
        calls = step.calls_started
        if self.fresh_intent == (step.round, step.attempt_id):
            calls = 1  # the enter generation recorded this call's intent
        else:
            intent = running(self.spec, step.round, step.attempt_id, calls)
            await snap.set_status(intent)
            self._step(snap, "call", intent)  # the intent of a call, durable before it
        self.fresh_intent = None
        step = attrs.evolve(step, calls_started=calls)
        policy = self.spec.policy(self.request)
        started = utc_now_iso()
        outcome = await self.s.gateway.round(RoundRequest(
            prompt, max_output_bytes=self.spec.max_output_bytes(policy)))
        crash_point("phase.answered")
        now = self.s.clock.now()
        record = await self.s.store.run_local(lambda: round_change(
            self.spec, view, step, outcome, self.request, now=now, started_at=started))
        after = await snap.publish(record.change, record.status)
        self._committed = (after, record.status)
        crash_point("phase.recorded")
        self._step(after, "round", record.status, provider=outcome.provider,
                   attempts=[{"provider": a.provider, "detail": a.detail,
                              "failure": None if a.failure is None else str(a.failure.value)}
                             for a in outcome.attempts])
        if record.result_status == COMPLETED:
            return None  # checkpointed: judge it next
        return self._result(after, record.result_status, record.reason, record.message,
                            step.round, self.request.retry.max_rounds, record.due_at)

    async def _judge(self, snap: Snapshot, step: Judge, verdict: Any) -> DispatchResult:
        after = await snap.publish(verdict.change, verdict.status)
        self._committed = (after, verdict.status)
        crash_point("phase.judged")
        self._step(after, "accept" if verdict.result_status == COMPLETED else "reject",
                   verdict.status)
        return self._result(after, verdict.result_status, verdict.reason, verdict.message,
                            step.round.round, self.request.retry.max_rounds)

    def _fault(self, exc: VianoError) -> None:
        if self._store_fault is None:
            self._store_fault = exc

    def _result(self, snap: Snapshot, status: str, reason: str | None, message: str,
                round_no: int | None = None, max_rounds: int | None = None,
                due_at: float | None = None) -> DispatchResult:
        m = snap.manifest
        if status == ERROR and self._store_fault is not None:
            # What the step read was incomplete, so the store's error is the cause (not the
            # history, the interpretation or the case it could not read): store_corrupt,
            # store_unavailable.
            reason = self._store_fault.reason
        result = DispatchResult(m.case_id, m.package_id, self.spec.phase, status, reason,
                                message, m.analysis_revision, m.package_generation,
                                self.request.attempt_id, round_no, max_rounds, due_at)
        _emit(self.s, result)
        return result

    def _step(self, snap: Snapshot, step: str, status: CaseStatus, **extra: Any) -> None:
        m = snap.manifest
        self.s.events({"event": "step", "case_id": m.case_id, "phase": self.spec.phase,
                       "analysis_revision": m.analysis_revision,
                       "package_generation": m.package_generation, "step": step,
                       "status": status.status, "reason": status.reason,
                       "round": status.round, **extra})


def view_of(snap: Snapshot, on_fault: Callable[[VianoError], None] | None = None
            ) -> PackageView:
    """The snapshot's generation as the phases read it; ``on_fault`` is told of each error
    the store raises on a read, also on a stream's read (the view turns it into a
    :class:`HistoryProblem`)."""
    store = snap.handle.store
    return PackageView(snap.manifest, store.read_blob, store.open_blob, on_fault)


def _emit(services: PhaseServices, result: DispatchResult) -> None:
    services.events({"event": "result", **result.to_json()})


def made_on(snap: Snapshot, make: Callable[[PackageView], R]) -> R:
    """``make`` on the snapshot's view; a refusal of a step whose read the store failed
    is the store's error (a confirm said ``interpretation_mismatch``)."""
    return store_errors_first(lambda on_fault: view_of(snap, on_fault), make)


async def case_operation(store: StoreHandle, case_id: str,
                         make: Callable[[PackageView], tuple[Change, CaseStatus] | None],
                         ) -> Snapshot | None:
    """A case operation (confirm, reopen, unblock) under the case's lease: ``make`` builds
    the change from the head (on a worker thread), and it is published on top of exactly
    that head. ``None`` when there is nothing to do."""
    async with store.lease(case_id):
        _ref, snap, made = await store.head_with(case_id, lambda snap: made_on(snap, make))
        if made is None:
            return None
        change, status = made
        return await snap.publish(change, status)

