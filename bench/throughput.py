"""The full pipeline for N cases at once: interpretation, auto-confirm, hypotheses.

N cases are taken in first (not timed), then one ``open_engine`` advances them all
(``run_until_idle``) against the loopback provider server in its own process, answering
after a fixed latency. Reported per run:

* cases/s, and the ideal bound for that latency and concurrency —
  concurrency / (model calls per case x latency) — with the ratio to it;
* publications per transaction (the group-commit factor);
* p50 and p99 of a case's advance (from taking a slot to its result);
* CPU seconds per case (this process only: the provider runs elsewhere), and the kernel's
  part of it (system time: sockets, fsync, page writes);
* peak RSS during the run, and RSS per in-flight case: (peak - before) / concurrency;
* where one N and latency ran at two concurrencies in one process each, the slope: what
  one more case in flight adds to the peak, and what a run holds at any concurrency.

Each run's advance is a new process (its RSS starts from nothing the runs before it
left).

The runs the issue asks for are the default (``--runs``: N:latency_ms:concurrency[:P],
comma separated); ``--quick`` is a small smoke run. With a fourth field P above 1 the
cases are advanced by the real command, ``viano batch --all --processes P`` (P worker
processes, each on its shard of the cases with concurrency / P in flight), timed from its
own summary (which counts the workers' start-up); CPU is then that of the whole process
tree, peak RSS the tree's (the sum over its processes, sampled) with the largest single
process beside it, and RSS per in-flight case the tree's peak / concurrency (nothing of
it was there before).

    python bench/throughput.py [--runs 2000:0:64,2000:200:512,10000:200:512,2000:200:512:2]
                               [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from bench._common import BENCH_KEY, percentile, print_table, stop_server, write_json  # noqa: E402
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
DEFAULT_RUNS = ("2000:0:64,2000:0:64:2,2000:200:64,2000:200:512,2000:200:512:2,"
                "10000:200:512")
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
        sys0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        async with open_engine(store=store_root, config=config, concurrency=concurrency,
                               environ={"VIANO_BENCH_KEY": BENCH_KEY}) as engine:
            results = await engine.run_until_idle()
            stats = engine.store.stats
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0
        done.set()
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.result.status] = statuses.get(r.result.status, 0) + 1
    times = [r.elapsed_s for r in results]
    return {"cases": len(results), "statuses": statuses, "seconds": elapsed,
            "cases_per_s": len(results) / elapsed, "cpu_ms_per_case":
                cpu / max(len(results), 1) * 1e3,
            "system_cpu_ms_per_case": system / max(len(results), 1) * 1e3,
            "p50_s": percentile(times, 0.5), "p99_s": percentile(times, 0.99),
            "publications_per_transaction": stats.per_transaction,
            "transactions": stats.batches, "rss_before_mb": before / 1024,
            "rss_peak_mb": peak / 1024,
            "kib_per_in_flight": (peak - before) / concurrency}


def advance_in_child(store_root: Path, port: int, concurrency: int) -> dict[str, Any]:
    """:func:`advance_all` in a new process of its own: run in this one, a run's RSS
    started from what the runs before it left (their caches, their freed but kept heap),
    so its peak and the slope between two runs said more about the order than the run."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--advance",
                           str(store_root), str(port), str(concurrency)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the advance of {store_root} failed ({proc.returncode}): "
                         f"{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _tree_rss_kib(pid: int) -> tuple[int, int]:
    """The summed RSS of ``pid`` and its descendants, and the largest of them (KiB)."""
    sizes, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/statm", "rb") as f:
                sizes.append(int(f.read().split()[1]) * _PAGE_KIB)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", "rb") as f:
                    todo += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue  # it ended as we looked
    return sum(sizes), max(sizes, default=0)


