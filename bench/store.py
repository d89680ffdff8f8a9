"""Publications per second through the publisher actor, beside raw SQLite commits.

Each publisher owns one package and publishes generations in a loop; each publication
adds or replaces 3 blobs of 2-8 KiB, and the manifest is kept at about 2 KiB. Measured at
1, 16 and 256 concurrent publishers, with group commit and with one transaction per
publication, beside the raw single-row SQLite WAL + synchronous=FULL commit rate in the
same run. Every configuration runs ``--repeats`` times; medians are reported. The process
is set up as the ``viano`` command sets up its own (``engine.tune_collector``).

The blobs here are bytes sources, hashed once when made from their own immutable bytes,
so the store stores them without hashing again. A file source's small blobs are re-read
and re-hashed at commit (the bytes actually stored); what that costs per publication of
this workload (3 blobs of 2-8 KiB) is measured beside, as "rehash us/pub".

    python bench/store.py [--seconds 3] [--repeats 3] [--publishers 1,16,256]
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors import open_store
from bench._common import median, parse_args, percentile, print_table, write_json
from engine import (
    BytesSource,
    Change,
    FileSource,
    PublishRequest,
    new_package_id,
    tune_collector,
)
from engine._store._sources import read_verified

BASE_FILES = 14  # with the 3 rotating blobs: ~17 entries, a ~2 KiB manifest


def raw_commit_rate(root: Path, seconds: float) -> float:
    """Single-row INSERT + COMMIT in WAL mode with synchronous=FULL, in a tight loop."""
    conn = sqlite3.connect(root / "raw.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
    n = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 64,))
        conn.execute("COMMIT")
        n += 1
    conn.close()
    return n / seconds


async def publisher_run(root: Path, publishers: int, seconds: float,
                        group_commit: bool) -> dict[str, Any]:
    rng = random.Random(publishers)
    # Payloads come from a pool made before timing (os.urandom is the benchmark's cost, not
    # the store's); a unique suffix keeps every blob distinct, so nothing deduplicates.
    pool = [os.urandom(rng.randint(2048, 8192 - 16)) for _ in range(512)]
    latencies: list[float] = []
    count = 0
    async with open_store(root, group_commit=group_commit) as store:
        heads: dict[int, tuple[str, str, int]] = {}
        for p in range(publishers):  # setup: one package per publisher, not measured
            files = {f"inputs/base{i:02d}.txt": BytesSource.of(f"{p}-{i}".encode())
                     for i in range(BASE_FILES)}
            pkg = new_package_id()
            out = await store.publish(PublishRequest(pkg, f"B-{p}", None,
                                                     Change(files=files, phase="INTAKE")))
            heads[p] = (pkg, f"B-{p}", out.generation)
        batches0, tx0 = store.stats.batches, store.store.stats().transactions
        cpu0, t0 = time.process_time(), time.perf_counter()
        deadline = t0 + seconds

        async def publisher(p: int) -> None:
            nonlocal count
            pkg, case, gen = heads[p]
            i = 0
            while time.perf_counter() < deadline:
                files = {f"work/blob{(i + k) % 3}.bin": BytesSource.of(
                    pool[(p * 7 + i * 3 + k) % len(pool)] + f"{p}:{i}:{k}".encode())
                    for k in range(3)}
                start = time.perf_counter()
                out = await store.publish(PublishRequest(pkg, case, gen, Change(files=files)))
                latencies.append(time.perf_counter() - start)
                gen = out.generation
                count += 1
                i += 1

        async with trio.open_nursery() as nursery:
            for p in range(publishers):
                nursery.start_soon(publisher, p)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        transactions = store.store.stats().transactions - tx0
        batches = store.stats.batches - batches0
    return {"publications": count, "seconds": elapsed, "rate": count / elapsed,
            "tx_per_pub": transactions / max(count, 1), "batches": batches,
            "cpu_us_per_pub": cpu / max(count, 1) * 1e6,
            "p50_ms": percentile(latencies, 0.50) * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3}


def rehash_cost_us(root: Path, pubs: int = 3000) -> float:
    """CPU per publication of re-reading and re-hashing 3 small file-sourced blobs, as
    commit_batch does for them (``read_verified``)."""
    rng = random.Random(5)
    root.mkdir()
    sources = []
    for i in range(3 * 64):
        path = root / f"{i}.bin"
        path.write_bytes(os.urandom(rng.randint(2048, 8192)))
        sources.append(FileSource.of(path))
    cpu0 = time.process_time()
    for i in range(pubs):
        for k in range(3):
            assert read_verified(sources[(i * 3 + k) % len(sources)]) is not None
    return (time.process_time() - cpu0) / pubs * 1e6


def main() -> None:
    tune_collector()  # the process as the viano command sets it up (engine/_process.py)
    args = parse_args(__doc__, "publishers", "1,16,256")
    counts = [int(x) for x in args.publishers.split(",")]
    raw_rates: list[float] = []
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for publishers in counts:
            for group in (True, False):
                with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
                    # The raw baseline is re-measured beside every configuration so both
                    # see the same disk and the same noise.
                    raw_rates.append(raw_commit_rate(Path(tmp), min(1.0, args.seconds)))
                    res = trio.run(publisher_run, Path(tmp) / "store", publishers,
                                   args.seconds, group)
                    runs.setdefault((publishers, group), []).append(res)
                    print(f"  rep {rep + 1}: {publishers:>3} publishers, group_commit={group}: "
                          f"{res['rate']:,.0f}/s", flush=True)
    raw = median(raw_rates)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        rehash = median([rehash_cost_us(Path(tmp) / str(i)) for i in range(args.repeats)])
    rows, summary = [], []
    for (publishers, group), results in sorted(runs.items()):
        med = {k: median([r[k] for r in results]) for k in results[0]}
        one_tx = median([r["rate"] for r in runs[(publishers, False)]])
        row = {"publishers": publishers, "group_commit": group, "pubs_per_s": med["rate"],
               "ratio_vs_raw": med["rate"] / raw, "ratio_vs_one_tx": med["rate"] / one_tx,
               "tx_per_pub": med["tx_per_pub"], "cpu_us_per_pub": med["cpu_us_per_pub"],
               "p50_ms": med["p50_ms"], "p99_ms": med["p99_ms"]}
        summary.append(row)
        rows.append(list(row.values()))
    print(f"\nraw single-row SQLite WAL+FULL commits: {raw:,.0f}/s (median of {len(raw_rates)})")
    print(f"re-reading and re-hashing 3 file-sourced blobs: {rehash:.1f} us CPU per publication")
    print_table(f"publisher actor (medians of {args.repeats} runs of {args.seconds:.1f}s)",
                ["publishers", "group", "pubs/s", "x raw", "x one-tx", "tx/pub", "cpu us/pub",
                 "p50 ms", "p99 ms"], rows)
    write_json("store", {"raw_commits_per_s": raw, "seconds": args.seconds,
                         "repeats": args.repeats, "rehash_us_per_pub_file_sources": rehash,
                         "rows": summary})


if __name__ == "__main__":
    main()
