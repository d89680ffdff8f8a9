"""Sustained publication rate as the store grows: does it hold, and does the WAL stay bounded?

256 publishers (the bench/store.py workload) publish for ``--seconds``; every ``--every``
seconds the rate over that interval, the WAL file size and the database size are printed.
A store whose WAL never restarts shows a falling rate and a WAL growing without bound.

With ``--until-gb G`` it runs until the database holds G GB instead (``--seconds`` is then
a safety limit), and reports how long that took and the last interval's rate against the
first's.

    python bench/store_sustained.py [--seconds 12] [--every 2] [--publishers 256]
                                    [--until-gb 10]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors import open_store
from bench._common import print_table, write_json
from engine import BytesSource, Change, PublishRequest, new_package_id, tune_collector


async def run(root: Path, seconds: float, every: float, publishers: int,
              until_gb: float | None = None) -> list[dict[str, Any]]:
    rng = random.Random(1)
    pool = [os.urandom(rng.randint(2048, 8176)) for _ in range(512)]
    count = 0
    samples: list[dict[str, Any]] = []
    async with open_store(root) as store:
        heads: dict[int, tuple[str, int]] = {}
        for p in range(publishers):
            pkg = new_package_id()
            out = await store.publish(PublishRequest(pkg, f"S-{p}", None, Change(
                files={f"inputs/b{i:02d}": BytesSource.of(f"{p}-{i}".encode())
                       for i in range(14)}, phase="INTAKE")))
            heads[p] = (pkg, out.generation)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        done = False

        async def publisher(p: int) -> None:
            nonlocal count
            pkg, gen = heads[p]
            i = 0
            while not done and time.perf_counter() < deadline:
                files = {f"work/blob{(i + k) % 3}.bin": BytesSource.of(
                    pool[(p * 7 + i * 3 + k) % 512] + f"{p}:{i}:{k}".encode())
                    for k in range(3)}
                gen = (await store.publish(PublishRequest(pkg, f"S-{p}", gen,
                                                          Change(files=files)))).generation
                count += 1
                i += 1

        async def sample() -> None:
            nonlocal done
            last = 0
            while not done and time.perf_counter() < deadline:
                await trio.sleep(every)
                samples.append({"t_s": round(time.perf_counter() - t0, 1),
                                "pubs_per_s": (count - last) / every, "total": count,
                                "wal_mb": _size(root / "store.sqlite3-wal") / 1e6,
                                "db_mb": (root / "store.sqlite3").stat().st_size / 1e6})
                last = count
                if until_gb is not None and samples[-1]["db_mb"] >= until_gb * 1000:
                    done = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            for p in range(publishers):
                nursery.start_soon(publisher, p)
    return samples


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def main() -> None:
    tune_collector()  # the process as the viano command sets it up (engine/_process.py)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--publishers", type=int, default=256)
    ap.add_argument("--until-gb", type=float, default=None)
    args = ap.parse_args()
    seconds = args.seconds if args.until_gb is None else max(args.seconds, 3600.0)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        samples = trio.run(run, Path(tmp) / "store", seconds, args.every, args.publishers,
                           args.until_gb)
    print_table(f"sustained, {args.publishers} publishers", ["t s", "pubs/s", "total",
                "WAL MB", "DB MB"], [list(s.values()) for s in samples])
    first = sum(s["pubs_per_s"] for s in samples[:3]) / max(1, len(samples[:3]))
    last = sum(s["pubs_per_s"] for s in samples[-3:]) / max(1, len(samples[-3:]))
    print(f"\n{samples[-1]['db_mb'] / 1000:.1f} GB in {samples[-1]['t_s']} s; the last three "
          f"intervals at {last / first:.2f}x the first three ({last:,.0f} vs {first:,.0f}/s; "
          "goal >= 0.80)")
    write_json("store_sustained", {"publishers": args.publishers, "until_gb": args.until_gb,
                                   "samples": samples, "last_over_first": last / first})


if __name__ == "__main__":
    main()
