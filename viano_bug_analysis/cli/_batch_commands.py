"""Many cases at once: ``viano run`` (one pass), ``viano batch`` (until every case is
COMPLETED, BLOCKED or ERROR; with ``--wait`` through due retries too) and ``viano daemon``
(long-running; new cases and due retries from the store's due index).

Interrupting a batch (Ctrl-C) or stopping a daemon (SIGTERM, SIGINT) takes no new work,
cancels the model calls in flight, lets the commits in flight finish, and prints what was
done; running the same command again resumes from durable state (finished cases are skipped
because the store says they are done)."""

from __future__ import annotations

import argparse
import resource
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio

from actors import CaseResult, Engine, log_event, worst_exit
from engine import EXIT_INTERRUPTED, Config, UsageError, VianoError

from .._engine import open_engine
from ._context import store_location, store_shown
from ._output import Output
from ._phase_commands import require_providers


def _selection(args: argparse.Namespace) -> list[str] | None:
    if args.all and args.cases:
        raise UsageError("give case ids or --all, not both")
    if not args.all and not args.cases:
        raise UsageError("give the case ids to advance, or --all")
    return None if args.all else list(args.cases)


class _Tally:
    """Counts by status, publications per transaction, providers; a progress bar on a
    terminal, a plain line per result elsewhere."""

    def __init__(self, out: Output, total: int | None, advance: Callable[[int], None],
                 set_text: Callable[[str], None]):
        self.out, self.total = out, total
        self.advance, self.set_text = advance, set_text
        self.final: dict[str, CaseResult] = {}
        self.started = time.monotonic()

    def add(self, result: CaseResult) -> None:
        previous = self.final.get(result.case_id)
        self.final[result.case_id] = result
        if previous is None:
            self.advance(1)
        counts = Counter(r.result.status for r in self.final.values())
        self.set_text(" ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        repeat = previous is not None and (previous.result.status, previous.result.reason) == (
            result.result.status, result.result.reason)  # a held case tried again: said
        if not self.out.as_json and not self.out.err.is_terminal and not repeat:
            r = result.result
            self.out.line(f"{r.case_id} {r.status} {r.reason} (phase {r.phase}, generation "
                          f"{r.package_generation})")

    def summary(self, engine: Engine, interrupted: bool) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        stats = engine.store.stats
        return {"cases": len(self.final), "interrupted": interrupted,
                # cut short with no result (a model call in flight, or waiting for a slot):
                # their committed state is kept, and the same command resumes them
                "interrupted_cases": sorted(engine.interrupted_cases),
                "by_status": dict(sorted(Counter(r.result.status
                                                  for r in self.final.values()).items())),
                "by_reason": dict(sorted(Counter(str(r.result.reason)
                                                  for r in self.final.values()).items())),
                "seconds": round(elapsed, 3),
                "case_seconds": _quantiles([r.elapsed_s for r in self.final.values()]),
                "cases_per_s": round(len(self.final) / elapsed, 2) if elapsed else None,
                "store": stats.to_json(),
                "providers": {n: s.to_json() for n, s in engine.gateway.pool.stats.items()},
                "dropped_events": engine.dropped_events}


def _quantiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 of the cases' advance times (the last advance of each case)."""
    if not values:
        return {"p50": None, "p99": None}
    ordered = sorted(values)
    return {q: round(ordered[min(len(ordered) - 1, int(f * len(ordered)))], 4)
            for q, f in (("p50", 0.5), ("p99", 0.99))}


def _print_summary(out: Output, summary: dict[str, Any], results: list[CaseResult]) -> None:
    if out.as_json:
        out.document({"summary": summary, "results": [r.to_json() for r in results]})
        return
    if out.err.is_terminal:
        for r in results:
            out.line(f"{r.case_id}: {r.result.status} ({r.result.reason})")
    counts = ", ".join(f"{k} {v}" for k, v in summary["by_status"].items()) or "no cases"
    stopped = summary["interrupted_cases"]
    if stopped:  # they have no result, so "0 cases" alone said nothing of them
        shown = ", ".join(stopped[:SHOWN_STOPPED]) + (
            f" and {len(stopped) - SHOWN_STOPPED} more" if len(stopped) > SHOWN_STOPPED else "")
        out.line(f"{len(stopped)} case(s) stopped before a result, their committed state "
                 f"kept: {shown}")
    out.line(f"{summary['cases']} cases: {counts}; {summary['seconds']}s; "
             f"{summary['store']['publications_per_transaction']} publications per "
             "transaction" + (" (interrupted: run the same command to resume)"
                              if summary["interrupted"] else ""))


SHOWN_STOPPED = 20  # case ids named on the line of cases stopped before a result


@contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """From the start of ``trio.run`` until :func:`_stoppable` takes the signals over, a
    SIGTERM is what a Ctrl-C is (trio's own handler, which interrupts only where that is
    safe), not the end of the process with nothing said: the command reports it as an
    interruption (under ``--json``, in its one document)."""
    ctrl_c = signal.getsignal(signal.SIGINT)
    if not callable(ctrl_c):  # SIGINT ignored or default: leave SIGTERM as it is
        yield
        return
    # Delivered as the SIGINT that trio's handler expects to see.
    previous = signal.signal(signal.SIGTERM,
                             lambda _signum, frame: ctrl_c(signal.SIGINT, frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@asynccontextmanager
async def _stoppable() -> AsyncIterator[tuple[trio.Event, trio.CancelScope]]:
    """SIGINT and SIGTERM, taken over for the whole command: the first sets ``stop`` and
    cancels the work scope (model calls in flight are cancelled, commits in flight finish);
    any further one is ignored, so a second Ctrl-C or SIGTERM during the orderly shutdown
    cannot kill the process halfway through it."""
    stop = trio.Event()
    work = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async def watch() -> None:
            async for _ in signals:
                if not stop.is_set():
                    stop.set()
                    work.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            try:
                yield stop, work
            finally:
                nursery.cancel_scope.cancel()


async def _batch(args: argparse.Namespace, out: Output, config: Config, *, wait: bool,
                 passes: int | None) -> tuple[list[CaseResult], dict[str, Any]]:
    selection = _selection(args)
    check_concurrency(args.concurrency)
    with _sigterm_as_ctrl_c():
        return await _batch_stoppable(args, out, config, selection, wait=wait, passes=passes)


async def _batch_stoppable(args: argparse.Namespace, out: Output, config: Config,
                           selection: list[str] | None, *, wait: bool, passes: int | None
                           ) -> tuple[list[CaseResult], dict[str, Any]]:
    async with _stoppable() as (stop, work):
        engine: Engine | None = None
        tally: _Tally | None = None
        with work:
            async with open_engine(store=store_location(args, config), config=config,
                                   concurrency=args.concurrency, create=False) as engine:
                if selection is not None:
                    for case_id in selection:
                        await engine.store.case(case_id)  # unknown ids: refused first
                    total = len(selection)
                else:
                    total = len(await engine.waiting(1_000_000))
                with out.progress_with_text("cases", total) as (advance, set_text):
                    tally = _Tally(out, total, advance, set_text)
                    await _passes(engine, selection, tally, wait=wait, passes=passes)
        if engine is None or tally is None:  # stopped before it began
            raise KeyboardInterrupt
        return list(tally.final.values()), tally.summary(engine, stop.is_set())


LOCKED_RETRY_S = 0.2  # how soon a case another process holds is tried again


async def _passes(engine: Engine, selection: list[str] | None, tally: _Tally, *,
                  wait: bool, passes: int | None) -> None:
    """Passes until no case has work this batch can do (or ``passes`` of them). Each pass
    advances every case with work now, each once; a case is offered again only if it is
    due afresh (a retry whose time came, a case another process released), so a case
    whose result does not change its state ends the batch instead of looping. A case
    another process holds is tried again after a short pause and reported where that
    process left it; with ``wait``, sleep until the earliest due retry and go on."""
    done = 0
    while passes is None or done < passes:
        done += 1
        await engine.run_until_idle(selection, on_result=tally.add)
        if passes is not None and done >= passes:
            return
        held = sorted(r.case_id for r in tally.final.values()
                      if r.result.status == "DEFERRED"
                      and r.result.reason in ("locked", "stale_generation"))
        if selection is None and await engine.due(1):
            continue  # due afresh: a retry's time came, or a case was released
        if held:
            await trio.sleep(LOCKED_RETRY_S)
            if selection is None:
                await engine.run_until_idle(held, on_result=tally.add)
            continue
        soonest = await _next_retry(engine, selection, tally) if wait else None
        if soonest is None:
            return
        await trio.sleep(max(0.0, soonest - engine.clock.now()))


async def _next_retry(engine: Engine, selection: list[str] | None, tally: _Tally
                      ) -> float | None:
    """When the next retry this batch waits for is due: of any case in the store (one
    pending from before the batch began included: the batch waited only for the retries
    its own rounds had made), or of the selected cases as their last results left them."""
    if selection is None:
        return await engine.store.run_sync(engine.store.store.next_due)
    dues = [r.result.due_at for r in tally.final.values()
            if r.result.due_at is not None and (
                r.result.status == "RETRY_PENDING"
                or (r.result.status == "DEFERRED" and r.result.reason == "not_due"))]
    return min(dues, default=None)


MAX_CONCURRENCY = 10_000


def check_concurrency(concurrency: int) -> None:
    """In-flight cases each hold a lease (a descriptor) and share the HTTP connections:
    refused beyond what the process may open, rather than failing halfway (EMFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = MAX_CONCURRENCY if soft == resource.RLIM_INFINITY else (soft - 128) // 2
    if room < 1:  # no --concurrency fits: it said "at most -14", and to lower it
        raise UsageError(f"this process may open only {soft} files, too few to run cases "
                         f"(the store, the HTTP clients and one case need {128 + 2})",
                         hint="Raise the limit (ulimit -n 1024, say), then run it again.")
    if concurrency > min(room, MAX_CONCURRENCY):
        raise UsageError(f"--concurrency {concurrency} is more than this process can hold "
                         f"in flight (at most {min(room, MAX_CONCURRENCY)} with its limit of "
                         f"{soft} open files)",
                         hint="Lower --concurrency, or raise the limit (ulimit -n).")


def cmd_run(args: argparse.Namespace, out: Output, config: Config) -> int:
    require_providers(config)
    out.outlives_reader = True
    results, summary = trio.run(lambda: _batch(args, out, config, wait=False, passes=1))
    _print_summary(out, summary, results)
    return EXIT_INTERRUPTED if summary["interrupted"] else worst_exit(
        [r.exit_code for r in results])


def cmd_batch(args: argparse.Namespace, out: Output, config: Config) -> int:
    require_providers(config)
    out.outlives_reader = True
    results, summary = trio.run(lambda: _batch(args, out, config, wait=args.wait,
                                               passes=None))
    _print_summary(out, summary, results)
    return EXIT_INTERRUPTED if summary["interrupted"] else worst_exit(
        [r.exit_code for r in results])


def cmd_daemon(args: argparse.Namespace, out: Output, config: Config) -> int:
    require_providers(config)
    out.outlives_reader = True
    check_concurrency(args.concurrency)
    try:
        trio.run(_daemon, args, out, config)
    except KeyboardInterrupt:  # a signal before the daemon took the signals over
        _stopped_before_start(out)
    return 0


def _stopped_before_start(out: Output) -> None:
    out.note("viano daemon stopped before it started")
    if out.as_json and not out.documents:
        out.document({"summary": {"stopped_before_start": True, "results_by_status": {},
                                  "interrupted_in_flight": 0}})


async def _daemon(args: argparse.Namespace, out: Output, config: Config) -> None:
    """Until SIGTERM/SIGINT: the engine's serve loop, with its results printed (with
    ``--json``: one summary document when it stops)."""
    with _sigterm_as_ctrl_c():
        await _serve(args, out, config)


async def _serve(args: argparse.Namespace, out: Output, config: Config) -> None:
    counts: Counter[str] = Counter()
    final: dict[str, Any] = {}
    async with _stoppable() as (_stop, work):
        engine: Engine | None = None
        with work:
            async with open_engine(store=store_location(args, config), config=config,
                                   concurrency=args.concurrency, create=False) as engine:
                out.note(f"viano daemon: {store_shown(args, config)}, concurrency "
                         f"{args.concurrency}; SIGTERM or Ctrl-C stops it")
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_report_results, engine, out, counts)
                        await engine.serve(poll_s=args.poll_s)
                finally:  # the store's counts as the daemon stops, while it is open
                    with trio.CancelScope(shield=True):
                        final = await _case_counts(engine)
        if engine is None:
            _stopped_before_start(out)
            return
        in_flight = engine.interrupted  # exact now that every actor has ended
        while True:  # the results that arrived as it stopped count too
            try:
                counts[engine.results.receive_nowait().result.status] += 1
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        log_event(_providers_event(engine) | final | {"in_flight": in_flight})
        out.note(f"viano daemon stopped: {in_flight} case(s) were in flight; their "
                 "committed state is kept")
        if out.as_json:
            stats = {k: v for k, v in _providers_event(engine).items()
                     if k not in ("event", "in_flight")}
            out.document({"summary": {"results_by_status": dict(sorted(counts.items())),
                                      "interrupted_in_flight": in_flight, **stats,
                                      **final}})


PROVIDERS_EVERY_S = 30.0  # how often a daemon logs its providers' statistics


async def _report_results(engine: Engine, out: Output, counts: Counter[str]) -> None:
    """A line per result (not the DEFERRED ones of cases another process holds: those are
    only retried); and, at most every PROVIDERS_EVERY_S while results come, one
    ``providers`` event (answers, failures by class, cooldowns per provider) for a user
    watching the daemon through ``--log-json``."""
    last = trio.current_time()
    async for result in engine.results:
        r = result.result
        counts[r.status] += 1
        if not out.as_json and r.status != "DEFERRED":
            out.line(f"{r.case_id} {r.status} {r.reason} (phase {r.phase}, generation "
                     f"{r.package_generation})")
        if trio.current_time() - last >= PROVIDERS_EVERY_S:
            last = trio.current_time()
            log_event(_providers_event(engine) | await _case_counts(engine))


async def _case_counts(engine: Engine) -> dict[str, Any]:
    """The store's cases by phase and status (what ``viano status --summary`` shows), for
    the ``providers`` event: one indexed GROUP BY, not a scan of the packages."""
    try:
        counts = await engine.store.run_sync(engine.store.store.status_counts)
    except VianoError:  # the store went away: the event carries what it has
        return {}
    by: dict[str, dict[str, int]] = {}
    for (phase, status), n in sorted(counts.items()):
        by.setdefault(phase, {})[status] = n
    return {"cases": sum(counts.values()), "by_phase_and_status": by}


def _providers_event(engine: Engine) -> dict[str, Any]:
    return {"event": "providers",
            "providers": {n: s.to_json() for n, s in engine.gateway.pool.stats.items()},
            "store": engine.store.stats.to_json(), "in_flight": engine.in_flight}
