"""The full pipeline for N cases at once: interpretation, auto-confirm, hypotheses.

N cases are taken in first (not timed), then one ``open_engine`` advances them all
(``run_until_idle``) against the loopback provider server in its own process, answering
after a fixed latency. Reported per run:

* cases/s, and the ideal bound for that latency and concurrency —
  concurrency / (model calls per case x latency) — with the ratio to it;
* publications per transaction (the group-commit factor);
* p50 and p99 of a case's advance (from taking a slot to its result);
* CPU seconds per case (this process only: the provider runs elsewhere);
* peak RSS during the run, and RSS per in-flight case: (peak - before) / concurrency.

The runs the issue asks for are the default (``--runs``: N:latency_ms:concurrency, comma
separated); ``--quick`` is a small smoke run.

    python bench/throughput.py [--runs 2000:0:64,2000:200:512,10000:200:512] [--quick]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from actors import open_store  # noqa: E402
from bench._common import BENCH_KEY, percentile, print_table, write_json  # noqa: E402
from engine import (  # noqa: E402
    Config,
    GatewayConfig,
    IntakeLimits,
    InterpretationPolicy,
    ProviderConfig,
    StoreConfig,
    prepare_intake,
    tune_collector,
)
from tests.batch_helpers import write_generic_answers  # noqa: E402
from viano_bug_analysis import open_engine  # noqa: E402

CALLS_PER_CASE = 2  # interpretation and hypotheses
DEFAULT_RUNS = "2000:0:64,2000:200:512,10000:200:512"
LITELLM_PROCESS_MB = 234  # a LiteLLM Router process measured on this kind of machine


_STATM = os.open("/proc/self/statm", os.O_RDONLY)  # kept open: opening it cost 1.3 ms a
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024     # time on the trio thread (py-spy)


def _rss_kib() -> int:
    return int(os.pread(_STATM, 128, 0).split()[1]) * _PAGE_KIB


def start_server(delay_ms: float, answers: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.loopback", "--delay-ms",
                             str(delay_ms), "--answers", str(answers)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    return proc, int(line[1])


async def intake(store_root: Path, n: int, tmp: Path) -> None:
    reports = tmp / "reports"
    reports.mkdir()
    limiter = trio.CapacityLimiter(64)
    async with open_store(store_root) as store:
        async def one(i: int) -> None:
            async with limiter:
                report = reports / f"C-{i:05d}.txt"
                report.write_text(f"Crash number {i}\nIt crashes when started.\n")
                plan = await trio.to_thread.run_sync(lambda: prepare_intake(
                    report, [], case_id=f"C-{i:05d}", limits=IntakeLimits()))
                await store.intake(plan)

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)


def bench_config(port: int, concurrency: int, store: StoreConfig | None = None) -> Config:
    """The loopback provider, auto-confirm, no cooldown; ``store`` for a PostgreSQL run."""
    provider = ProviderConfig(name="loopback", kind="openai",
                              base_url=f"http://127.0.0.1:{port}/v1", model="bench",
                              api_key_env="VIANO_BENCH_KEY", retries=0, timeout_s=120,
                              max_concurrency=concurrency)
    return attrs.evolve(Config.defaults(), providers=(provider,),
                        gateway=GatewayConfig(cooldown_after=1_000_000),
                        interpretation=InterpretationPolicy(auto_confirm=True),
                        store=store or StoreConfig())


async def advance_all(store_root: Path, port: int, concurrency: int) -> dict[str, Any]:
    config = bench_config(port, concurrency)
    before = _rss_kib()
    peak = before
    done = trio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_kib())
            await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        t0, cpu0 = time.perf_counter(), time.process_time()
        async with open_engine(store=store_root, config=config, concurrency=concurrency,
                               environ={"VIANO_BENCH_KEY": BENCH_KEY}) as engine:
            results = await engine.run_until_idle()
            stats = engine.store.stats
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        done.set()
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.result.status] = statuses.get(r.result.status, 0) + 1
    times = [r.elapsed_s for r in results]
    return {"cases": len(results), "statuses": statuses, "seconds": elapsed,
            "cases_per_s": len(results) / elapsed, "cpu_ms_per_case":
                cpu / max(len(results), 1) * 1e3,
            "p50_s": percentile(times, 0.5), "p99_s": percentile(times, 0.99),
            "publications_per_transaction": stats.per_transaction,
            "transactions": stats.batches, "rss_before_mb": before / 1024,
            "rss_peak_mb": peak / 1024,
            "kib_per_in_flight": (peak - before) / concurrency}


def run_one(n: int, latency_ms: float, concurrency: int, tmp: Path) -> dict[str, Any]:
    answers = write_generic_answers(tmp / "answers")
    store_root = tmp / f"store-{n}-{latency_ms:g}-{concurrency}"
    t0 = time.perf_counter()
    reports = tmp / f"in-{n}-{latency_ms:g}-{concurrency}"
    reports.mkdir()
    trio.run(intake, store_root, n, reports)
    intake_s = time.perf_counter() - t0
    proc, port = start_server(latency_ms, answers)
    try:
        res = trio.run(advance_all, store_root, port, concurrency)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    shutil.rmtree(store_root, ignore_errors=True)
    ideal = None if latency_ms == 0 else concurrency / (CALLS_PER_CASE * latency_ms / 1000)
    return {"n": n, "latency_ms": latency_ms, "concurrency": concurrency,
            "intake_s": intake_s, "ideal_per_s": ideal,
            "x_ideal": None if ideal is None else res["cases_per_s"] / ideal, **res}


def main() -> None:
    tune_collector()  # the process as the viano command sets it up (engine/_process.py)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=DEFAULT_RUNS,
                    help=f"N:latency_ms:concurrency,... (default {DEFAULT_RUNS})")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200:0:32,200:50:64")
    args = ap.parse_args()
    spec = "200:0:32,200:50:64" if args.quick else args.runs
    runs = [tuple(float(x) for x in item.split(":")) for item in spec.split(",")]
    out = []
    with tempfile.TemporaryDirectory(prefix="viano-bench-") as tmp:
        for n, latency, conc in runs:
            print(f"  {int(n)} cases, {latency:g} ms, concurrency {int(conc)} ...", flush=True)
            res = run_one(int(n), latency, int(conc), Path(tmp))
            out.append(res)
            print(f"    {res['cases_per_s']:,.0f} cases/s, statuses {res['statuses']}, "
                  f"peak {res['rss_peak_mb']:.0f} MB", flush=True)
    rows = [[r["n"], r["latency_ms"], r["concurrency"], r["cases_per_s"],
             r["ideal_per_s"] or "-", r["x_ideal"] or "-",
             r["publications_per_transaction"], r["p50_s"] * 1e3, r["p99_s"] * 1e3,
             r["cpu_ms_per_case"], r["rss_peak_mb"], r["kib_per_in_flight"]] for r in out]
    print_table("the full pipeline (interpretation, auto-confirm, hypotheses) per case",
                ["N", "lat ms", "conc", "cases/s", "ideal/s", "x ideal", "pubs/txn",
                 "p50 ms", "p99 ms", "cpu ms/case", "peak MB", "KiB/in-flight"], rows)
    print(f"\ngoals: >= 0.90 x ideal at 200 ms; <= 64 KiB per in-flight case; a whole "
          f"process under LiteLLM's ~{LITELLM_PROCESS_MB} MB")
    write_json("throughput", {"runs": out, "calls_per_case": CALLS_PER_CASE,
                              "peak_rss_mb_process": resource.getrusage(
                                  resource.RUSAGE_SELF).ru_maxrss / 1024})


if __name__ == "__main__":
    main()
