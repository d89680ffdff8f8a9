"""The peers, side by side in the same run, on the same loopback server:

* **DBOS** (``pip install '.[peers]'``; skipped with a message if absent), SQLite system
  database, three durable steps per case (``bench/peers/dbos_peer.py``, in its own
  process), beside Viano's whole pipeline (interpretation, auto-confirm, hypotheses: two
  model calls and six to eight publications per case; ``bench/throughput.py``'s run) at the
  same N, latency and concurrency: cases/s and the ratio; for each ``--processes`` value
  (``viano batch --processes P`` above 1: P worker processes sharing the concurrency).
* **LiteLLM Router** (optional too): answers/s at the given concurrency and the latency a
  failover past a refused provider adds, beside Viano's gateway pool — the functions of
  ``bench/gateway.py``, reused.
* **The physical limit**: this disk's raw SQLite WAL+FULL single-row commits/s and fsyncs/s.

    python bench/peers/run.py [--cases 2000] [--latency-ms 0,200] [--concurrency 64]
                              [--repeats 1] [--processes 1,2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench._common import median, print_table, stop_server, write_json  # noqa: E402
from bench.store import raw_commit_rate  # noqa: E402
from bench.throughput import run_one, start_server  # noqa: E402
from tests.batch_helpers import write_generic_answers  # noqa: E402

GOAL_X_DBOS = 10.0
GOAL_X_LITELLM = 10.0


def fsync_rate(root: Path, seconds: float = 1.0) -> float:
    path = root / "fsync.bin"
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            n += 1
    finally:
        os.close(fd)
    return n / seconds


def dbos_run(n: int, latency_ms: float, concurrency: int, tmp: Path) -> dict[str, Any] | None:
    if importlib.util.find_spec("dbos") is None:
        return None
    answers = write_generic_answers(tmp / "answers")
    proc, port = start_server(latency_ms, answers)
    db = tmp / f"dbos-{n}-{latency_ms:g}-{concurrency}.sqlite"
    try:
        r = subprocess.run([sys.executable, "-m", "bench.peers.dbos_peer", "--port", str(port),
                            "--cases", str(n), "--concurrency", str(concurrency),
                            "--db", str(db)], cwd=REPO, capture_output=True, text=True,
                           timeout=3600, check=True)
    finally:
        stop_server(proc)
        for p in tmp.glob(f"{db.name}*"):
            p.unlink()
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def litellm_figures(concurrency: int, seconds: float) -> dict[str, Any] | None:
    if importlib.util.find_spec("litellm") is None:
        return None
    from bench import gateway
    from tests.loopback import dead_port

    peer = gateway._litellm()
    system, user = gateway.PROMPT.system, gateway.PROMPT.user
    proc, port = gateway.start_server(0)
    try:
        ours = trio.run(gateway.viano, port, concurrency, seconds)
        theirs = peer.rate(port, concurrency, seconds, system, user)
        failover = trio.run(gateway.failover_latency, port, 200)
        theirs_failover = peer.failover_added_ms(port, dead_port(), 200, system, user)
    finally:
        stop_server(proc)
    return {"viano_rate": ours["rate"], "litellm_rate": theirs["rate"],
            "x_litellm": ours["rate"] / theirs["rate"],
            "failover": {"viano_added_ms": failover["added_ms"],
                         "litellm_added_ms": theirs_failover}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--latency-ms", default="0,200")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--processes", default="1,2",
                    help="Viano's worker processes, each value a run (default 1,2)")
    ap.add_argument("--seconds", type=float, default=3.0, help="of each LiteLLM rate run")
    args = ap.parse_args()
    rows, out = [], []
    with tempfile.TemporaryDirectory(prefix="viano-bench-peers-",
                                     dir=os.environ.get("BENCH_TMP")) as tmp_name:
        tmp = Path(tmp_name)
        raw = raw_commit_rate(tmp, 1.0)
        fsyncs = fsync_rate(tmp)
        processes = [int(x) for x in args.processes.split(",")]
        for latency in (float(x) for x in args.latency_ms.split(",")):
            ours: dict[int, list[float]] = {p: [] for p in processes}
            theirs: list[float] = []
            for rep in range(args.repeats):
                sub = tmp / f"r{rep}-{latency:g}"
                sub.mkdir()
                for p in processes:
                    v = run_one(args.cases, latency, args.concurrency, sub, p)
                    ours[p].append(v["cases_per_s"])
                    print(f"  {latency:g} ms rep {rep + 1}: Viano ({p} process(es)) "
                          f"{v['cases_per_s']:,.1f} cases/s", flush=True)
                d = dbos_run(args.cases, latency, args.concurrency, sub)
                if d is not None:
                    theirs.append(d["cases_per_s"])
                print(f"  {latency:g} ms rep {rep + 1}: "
                      + (f"DBOS {d['cases_per_s']:,.1f}" if d else "DBOS not installed"),
                      flush=True)
            dbos_rate = median(theirs) if theirs else None
            out.append({"latency_ms": latency, "viano_cases_per_s": ours,
                        "dbos_cases_per_s": theirs})
            for p in processes:
                viano_rate = median(ours[p])
                rows.append((args.cases, latency, args.concurrency, p, viano_rate,
                             dbos_rate if dbos_rate is not None else "skipped",
                             viano_rate / dbos_rate if dbos_rate else "-"))
        lite = litellm_figures(32, args.seconds)
    print_table(f"Viano's whole pipeline vs DBOS, three durable steps per case (medians of "
                f"{args.repeats})", ["cases", "latency ms", "concurrency", "Viano processes",
                                     "Viano cases/s", "DBOS cases/s", "x DBOS"], rows)
    print(f"goal: >= {GOAL_X_DBOS:g}x DBOS")
    if lite is None:
        print("\nLiteLLM Router: skipped (not installed: pip install '.[peers]')")
    else:
        print_table("gateway vs LiteLLM Router at 32 concurrent (bench/gateway.py's runs)",
                    ["Viano answers/s", "LiteLLM answers/s", "x LiteLLM",
                     "Viano failover +ms", "LiteLLM failover +ms"],
                    [(lite["viano_rate"], lite["litellm_rate"], lite["x_litellm"],
                      lite["failover"].get("viano_added_ms", "-"),
                      lite["failover"].get("litellm_added_ms", "-"))])
        print(f"goal: >= {GOAL_X_LITELLM:g}x LiteLLM, failover adding <= 1 ms")
    print_table("the physical limit of this disk", ["SQLite WAL+FULL commits/s", "fsyncs/s"],
                [(raw, fsyncs)])
    if importlib.util.find_spec("dbos") is None:
        print("\nDBOS: skipped (not installed: pip install '.[peers]')")
    write_json("peers", {"args": vars(args), "dbos": out, "litellm": lite,
                         "raw_commits_per_s": raw, "fsyncs_per_s": fsyncs})


if __name__ == "__main__":
    main()
