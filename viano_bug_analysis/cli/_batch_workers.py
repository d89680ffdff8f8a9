"""``viano run|batch --processes N``: the cases spread over N worker processes.

One Python process advances cases at about one core's worth of CPU (the GIL): a host with
more cores runs several. Each worker is this same command again, on one shard of the cases
(``--worker-shard I/N``, not in ``--help``: shards by a hash of the case id, so workers never
reach for each other's cases), with its share of ``--concurrency`` and of each provider's
``max_concurrency``. The store's leases and commits work across processes as they always
do; the shard only keeps the workers out of each other's way.

This process starts the workers, reads their results, keeps the one tally (a progress bar on
a terminal, a line per result elsewhere), passes SIGINT and SIGTERM on to them, and prints
one summary (under ``--json``, one document) with the worst exit code of every case, as a
batch in one process would. A worker reports on its stdout, one JSON object per line:
``{"total": n}`` first, ``{"result": …}`` for each result, then ``{"summary": …,
"exit_code": c}``. Its stdin is a pipe from here that is never written: when it ends (this
process died, even by SIGKILL) the worker stops as on Ctrl-C, keeping what it committed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import cattrs
import trio

from actors import CaseResult, worst_exit
from engine import EXIT_INTERNAL, EXIT_INTERRUPTED, Config, Shard, UsageError

from ._batch_common import Tally, print_summary, selection_of, summary_document
from ._context import reading
from ._output import Output

log = logging.getLogger("viano.batch")

MAX_LINE = 64 * 1024 * 1024  # a worker's line longer than this is not one of ours
_converter = cattrs.Converter()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where viano_bug_analysis is


def share(value: int, shard: Shard) -> int:
    """``shard``'s part of ``value`` split as evenly as the shards allow (at least 1)."""
    return max(1, value // shard.count + (1 if shard.index < value % shard.count else 0))


def share_of_config(config: Config, shard: Shard) -> Config:
    """Each provider's ``max_concurrency`` shared among the workers, so that together they
    keep to it (a provider limited to fewer requests than there are workers gets one from
    each)."""
    return attrs.evolve(config, providers=tuple(
        attrs.evolve(p, max_concurrency=share(p.max_concurrency, shard))
        for p in config.providers))


class WorkerTally(Tally):
    """A worker's tally: each result goes to the parent as a line, nothing is shown."""

    def __init__(self, out: Output, total: int):
        super().__init__(out, total, lambda _n: None, lambda _t: None)
        _emit({"total": total})

    def add(self, result: CaseResult) -> None:
        self.final[result.case_id] = result
        _emit({"result": _converter.unstructure(result)})

    @staticmethod
    def finish(summary: dict[str, Any], code: int) -> None:
        _emit({"summary": summary, "exit_code": code})


def _emit(document: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(document, separators=(",", ":"), allow_nan=False) + "\n")
        sys.stdout.flush()
    except OSError:  # the parent is gone: its end of stdin tells the worker to stop
        pass


@attrs.define
class _Worker:
    shard: Shard
    process: trio.Process
    summary: dict[str, Any] | None = None   # its last line: it finished and said so
    returncode: int | None = None

    @property
    def failure_code(self) -> int | None:
        """The exit code a worker that ended without its summary adds (None: it finished)."""
        if self.summary is not None:
            return None
        code = self.returncode
        return code if code is not None and code > 0 else EXIT_INTERNAL


def run_workers(args: argparse.Namespace, out: Output, config: Config) -> int:
    count = args.processes
    if count > args.concurrency:
        raise UsageError(f"--processes {count} needs --concurrency of at least {count} (each "
                         f"process takes its share of the cases in flight; it is "
                         f"{args.concurrency})",
                         hint="Raise --concurrency, or lower --processes.")
    selection = selection_of(args)
    with reading(args, config) as store:  # refused here once, not once by every worker
        for case_id in selection or ():
            store.case(case_id)
    workers, tally, interrupted = trio.run(_run, args, out, count)
    parts = [w.summary for w in workers if w.summary is not None]
    summary = summary_document(
        tally.final, time.monotonic() - tally.started,
        interrupted=interrupted or any(p.get("interrupted") for p in parts),
        interrupted_cases=[c for p in parts for c in p.get("interrupted_cases", [])],
        store=_added([p.get("store", {}) for p in parts]),
        providers={name: _added([p["providers"][name] for p in parts
                                 if name in p.get("providers", {})])
                   for name in sorted({n for p in parts for n in p.get("providers", {})})},
        dropped_events=sum(int(p.get("dropped_events", 0)) for p in parts))
    summary["processes"] = [{"shard": str(w.shard), "finished": w.summary is not None,
                             "exit_code": w.returncode,
                             "cases": None if w.summary is None else w.summary.get("cases")}
                            for w in workers]
    for w in workers:
        if w.failure_code is not None:
            out.note(f"worker process {w.shard} ended {_ending(w.returncode)} before it "
                     "finished (its error, if it said one, is above); its cases keep their "
                     "committed state: run the same command again to resume them")
    results = list(tally.final.values())
    print_summary(out, summary, results)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    return worst_exit([r.exit_code for r in results]
                      + [c for w in workers if (c := w.failure_code) is not None])


def _ending(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"by signal {-returncode}"
    return f"with exit code {returncode}"


def _added(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' counters added up (``largest_batch`` the largest; the
    ``publications_per_transaction`` of the sums)."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                total[key] = _added([total.get(key, {}), value])
            elif key == "largest_batch":
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    if "publications" in total and "transactions" in total:
        total["publications_per_transaction"] = round(
            total["publications"] / total["transactions"], 2) if total["transactions"] else 0.0
    return total


def worker_argv(args: argparse.Namespace, shard: Shard) -> list[str]:
    """This command again, for one worker: the same store, config and event log (its
    lines are appended), its shard, its share of ``--concurrency``."""
    argv = [sys.executable, "-c", "from viano_bug_analysis.cli import run; run()"]
    for flag, value in (("--store", args.store), ("--config", args.config),
                        ("--log-json", args.log_json)):
        if value is not None:
            argv += [flag, value]
    argv += [args.command, "--concurrency", str(share(args.concurrency, shard)),
             "--worker-shard", str(shard)]
    if args.all:
        argv.append("--all")
    if getattr(args, "wait", False):
        argv.append("--wait")
    return [*argv, "--", *args.cases]


def _environment() -> dict[str, str]:
    env = dict(os.environ)  # the providers' keys reach the workers the way they reached us
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


async def _run(args: argparse.Namespace, out: Output, count: int
               ) -> tuple[list[_Worker], Tally, bool]:
    workers: list[_Worker] = []
    interrupted = False
    send, events = trio.open_memory_channel[tuple[int, str, Any]](math.inf)
    started = time.monotonic()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async def forward() -> None:
            nonlocal interrupted
            async for _ in signals:
                if not interrupted:  # a second one is ignored, as in one process
                    interrupted = True
                    _signal_all(workers, signal.SIGTERM)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward)
            try:
                async with send:
                    for index in range(count):
                        shard = Shard(index, count)
                        process = await trio.lowlevel.open_process(
                            worker_argv(args, shard), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=_environment())
                        workers.append(_Worker(shard, process))
                        nursery.start_soon(_read, index, workers[-1], send.clone())
            except BaseException:
                _signal_all(workers, signal.SIGTERM)  # the ones started stop, and say so
                raise
            tally = await _gather(out, events, workers)
            tally.started = started  # the rate counts the workers' start-up
            nursery.cancel_scope.cancel()
    return workers, tally, interrupted


def _signal_all(workers: list[_Worker], signum: int) -> None:
    for w in workers:
        if w.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                w.process.send_signal(signum)


async def _read(index: int, worker: _Worker,
                send: trio.MemorySendChannel[tuple[int, str, Any]]) -> None:
    """A worker's lines as events, then its end (after its exit)."""
    stdout = worker.process.stdout
    assert stdout is not None
    async with send:
        pending = bytearray()
        async for chunk in stdout:
            pending += chunk
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                await _event(index, bytes(line), send)
            if len(pending) > MAX_LINE:
                log.error("worker %s wrote a line over %d bytes: stopping it", worker.shard,
                          MAX_LINE)
                worker.process.kill()
                break
        worker.returncode = await worker.process.wait()
        await send.send((index, "end", worker.returncode))


async def _event(index: int, line: bytes,
                 send: trio.MemorySendChannel[tuple[int, str, Any]]) -> None:
    try:
        document = json.loads(line)
        kind = next(k for k in ("total", "result", "summary") if k in document)
    except (ValueError, TypeError, StopIteration):
        log.warning("a worker wrote a line that is not one of its reports: %r", line[:200])
        return
    await send.send((index, kind, document))


async def _gather(out: Output, events: trio.MemoryReceiveChannel[tuple[int, str, Any]],
                  workers: list[_Worker]) -> Tally:
    """The workers' totals first (for the progress bar), then their results as they come,
    until every worker has ended."""
    early: list[tuple[int, str, Any]] = []
    waiting_for = set(range(len(workers)))
    total = 0
    async for index, kind, document in events:
        if kind == "total":
            total += int(document["total"])
        else:
            early.append((index, kind, document))
        if kind in ("total", "end"):
            waiting_for.discard(index)
        if not waiting_for:
            break
    with out.progress_with_text("cases", total) as (advance, set_text):
        tally = Tally(out, total, advance, set_text)
        for event in early:
            _take(tally, workers, *event)
        async for event in events:
            _take(tally, workers, *event)
    return tally


def _take(tally: Tally, workers: list[_Worker], index: int, kind: str, document: Any) -> None:
    if kind == "result":
        tally.add(_converter.structure(document["result"], CaseResult))
    elif kind == "summary":
        workers[index].summary = document["summary"]
