"""Intake of the 300 real SWE-bench Lite reports: one process per report, as a user without
bulk intake has to, beside one ``viano intake --batch`` of the same reports, in the same run.

Each report becomes a GitHub-shaped issue (``gh issue view --json`` fields) whose body is
the problem statement; the per-process run uses the installed entry point exactly as a
user would (``python -m`` start-up included). Skipped, with a message, when
``../shared/data/swebench-lite-issues.csv`` is absent.

    python bench/intake.py [--repeats 3] [--limit 300]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import median, print_table, write_json

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "swebench-lite-issues.csv"
VIANO = [sys.executable, "-c", "from viano_bug_analysis.cli import run; run()"]


def reports(limit: int) -> list[dict[str, Any]]:
    csv.field_size_limit(1 << 30)
    out = []
    with DATA.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            owner_repo, _, number = row["instance_id"].rpartition("-")
            owner, _, repo = owner_repo.partition("__")
            statement = row["problem_statement"]
            title = next((ln.strip() for ln in statement.splitlines() if ln.strip()), "issue")
            out.append({"number": int(number), "title": title[:200], "body": statement,
                        "author": {"login": "swe-bench"},
                        "url": f"https://github.com/{owner}/{repo}/issues/{number}",
                        "comments": []})
            if len(out) >= limit:
                break
    return out


def one_per_process(folder: Path, store: Path) -> float:
    started = time.perf_counter()
    for path in sorted(folder.iterdir()):
        subprocess.run([*VIANO, "intake", "--store", str(store), "--report", str(path)],
                       check=True, capture_output=True)
    return time.perf_counter() - started


def one_batch(folder: Path, store: Path) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    r = subprocess.run([*VIANO, "intake", "--json", "--store", str(store), "--batch",
                        str(folder)], check=True, capture_output=True, text=True)
    return time.perf_counter() - started, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=300)
    args = ap.parse_args()
    if not DATA.exists():
        print(f"skipped: {DATA} is absent (the SWE-bench Lite reports are not shipped)")
        return
    issues = reports(args.limit)
    single, bulk, per_txn = [], [], []
    with tempfile.TemporaryDirectory(prefix="viano-bench-intake-") as tmp:
        folder = Path(tmp) / "reports"
        folder.mkdir()
        for i, issue in enumerate(issues):
            (folder / f"{i:04d}.json").write_text(json.dumps(issue, ensure_ascii=False))
        for rep in range(args.repeats):
            for name in ("single", "bulk"):
                shutil.rmtree(Path(tmp) / name, ignore_errors=True)
            single.append(one_per_process(folder, Path(tmp) / "single"))
            seconds, summary = one_batch(folder, Path(tmp) / "bulk")
            assert summary["taken_in"] == len(issues), summary["refused"][:3]
            bulk.append(seconds)
            per_txn.append(summary["store"]["publications_per_transaction"])
            print(f"  rep {rep + 1}: one per process {single[-1]:.1f}s, --batch "
                  f"{bulk[-1]:.2f}s")
    n = len(issues)
    rows = [("one process per report", n, median(single), n / median(single), 1.0, 1.0),
            ("one --batch", n, median(bulk), n / median(bulk), median(single) / median(bulk),
             median(per_txn))]
    print_table(f"intake of {n} SWE-bench Lite reports (medians of {args.repeats})",
                ["how", "reports", "seconds", "cases/s", "x per-process", "pubs/txn"], rows)
    write_json("intake", {"reports": n, "repeats": args.repeats,
                          "one_per_process_s": single, "batch_s": bulk,
                          "publications_per_transaction": per_txn,
                          "cases_per_s": {"one_per_process": n / median(single),
                                          "batch": n / median(bulk)},
                          "ratio": median(single) / median(bulk)})


if __name__ == "__main__":
    main()
