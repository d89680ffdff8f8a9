"""Shared helpers for benchmarks: medians, tables, JSON results."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# The benchmarks' provider key: shaped like a real one. A key that is also an ordinary word
# of the requests ("bench" was the model's name) made the redactor mask every body, the
# slow path, which no real deployment takes.
BENCH_KEY = "sk-bench-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if 0 < abs(v) < 0.1:  # a group commit's tx/pub: 0.004, not 0.00
            return f"{v:.2g}"
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": datetime.now(UTC).isoformat(),
               "python": sys.version.split()[0], "machine": platform.machine(),
               "cpus": __import__("os").cpu_count(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nresults written to {path}")
    return path


def parse_args(doc: str | None, list_flag: str, list_default: str) -> argparse.Namespace:
    """The options every benchmark shares: --seconds, --repeats and one comma list."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(f"--{list_flag}", default=list_default)
    return ap.parse_args()


def stop_server(proc: subprocess.Popen[str]) -> None:
    """End a loopback server started by a benchmark, and close the pipe it announced its
    port on (left open, every run leaked a file)."""
    proc.terminate()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
