"""One worker of bench/scale.py: an engine on the shared store that advances every case it
can claim (``run_until_idle``), started on a line on stdin, reporting one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._common import BENCH_KEY  # noqa: E402
from bench.throughput import bench_config  # noqa: E402
from engine import StoreConfig  # noqa: E402
from viano_bug_analysis import open_engine  # noqa: E402


async def run(url: str, blob_root: str, port: int, concurrency: int) -> None:
    cfg = bench_config(port, concurrency, StoreConfig(url=url, blob_root=blob_root))
    async with open_engine(store=url, config=cfg, concurrency=concurrency,
                           environ={"VIANO_BENCH_KEY": BENCH_KEY}) as engine:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        t0, cpu0 = time.perf_counter(), time.process_time()
        backend = engine.store.store
        statements0 = getattr(backend, "statements", 0)
        results = await engine.run_until_idle()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stats = engine.store.stats
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.result.status] = statuses.get(r.result.status, 0) + 1
        print(json.dumps({"cases": len(results), "statuses": statuses, "seconds": elapsed,
                          "cpu_s": cpu, "transactions": stats.batches,
                          "publications": stats.published,
                          "statements": getattr(backend, "statements", 0) - statements0}),
              flush=True)


if __name__ == "__main__":
    trio.run(run, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
