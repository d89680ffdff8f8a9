"""Many workers on one PostgreSQL store, beside the SQLite store in one process, same run.

For each model latency (``--latencies``, ms) and each worker count (``--workers``), N cases
are taken in (``viano intake --batch``, not timed) into a fresh PostgreSQL database (the
``pgserver`` wheel's server, started here in a temporary folder), then W worker processes
(bench/_scale_worker.py: an engine claiming due cases, ``run_until_idle``) advance them all
through the loopback provider (its own process). The clock runs from the moment every worker
is ready to the last one's exit. Beside them, the same N cases at the same latency in one
process on the SQLite store (bench/throughput.py's run).

Reported: cases/s, the ideal bound at that latency (workers × concurrency / (2 calls ×
latency)) and the ratio to it, publications per transaction (over all workers), database
round trips per case (statements each worker sent, BEGIN and COMMIT included), server-side
transactions per case (pg_stat_database), CPU seconds per case in the workers, and the
speed-up over one worker.

    python bench/scale.py [--cases 2000] [--latencies 0,200] [--workers 1,2,4]
                          [--concurrency 64] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._common import print_table, stop_server, write_json  # noqa: E402
from bench.throughput import run_one, start_server  # noqa: E402
from tests.batch_helpers import write_generic_answers  # noqa: E402

VIANO = [sys.executable, "-c", "from viano_bug_analysis.cli import run; run()"]
WORKER = Path(__file__).with_name("_scale_worker.py")
CALLS_PER_CASE = 2


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


class Server:
    """PostgreSQL from the pgserver wheel, in a temporary folder."""

    def __init__(self, tmp: Path):
        if not os.environ.get("XDG_RUNTIME_DIR"):  # platformdirs (pgserver) warns without
            os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="vxdg-")
        import pgserver  # type: ignore[import-untyped]

        self.folder = Path(tempfile.mkdtemp(prefix="vpg-", dir="/tmp"))
        self.server = pgserver.get_server(str(self.folder), cleanup_mode="delete")
        self.admin = str(self.server.get_uri())
        self.tmp = tmp

    def database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.admin.replace("/postgres?", f"/{name}?", 1)

    def transactions(self, name: str) -> int:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                               "WHERE datname = %s", (name,)).fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        self.server.cleanup()


def _intake(url: str, blob_root: Path, n: int, tmp: Path) -> None:
    reports = tmp / f"reports-{n}"
    if not reports.exists():
        reports.mkdir()
        for i in range(n):
            (reports / f"C-{i:05d}.txt").write_text(f"Crash number {i}\nIt crashes.\n")
    cfg = tmp / "intake.toml"
    cfg.write_text(f'[store]\nurl = "{url}"\nblob_root = "{blob_root}"\n')
    r = subprocess.run([*VIANO, "intake", "--config", str(cfg), "--batch", str(reports),
                        "--json"], capture_output=True, text=True, env=_env(), check=False)
    if r.returncode != 0:
        raise SystemExit(f"intake failed: {r.stderr[-500:]}")


def run_workers(pg: Server, n: int, latency_ms: float, workers: int, concurrency: int,
                tmp: Path) -> dict[str, Any]:
    name = f"scale_{workers}_{int(latency_ms)}"
    url = pg.database(name)
    blob_root = tmp / f"blobs-{name}"
    _intake(url, blob_root, n, tmp)
    proc, port = start_server(latency_ms, write_generic_answers(tmp / "answers"))
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(workers):
            p = subprocess.Popen([sys.executable, str(WORKER), url, str(blob_root), str(port),
                                  str(concurrency)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=_env())
            procs.append(p)
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a worker did not start")
        xact0 = pg.transactions(name)
        t0 = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            assert p.stdout is not None
            reports.append(json.loads(p.stdout.readline()))
            p.wait(timeout=600)
        elapsed = time.perf_counter() - t0
        xacts = pg.transactions(name) - xact0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop_server(proc)
        shutil.rmtree(blob_root, ignore_errors=True)
    done = sum(r["cases"] for r in reports)
    statuses: dict[str, int] = {}
    for r in reports:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    pubs = sum(r["publications"] for r in reports)
    pubs_per_case = pubs / max(done, 1)
    txns = sum(r["transactions"] for r in reports)
    ideal = None if latency_ms == 0 else workers * concurrency / (
        CALLS_PER_CASE * latency_ms / 1000)
    return {"backend": "postgresql", "workers": workers, "n": n, "latency_ms": latency_ms,
            "concurrency": concurrency, "cases": done, "statuses": statuses,
            "seconds": elapsed, "cases_per_s": done / elapsed, "ideal_per_s": ideal,
            "x_ideal": None if ideal is None else done / elapsed / ideal,
            "publications_per_transaction": pubs / txns if txns else 0.0,
            "publications_per_case": pubs_per_case,
            "round_trips_per_case": sum(r["statements"] for r in reports) / max(done, 1),
            "server_transactions_per_case": xacts / max(done, 1),
            "cpu_ms_per_case": sum(r["cpu_s"] for r in reports) / max(done, 1) * 1e3,
            "per_worker_cases": [r["cases"] for r in reports]}


def commit_lock_ms(pg: Server, tmp: Path, batch: int = 24, rounds: int = 40) -> float:
    """Median time one group commit of ``batch`` publications holds the store's write lock
    (the advisory lock every worker's commits take), alone on the database: what bounds
    all workers together, whatever the number of hosts."""
    import statistics

    from engine import BytesSource, Change, PublishRequest, new_package_id, open_backend

    store = open_backend(pg.database("scale_lock"), write=True,
                         blob_root=str(tmp / "blobs-lock"))
    heads: dict[str, tuple[str, int]] = {}
    times = []
    try:
        for rnd in range(rounds):
            reqs = []
            for i in range(batch):
                case = f"L-{i}"
                note = {f"notes/{rnd}.json": BytesSource.of(os.urandom(3000))}
                if case in heads:
                    pkg, gen = heads[case]
                    reqs.append(PublishRequest(pkg, case, gen, Change(files=note)))
                else:
                    reqs.append(PublishRequest(new_package_id(), case, None, Change(
                        files={**note, "case/c.json": BytesSource.of(b"{}")},
                        phase="INTAKE")))
            t = time.perf_counter()
            out = store.commit_batch(reqs)
            times.append(time.perf_counter() - t)
            for o in out:
                heads[o.case_id] = (o.package_id, o.generation)  # type: ignore[union-attr]
    finally:
        store.close()
    return statistics.median(times[5:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--latencies", default="0,200")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--concurrency", type=int, default=64, help="per worker (default 64)")
    ap.add_argument("--quick", action="store_true", help="200 cases, 0 and 50 ms, 1 and 2")
    args = ap.parse_args()
    try:
        import importlib.util

        missing = [m for m in ("pgserver", "psycopg") if importlib.util.find_spec(m) is None]
        if missing:
            raise ImportError(missing)
    except ImportError:
        raise SystemExit("bench/scale.py needs the test extras (pgserver, psycopg): "
                         "pip install -e '.[test]'") from None
    n = 200 if args.quick else args.cases
    latencies = [0.0, 50.0] if args.quick else [float(x) for x in args.latencies.split(",")]
    counts = [1, 2] if args.quick else [int(x) for x in args.workers.split(",")]
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="viano-scale-") as tmp_name:
        tmp = Path(tmp_name)
        pg = Server(tmp)
        try:
            for latency in latencies:
                print(f"  sqlite, 1 process: {n} cases, {latency:g} ms ...", flush=True)
                base = run_one(n, latency, args.concurrency, tmp / f"sqlite-{latency:g}")
                out.append({"backend": "sqlite", "workers": 1, **base,
                            "round_trips_per_case": None,
                            "server_transactions_per_case": None})
                for w in counts:
                    print(f"  postgresql, {w} worker(s): {n} cases, {latency:g} ms ...",
                          flush=True)
                    res = run_workers(pg, n, latency, w, args.concurrency, tmp)
                    out.append(res)
                    print(f"    {res['cases_per_s']:,.0f} cases/s {res['statuses']}",
                          flush=True)
            lock_ms = commit_lock_ms(pg, tmp)
        finally:
            pg.stop()
    one = {r["latency_ms"]: r["cases_per_s"] for r in out
           if r["backend"] == "postgresql" and r["workers"] == 1}
    rows = [[r["backend"], r["workers"], r["latency_ms"], r["cases"], r["cases_per_s"],
             r["ideal_per_s"] or "-", r["x_ideal"] or "-",
             (r["cases_per_s"] / one[r["latency_ms"]]) if r["backend"] == "postgresql"
             and r["latency_ms"] in one else "-",
             r["publications_per_transaction"], r["round_trips_per_case"] or "-",
             r["server_transactions_per_case"] or "-", r["cpu_ms_per_case"]] for r in out]
    print_table(f"cases/s: SQLite in one process vs W workers on one PostgreSQL store "
                f"(concurrency {args.concurrency} per worker, {os.cpu_count()} cores)",
                ["backend", "W", "lat ms", "cases", "cases/s", "ideal/s", "x ideal",
                 "x 1 worker", "pubs/txn", "trips/case", "pg txn/case", "cpu ms/case"],
                rows)
    per_case = max((r.get("publications_per_case") or 0.0) for r in out)
    ceiling = 24 / (lock_ms / 1000) / per_case if per_case else float("nan")
    print(f"\none 24-publication group commit holds the write lock {lock_ms:.2f} ms (median, "
          f"alone); at {per_case:.1f} publications per case, one database of this kind "
          f"would carry at most ~{ceiling:,.0f} cases/s through that lock, however many "
          "hosts")
    write_json("scale", {"runs": out, "calls_per_case": CALLS_PER_CASE,
                         "commit_lock_ms_24": lock_ms, "lock_ceiling_cases_per_s": ceiling})


if __name__ == "__main__":
    main()