def advance_with_processes(store_root: Path, port: int, concurrency: int, processes: int,
                           tmp: Path) -> dict[str, Any]:
    """``viano batch --all --processes P`` as a user runs it, over the same store."""
    config = tmp / f"viano-{processes}.toml"
    config.write_text(f"""
[interpretation]
auto_confirm = true

[gateway]
cooldown_after = 1000000

[[providers]]
name = "loopback"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "bench"
api_key_env = "VIANO_BENCH_KEY"
retries = 0
timeout_s = 120
max_concurrency = {concurrency}
""")
    env = dict(os.environ, VIANO_BENCH_KEY=BENCH_KEY,
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out_path, err_path = tmp / "batch.out", tmp / "batch.err"
    with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:  # not pipes: the
        proc = subprocess.Popen(                                          # document is MBs
            [sys.executable, "-c", "from viano_bug_analysis.cli import run; run()",
             "--json", "--store", str(store_root), "--config", str(config), "batch",
             "--all", "--processes", str(processes), "--concurrency", str(concurrency)],
            stdout=out_f, stderr=err_f, env=env, cwd=tmp)
        peak = largest = 0
        while proc.poll() is None:
            tree, one = _tree_rss_kib(proc.pid)
            peak, largest = max(peak, tree), max(largest, one)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.02)
    out = out_path.read_bytes()
    if proc.returncode != 0:
        raise SystemExit(f"viano batch --processes {processes} failed ({proc.returncode}): "
                         f"{err_path.read_text(errors='replace')[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(out)
    summary, results = doc["summary"], doc["results"]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    store = summary["store"]
    return {"cases": len(results), "statuses": statuses, "seconds": summary["seconds"],
            "cases_per_s": len(results) / summary["seconds"],
            "cpu_ms_per_case": cpu / max(len(results), 1) * 1e3,
            "system_cpu_ms_per_case": (after.ru_stime - before.ru_stime)
                / max(len(results), 1) * 1e3,
            "p50_s": summary["case_seconds"]["p50"], "p99_s": summary["case_seconds"]["p99"],
            "publications_per_transaction": store["publications_per_transaction"],
            "transactions": store["transactions"], "rss_before_mb": 0.0,
            "rss_peak_mb": peak / 1024, "rss_largest_process_mb": largest / 1024,
            "kib_per_in_flight": peak / concurrency}


def run_one(n: int, latency_ms: float, concurrency: int, tmp: Path,
            processes: int = 1) -> dict[str, Any]:
    answers = write_generic_answers(tmp / "answers")
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{n}-{latency_ms:g}-{concurrency}-", dir=tmp))
    store_root = run_dir / "store"
    t0 = time.perf_counter()
    reports = run_dir / "in"
    reports.mkdir()
    trio.run(intake, store_root, n, reports)
    intake_s = time.perf_counter() - t0
    proc, port = start_server(latency_ms, answers)
    try:
        if processes > 1:
            res = advance_with_processes(store_root, port, concurrency, processes, run_dir)
        else:
            res = advance_in_child(store_root, port, concurrency)
            res["rss_largest_process_mb"] = res["rss_peak_mb"]
    finally:
        stop_server(proc)
    shutil.rmtree(run_dir, ignore_errors=True)
    ideal = None if latency_ms == 0 else concurrency / (CALLS_PER_CASE * latency_ms / 1000)
    return {"n": n, "latency_ms": latency_ms, "concurrency": concurrency,
            "processes": processes,
            "intake_s": intake_s, "ideal_per_s": ideal,
            "x_ideal": None if ideal is None else res["cases_per_s"] / ideal, **res}


def marginal_kib(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What one more case in flight costs: for each N and latency run in one process at
    two or more concurrencies, the slope of peak RSS from the lowest to the highest. The
    per-in-flight column divides the whole growth by the concurrency, so it also charges
    each case with what a run holds at any concurrency (the SQLite page caches, the
    document cache's base, the modules a run imports first)."""
    groups: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for r in runs:
        if r["processes"] == 1:
            groups.setdefault((r["n"], r["latency_ms"]), []).append(r)
    out = []
    for (n, latency), rs in sorted(groups.items()):
        lo = min(rs, key=lambda r: r["concurrency"])
        hi = max(rs, key=lambda r: r["concurrency"])
        if lo["concurrency"] == hi["concurrency"]:
            continue
        slope = ((hi["rss_peak_mb"] - lo["rss_peak_mb"]) * 1024
                 / (hi["concurrency"] - lo["concurrency"]))
        out.append({"n": n, "latency_ms": latency, "from_concurrency": lo["concurrency"],
                    "to_concurrency": hi["concurrency"], "kib_per_added_in_flight": slope,
                    "fixed_mb": lo["rss_peak_mb"] - lo["rss_before_mb"]
                    - slope * lo["concurrency"] / 1024})
    return out


def main() -> None:
    tune_collector()  # the process as the viano command sets it up (engine/_process.py)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=DEFAULT_RUNS,
                    help=f"N:latency_ms:concurrency,... (default {DEFAULT_RUNS})")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200:0:32,200:50:64")
    ap.add_argument("--advance", nargs=3, metavar=("STORE", "PORT", "CONCURRENCY"),
                    help=argparse.SUPPRESS)  # one run's advance, in the child process
    args = ap.parse_args()
    if args.advance:
        root, port, conc = args.advance
        print(json.dumps(trio.run(advance_all, Path(root), int(port), int(conc))))
        return
    spec = "200:0:32,200:50:64" if args.quick else args.runs
    runs = [[float(x) for x in item.split(":")] for item in spec.split(",")]
    out = []
    with tempfile.TemporaryDirectory(prefix="viano-bench-") as tmp:
        for n, latency, conc, *more in runs:
            procs = int(more[0]) if more else 1
            print(f"  {int(n)} cases, {latency:g} ms, concurrency {int(conc)}, "
                  f"{procs} process(es) ...", flush=True)
            res = run_one(int(n), latency, int(conc), Path(tmp), procs)
            out.append(res)
            print(f"    {res['cases_per_s']:,.0f} cases/s, statuses {res['statuses']}, "
                  f"peak {res['rss_peak_mb']:.0f} MB", flush=True)
    rows = [[r["n"], r["latency_ms"], r["concurrency"], r["processes"], r["cases_per_s"],
             r["ideal_per_s"] or "-", r["x_ideal"] or "-",
             r["publications_per_transaction"], r["p50_s"] * 1e3, r["p99_s"] * 1e3,
             r["cpu_ms_per_case"], r["system_cpu_ms_per_case"], r["rss_peak_mb"],
             r["rss_largest_process_mb"],
             r["kib_per_in_flight"]] for r in out]
    print_table("the full pipeline (interpretation, auto-confirm, hypotheses) per case",
                ["N", "lat ms", "conc", "procs", "cases/s", "ideal/s", "x ideal", "pubs/txn",
                 "p50 ms", "p99 ms", "cpu ms/case", "of it system", "peak MB", "largest MB",
                 "KiB/in-flight"], rows)
    slopes = marginal_kib(out)
    if slopes:
        print_table("peak RSS per case added in flight (one process; the slope between "
                    "two concurrencies)",
                    ["N", "lat ms", "conc from", "conc to", "KiB/added in-flight",
                     "fixed MB"],
                    [[m["n"], m["latency_ms"], m["from_concurrency"], m["to_concurrency"],
                      m["kib_per_added_in_flight"], m["fixed_mb"]] for m in slopes])
    print(f"\ngoals: >= 0.90 x ideal at 200 ms; <= 64 KiB per in-flight case; a whole "
          f"process under LiteLLM's ~{LITELLM_PROCESS_MB} MB")
    write_json("throughput", {"runs": out, "marginal": slopes,
                              "calls_per_case": CALLS_PER_CASE,
                              "peak_rss_mb_process": resource.getrusage(
                                  resource.RUSAGE_SELF).ru_maxrss / 1024})


if __name__ == "__main__":
    main()
