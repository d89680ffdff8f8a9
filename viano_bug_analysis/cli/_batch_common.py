"""What the multi-case commands share, in one process or spread over worker processes: the
selection, the concurrency check, the tally of results (a progress bar on a terminal), the
summary document and its text, and the signal handling of a command that takes SIGINT and
SIGTERM over."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio

from actors import CaseResult, Engine
from engine import UsageError

from ._next_steps import next_step
from ._output import Output


def selection_of(args: argparse.Namespace) -> list[str] | None:
    if args.all and args.cases:
        raise UsageError("give case ids or --all, not both")
    if not args.all and not args.cases:
        raise UsageError("give the case ids to advance, or --all")
    return None if args.all else list(args.cases)


class Tally:
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
        return summary_document(
            self.final, time.monotonic() - self.started, interrupted=interrupted,
            interrupted_cases=engine.interrupted_cases, store=engine.store.stats.to_json(),
            providers={n: s.to_json() for n, s in engine.gateway.pool.stats.items()},
            dropped_events=engine.dropped_events)


def summary_document(final: dict[str, CaseResult], elapsed: float, *, interrupted: bool,
                     interrupted_cases: list[str], store: dict[str, Any],
                     providers: dict[str, Any], dropped_events: int) -> dict[str, Any]:
    """The summary of a multi-case command (one process's, or its workers' together)."""
    return {"cases": len(final), "interrupted": interrupted,
            # cut short with no result (a model call in flight, or waiting for a slot):
            # their committed state is kept, and the same command resumes them
            "interrupted_cases": sorted(interrupted_cases),
            "by_status": dict(sorted(Counter(r.result.status
                                              for r in final.values()).items())),
            "by_reason": dict(sorted(Counter(str(r.result.reason)
                                              for r in final.values()).items())),
            "seconds": round(elapsed, 3),
            "case_seconds": _quantiles([r.elapsed_s for r in final.values()]),
            "cases_per_s": round(len(final) / elapsed, 2) if elapsed else None,
            "store": store, "providers": providers, "dropped_events": dropped_events}


def _quantiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 of the cases' advance times (the last advance of each case)."""
    if not values:
        return {"p50": None, "p99": None}
    ordered = sorted(values)
    return {q: round(ordered[min(len(ordered) - 1, int(f * len(ordered)))], 4)
            for q, f in (("p50", 0.5), ("p99", 0.99))}


def print_summary(out: Output, summary: dict[str, Any], results: list[CaseResult]) -> None:
    if out.as_json:
        out.document({"summary": summary, "results": [r.to_json() for r in results]})
        return
    if out.err.is_terminal:
        for r in results:
            out.line(f"{r.case_id}: {r.result.status} ({r.result.reason})")
    counts = ", ".join(f"{k} {v}" for k, v in summary["by_status"].items()) or "no cases"
    stopped = summary["interrupted_cases"]
    if stopped:  # they have no result, so "0 cases" alone said nothing of them
        out.line(f"{len(stopped)} case(s) stopped before a result, their committed state "
                 f"kept: {_named(stopped)}")
    for line in next_steps(results):
        out.line(line)
    out.line(f"{summary['cases']} cases: {counts}; {summary['seconds']}s; "
             f"{summary['store']['publications_per_transaction']} publications per "
             "transaction" + (" (interrupted: run the same command to resume)"
                              if summary["interrupted"] else ""))


SHOWN_STOPPED = 20  # case ids named on a line: those stopped before a result, or one step


def next_steps(results: list[CaseResult]) -> list[str]:
    """What to do about the results that need a person, one line per reason code: its
    cases (the first SHOWN_STOPPED named) and the step that ``viano interpret`` prints
    for one of them. A batch of 2,000 whose providers failed said only "BLOCKED 2000"."""
    cases: dict[str, list[str]] = {}
    for r in results:
        cases.setdefault(str(r.result.reason), []).append(r.case_id)
    lines = []
    for reason, unordered in sorted(cases.items()):
        ids = sorted(unordered)
        hint = next_step(reason, ids[0] if len(ids) == 1 else "<case>", many=True)
        if hint is None:
            continue
        lines.append(f"what to do about {reason} ({len(ids)} case(s): {_named(ids)}): "
                     f"{hint}")
    return lines


def _named(ids: list[str]) -> str:
    """The first SHOWN_STOPPED case ids, and how many more."""
    more = len(ids) - SHOWN_STOPPED
    return ", ".join(ids[:SHOWN_STOPPED]) + (f" and {more} more" if more > 0 else "")


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """From the start of ``trio.run`` until :func:`stoppable` takes the signals over, a
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
async def stoppable(*, watch_parent: bool = False
                    ) -> AsyncIterator[tuple[trio.Event, trio.CancelScope]]:
    """SIGINT and SIGTERM, taken over for the whole command: the first sets ``stop`` and
    cancels the work scope (model calls in flight are cancelled, commits in flight finish);
    any further one is ignored, so a second Ctrl-C or SIGTERM during the orderly shutdown
    cannot kill the process halfway through it. ``watch_parent``: stdin is a pipe from the
    process that started this one (``--processes``), and its end (that process died,
    SIGKILL included) stops the command the same way."""
    stop = trio.Event()
    work = trio.CancelScope()

    def stop_work() -> None:
        if not stop.is_set():
            stop.set()
            work.cancel()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async def watch() -> None:
            async for _ in signals:
                stop_work()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            if watch_parent:
                nursery.start_soon(_watch_parent, stop_work)
            try:
                yield stop, work
            finally:
                nursery.cancel_scope.cancel()


async def _watch_parent(stop_work: Callable[[], None]) -> None:
    """Until stdin ends (the parent never writes to it; it ends when the parent does)."""
    stream = trio.lowlevel.FdStream(os.dup(0))
    try:
        while await stream.receive_some(4096):
            pass
    except (OSError, trio.BrokenResourceError):
        pass  # not a pipe we can read: the parent is no longer there to say otherwise
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()
    stop_work()


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
