"""Many cases at once: ``viano run`` (one pass), ``viano batch`` (until every case is
COMPLETED, BLOCKED or ERROR; with ``--wait`` through due retries too) and ``viano daemon``
(long-running; new cases and due retries from the store's due index).

Interrupting a batch (Ctrl-C) or stopping a daemon (SIGTERM, SIGINT) takes no new work,
cancels the model calls in flight, lets the commits in flight finish, and prints what was
done; running the same command again resumes from durable state (finished cases are skipped
because the store says they are done)."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import trio

from actors import CaseResult, Engine, log_event, worst_exit
from engine import EXIT_INTERRUPTED, RETRY_PENDING, Config, Shard, VianoError

from .._engine import open_engine
from ._batch_common import (
    MAX_CONCURRENCY as MAX_CONCURRENCY,
)
from ._batch_common import (
    Tally,
    check_concurrency,
    print_summary,
    selection_of,
    sigterm_as_ctrl_c,
    stoppable,
)
from ._batch_workers import WorkerTally, run_workers, share_of_config
from ._context import store_location, store_shown
from ._next_steps import next_step
from ._output import Output
from ._phase_commands import require_providers


async def _batch(args: argparse.Namespace, out: Output, config: Config, *, wait: bool,
                 passes: int | None) -> tuple[list[CaseResult], dict[str, Any]]:
    selection = selection_of(args)
    check_concurrency(args.concurrency)
    with sigterm_as_ctrl_c():
        return await _batch_stoppable(args, out, config, selection, wait=wait, passes=passes)


async def _batch_stoppable(args: argparse.Namespace, out: Output, config: Config,
                           selection: list[str] | None, *, wait: bool, passes: int | None
                           ) -> tuple[list[CaseResult], dict[str, Any]]:
    worker: Shard | None = args.worker_shard  # one of `--processes N`'s workers
    if worker is not None:
        config = share_of_config(config, worker)
    async with stoppable(watch_parent=worker is not None) as (stop, work):
        engine: Engine | None = None
        tally: Tally | None = None
        with work:
            async with open_engine(store=store_location(args, config), config=config,
                                   concurrency=args.concurrency, create=False,
                                   shard=worker) as engine:
                if selection is not None:
                    for case_id in selection:
                        await engine.store.case(case_id)  # unknown ids: refused first
                    if worker is not None:
                        selection = [c for c in selection if worker.holds(c)]
                    total = len(selection)
                else:
                    total = len(await engine.waiting(1_000_000))
                if worker is not None:
                    tally = WorkerTally(out, total)
                    await _passes(engine, selection, tally, wait=wait, passes=passes)
                else:
                    with out.progress_with_text("cases", total) as (advance, set_text):
                        tally = Tally(out, total, advance, set_text)
                        await _passes(engine, selection, tally, wait=wait, passes=passes)
        if engine is None or tally is None:  # stopped before it began
            raise KeyboardInterrupt
        return list(tally.final.values()), tally.summary(engine, stop.is_set())


LOCKED_RETRY_S = 0.2  # how soon a case another process holds is tried again


async def _passes(engine: Engine, selection: list[str] | None, tally: Tally, *,
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


async def _next_retry(engine: Engine, selection: list[str] | None, tally: Tally
                      ) -> float | None:
    """When the next retry this batch waits for is due: of any case in the store (one
    pending from before the batch began included: the batch waited only for the retries
    its own rounds had made), or of the selected cases as their last results left them."""
    if selection is None:
        return await engine.next_due()
    dues = [r.result.due_at for r in tally.final.values()
            if r.result.due_at is not None and (
                r.result.status == "RETRY_PENDING"
                or (r.result.status == "DEFERRED" and r.result.reason == "not_due"))]
    return min(dues, default=None)


def cmd_run(args: argparse.Namespace, out: Output, config: Config) -> int:
    return _many(args, out, config, wait=False, passes=1)


def cmd_batch(args: argparse.Namespace, out: Output, config: Config) -> int:
    return _many(args, out, config, wait=args.wait, passes=None)


def _many(args: argparse.Namespace, out: Output, config: Config, *, wait: bool,
          passes: int | None) -> int:
    """``run`` and ``batch``: in this process, or spread over ``--processes`` workers (each
    this command again, on its shard of the cases: see ``_batch_workers``)."""
    require_providers(config)
    out.outlives_reader = True
    if args.processes > 1:
        return run_workers(args, out, config)
    results, summary = trio.run(lambda: _batch(args, out, config, wait=wait,
                                               passes=passes))
    code = EXIT_INTERRUPTED if summary["interrupted"] else worst_exit(
        [r.exit_code for r in results])
    if args.worker_shard is not None:
        WorkerTally.finish(summary, code)
    else:
        print_summary(out, summary, results)
    return code


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
    with sigterm_as_ctrl_c():
        await _serve(args, out, config)


async def _serve(args: argparse.Namespace, out: Output, config: Config) -> None:
    counts: Counter[str] = Counter()
    final: dict[str, Any] = {}
    async with stoppable() as (_stop, work):
        engine: Engine | None = None
        with work:
            async with open_engine(store=store_location(args, config), config=config,
                                   concurrency=args.concurrency, create=False,
                                   shard=args.shard) as engine:
                shard = "" if args.shard is None else f", shard {args.shard}"
                out.note(f"viano daemon: {store_shown(args, config)}, concurrency "
                         f"{args.concurrency}{shard}; SIGTERM or Ctrl-C stops it")
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
            hint = None if r.status == RETRY_PENDING else next_step(r.reason, r.case_id,
                                                                      many=True)
            if hint:  # the daemon retries what is pending itself; the rest needs a person
                out.line(f"  what to do: {hint}")
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
