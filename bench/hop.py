"""The cost of one worker-thread hop: the store's ``Workers`` beside ``trio.to_thread``.

A hop runs an empty function on a worker thread and returns to the trio task. Measured
one task at a time and with ``--tasks`` tasks hopping at once (the engine's case: a case
takes about a dozen hops, many cases in flight), each with 2 threads (the SQLite backend's
``reader_threads``): ``trio.to_thread.run_sync`` with a ``CapacityLimiter(2)`` (the store's
hop before ``actors._workers``) and ``Workers(2)``. CPU and wall time per hop, medians of
``--repeats``.

    python bench/hop.py [--hops 5000] [--tasks 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors._workers import Workers
from bench._common import median, print_table, write_json

Hop = Callable[[Callable[[], None]], Awaitable[Any]]
Runs = dict[str, dict[int, list[tuple[float, float]]]]


def _nothing() -> None:
    return None


async def _measure(hop: Hop, hops: int, tasks: int) -> tuple[float, float]:
    per_task = max(1, hops // tasks)

    async def one() -> None:
        for _ in range(per_task):
            await hop(_nothing)

    cpu0, t0 = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(one)
    n = per_task * tasks
    return (time.process_time() - cpu0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


async def _run(hops: int, tasks: int, repeats: int) -> Runs:
    workers = Workers(2, "bench-hop")
    limiter = trio.CapacityLimiter(2)
    kinds: dict[str, Hop] = {
        "trio.to_thread (limiter 2)": lambda f: trio.to_thread.run_sync(f, limiter=limiter),
        "Workers(2)": workers.run,
    }
    out: Runs = {k: {} for k in kinds}
    try:
        for _ in range(repeats):
            for name, hop in kinds.items():  # interleaved: both see the same noise
                for t in (1, tasks):
                    out[name].setdefault(t, []).append(await _measure(hop, hops, t))
    finally:
        workers.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hops", type=int, default=5000)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    res = trio.run(_run, args.hops, args.tasks, args.repeats)
    base = "trio.to_thread (limiter 2)"
    rows, summary = [], []
    for name, by_tasks in res.items():
        for t, runs in sorted(by_tasks.items()):
            cpu = median([r[0] for r in runs])
            wall = median([r[1] for r in runs])
            base_cpu = median([r[0] for r in res[base][t]])
            rows.append([name, t, cpu, wall, cpu / base_cpu])
            summary.append({"hop": name, "tasks": t, "cpu_us": cpu, "wall_us": wall,
                            "cpu_vs_to_thread": cpu / base_cpu})
    print_table(f"one worker-thread hop (medians of {args.repeats} runs of {args.hops} hops)",
                ["hop", "tasks at once", "cpu us/hop", "wall us/hop", "cpu x to_thread"], rows)
    write_json("hop", {"hops": args.hops, "repeats": args.repeats, "rows": summary})


if __name__ == "__main__":
    main()
