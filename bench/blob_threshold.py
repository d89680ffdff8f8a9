"""Where should a blob stop living inside SQLite and become its own fsynced file?

For each size, publishes blobs one per transaction (the durable path of a real intake)
stored inline and stored as files, and reads them back; prints MB/s for both and the
ratio. Runs ``--repeats`` times and reports medians.

    python bench/blob_threshold.py [--repeats 3] [--mib 24]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import median, print_table, write_json
from engine import BytesSource, Change, Published, PublishRequest, SqliteStore, new_package_id

SIZES = [16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]


def run(size: int, inline: bool, total: int) -> tuple[float, float]:
    count = max(4, total // size)
    blobs = [os.urandom(size) for _ in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore.open(Path(tmp), write=True,
                                 inline_threshold=(1 << 40) if inline else 0)
        t0 = time.perf_counter()
        hashes = []
        for i, data in enumerate(blobs):
            out = store.commit_batch([PublishRequest(new_package_id(), f"T-{i}", None, Change(
                files={"inputs/blob.bin": BytesSource.of(data)}, phase="INTAKE"))])
            assert isinstance(out[0], Published), out[0]
            hashes.append(out[0].manifest.files["inputs/blob.bin"].sha256)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for sha in hashes:
            store.read_blob(sha)
        read_s = time.perf_counter() - t0
        store.close()
    mb = count * size / 1e6
    return mb / write_s, mb / read_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mib", type=int, default=24, help="data written per size and mode")
    args = ap.parse_args()
    rows, out = [], []
    for size in SIZES:
        res = {mode: [run(size, mode == "inline", args.mib << 20) for _ in range(args.repeats)]
               for mode in ("inline", "file")}
        w_in = median([r[0] for r in res["inline"]])
        w_f = median([r[0] for r in res["file"]])
        r_in = median([r[1] for r in res["inline"]])
        r_f = median([r[1] for r in res["file"]])
        row = {"size_kib": size >> 10, "write_inline_mb_s": w_in, "write_file_mb_s": w_f,
               "write_file_vs_inline": w_f / w_in, "read_inline_mb_s": r_in,
               "read_file_mb_s": r_f, "read_file_vs_inline": r_f / r_in}
        out.append(row)
        rows.append(list(row.values()))
        print(f"  {size >> 10} KiB done", flush=True)
    print_table(f"blob storage, medians of {args.repeats}", ["KiB", "write inline MB/s",
                "write file MB/s", "file/inline", "read inline MB/s", "read file MB/s",
                "file/inline"], rows)
    write_json("blob_threshold", {"repeats": args.repeats, "rows": out})


if __name__ == "__main__":
    main()
