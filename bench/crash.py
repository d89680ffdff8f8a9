"""Crash injection, then the invariants checked on what the crash left.

1. **Named crash points**, one run each (deterministic): every point of intake and of
   publication (``blob.*``, ``batch.blobs_ready``, ``txn.*``) in a ``viano intake`` whose
   attachment is large enough to be a blob file, and every point of both phases and of
   publication (``phase.*``, ``txn.*``) in a ``viano batch``; the process dies there with
   ``os._exit(137)`` (``VIANO_CRASH_AT``), then the same command runs again to the end.
2. **Random SIGKILLs**: ``--trials`` times, a real ``viano batch --all`` over ``--cases``
   cases is SIGKILLed at a random moment, then restarted until it is done.

The provider is the loopback server in its own process (``--delay-ms`` of latency),
logging every call with its arrival time. After each run:

* ``viano verify`` is clean;
* every case is COMPLETED, with exactly one accepted interpretation and at most one
  hypothesis batch per revision;
* no H id or allocation is duplicated, and the allocations are created_count ×
  initial_budget;
* the originals are byte-identical to the files taken in;
* no model call came after a checkpointed answer (a call for a case and phase that
  arrived after that phase's durable answer round was finished).

Reported: trials, violations (each named), the calls repeated because a crash came before
their checkpoint, and the mean recovery time (restart to the first resumed case).

    python bench/crash.py [--trials 200] [--cases 6] [--delay-ms 20] [--seed 1]
                          [--no-points]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._common import median, print_table, write_json  # noqa: E402
from engine import open_backend  # noqa: E402
from tests.batch_helpers import loopback_toml, write_generic_answers  # noqa: E402
from tests.invariants import repeated_calls, store_violations  # noqa: E402

VIANO = [sys.executable, "-c", "from viano_bug_analysis.cli import run; run()"]
INTAKE_POINTS = ("blob.write", "blob.fsync", "blob.rename", "blob.dirsync",
                 "batch.blobs_ready", "txn.before_commit", "txn.after_commit")
PHASE_POINTS = ("phase.entered", "phase.answered", "phase.recorded", "phase.judged",
                "txn.before_commit:3", "txn.after_commit:3")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("VIANO_CRASH_AT", None)
    env.update(extra)
    return env


def viano(*args: str | Path, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VIANO, *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, check=False)


class Provider:
    def __init__(self, tmp: Path, delay_ms: float):
        answers = write_generic_answers(tmp / "answers")
        self.log = tmp / "calls.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.loopback", "--answers", str(answers), "--log",
             str(self.log), "--delay-ms", str(delay_ms)], cwd=REPO, env=_env(),
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().split()[1])

    def calls(self, since: float) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]
        return [c for c in out if c["t"] >= since and "end" not in c]  # arrivals only

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


def write_config(path: Path, port: int) -> Path:
    path.write_text(loopback_toml(port))
    return path


def make_inputs(folder: Path, cases: int) -> dict[str, dict[str, bytes]]:
    """Text reports (one folder, for a bulk intake) and one large attachment; returns each
    case's originals by input name."""
    folder.mkdir(parents=True)
    originals: dict[str, dict[str, bytes]] = {}
    for i in range(cases):
        name = f"C-{i:03d}.txt"
        data = f"Crash number {i}\nIt crashes when started, ünïcode ✓.\n".encode()
        (folder / name).write_bytes(data)
        originals[f"case-{i}"] = {f"inputs/{name}": data}
    return originals


def check(store_root: Path, originals: dict[str, bytes], calls: list[dict[str, Any]]
          ) -> tuple[list[str], int]:
    """(violations, repeated calls) of one finished run (see tests/invariants.py)."""
    problems: list[str] = []
    r = viano("verify", "--store", store_root)
    if r.returncode != 0:
        problems.append(f"verify: {r.stdout.strip()[-300:]}")
    store = open_backend(str(store_root), write=False)
    try:
        problems += store_violations(store, originals, calls)
    finally:
        store.close()
    return problems, repeated_calls(calls)


def fresh_template(tmp: Path, cases: int) -> tuple[Path, dict[str, bytes]]:
    folder = tmp / "reports"
    per_case = make_inputs(folder, cases)
    template = tmp / "template"
    r = viano("intake", "--json", "--store", template, "--batch", folder)
    assert r.returncode == 0, r.stdout + r.stderr
    originals = {k: v for d in per_case.values() for k, v in d.items()}
    return template, originals


def run_to_end(args: list[str | Path], env: dict[str, str]) -> tuple[int, float | None]:
    """Run a command to its end; (exit code, seconds to its first output line)."""
    started = time.perf_counter()
    proc = subprocess.Popen([*VIANO, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    first = None
    with proc.stdout:
        for _line in proc.stdout:
            if first is None:
                first = time.perf_counter() - started
    return proc.wait(timeout=600), first


def named_points(tmp: Path, provider: Provider, config: Path, cases: int
                 ) -> list[dict[str, Any]]:
    out = []
    big = tmp / "big-diagnostics.log"
    big.write_bytes(b"".join(b"%06d a long diagnostics line of the crashing run\n" % i
                             for i in range(8000)))  # ~400 KiB: a blob file
    report = tmp / "report.txt"
    report.write_bytes(b"Crash at start\nThe tool crashes when it starts.\n")
    for point in INTAKE_POINTS:
        store = tmp / f"point-{point}"
        since = time.time()
        crashed = viano("intake", "--store", store, "--report", report, "--attach",
                        f"diagnostics={big}", "--case-id", "P-1",
                        env=_env(VIANO_CRASH_AT=point))
        again = viano("intake", "--store", store, "--report", report, "--attach",
                      f"diagnostics={big}", "--case-id", "P-1")
        finished = viano("batch", "--store", store, "--config", config, "--all")
        problems, repeated = check(store, {"inputs/report.txt": report.read_bytes(),
                                           "inputs/big-diagnostics.log": big.read_bytes()},
                                   provider.calls(since))
        if crashed.returncode != 137:
            problems.append(f"the crash point {point} was not reached "
                            f"(exit {crashed.returncode})")
        if again.returncode not in (0, 2) or finished.returncode != 0:
            problems.append(f"after the crash: intake exit {again.returncode}, batch exit "
                            f"{finished.returncode}")
        out.append({"point": point, "where": "intake", "violations": problems,
                    "repeated_calls": repeated})
        shutil.rmtree(store, ignore_errors=True)
    template, originals = fresh_template(tmp / "points", cases)
    for point in PHASE_POINTS:
        store = tmp / f"point-{point}"
        shutil.copytree(template, store)
        since = time.time()
        crashed = viano("batch", "--store", store, "--config", config, "--all",
                        "--concurrency", "2", env=_env(VIANO_CRASH_AT=point))
        finished = viano("batch", "--store", store, "--config", config, "--all")
        problems, repeated = check(store, originals, provider.calls(since))
        if crashed.returncode != 137:
            problems.append(f"the crash point {point} was not reached "
                            f"(exit {crashed.returncode})")
        if finished.returncode != 0:
            problems.append(f"the batch after the crash exited {finished.returncode}")
        out.append({"point": point, "where": "batch", "violations": problems,
                    "repeated_calls": repeated})
        shutil.rmtree(store, ignore_errors=True)
    return out


def sigkill_trials(tmp: Path, provider: Provider, config: Path, trials: int, cases: int,
                   seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    template, originals = fresh_template(tmp / "trials", cases)
    batch: list[str | Path] = ["batch", "--config", config, "--all", "--concurrency", "4"]
    # One uncrashed run sets the window the kills fall in.
    probe = tmp / "probe"
    shutil.copytree(template, probe)
    t0 = time.perf_counter()
    code, _ = run_to_end([*batch, "--store", probe], _env())
    window = time.perf_counter() - t0
    assert code == 0, f"an uncrashed batch exited {code}"
    shutil.rmtree(probe)
    results = []
    started = time.perf_counter()
    for trial in range(trials):
        store = tmp / f"trial-{trial}"
        shutil.copytree(template, store)
        since = time.time()
        proc = subprocess.Popen([*VIANO, *map(str, [*batch, "--store", store])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=_env())
        delay = rng.uniform(0.0, window)
        try:
            proc.wait(timeout=delay)
            killed = False  # it finished before the kill
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            killed = True
        restarts, recovery = 0, None
        code = 0
        if killed:
            for restarts in range(1, 6):  # noqa: B007 - the count is reported
                code, first = run_to_end([*batch, "--store", store], _env())
                recovery = first if recovery is None else recovery
                if code == 0:
                    break
        problems, repeated = check(store, originals, provider.calls(since))
        if code != 0:
            problems.append(f"the batch did not finish after {restarts} restarts "
                            f"(exit {code})")
        results.append({"trial": trial, "kill_after_s": round(delay, 3), "killed": killed,
                        "restarts": restarts, "recovery_s": recovery,
                        "violations": problems, "repeated_calls": repeated})
        shutil.rmtree(store, ignore_errors=True)
        if (trial + 1) % 20 == 0 or trial + 1 == trials:
            bad = sum(1 for r in results if r["violations"])
            print(f"  {trial + 1}/{trials} trials, {bad} with violations", flush=True)
    return {"window_s": window, "seconds": time.perf_counter() - started, "trials": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-points", action="store_true", help="only the random SIGKILLs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="viano-bench-crash-",
                                     dir=os.environ.get("BENCH_TMP")) as tmp_name:
        tmp = Path(tmp_name)
        provider = Provider(tmp, args.delay_ms)
        try:
            config = write_config(tmp / "config.toml", provider.port)
            points = [] if args.no_points else named_points(tmp, provider, config,
                                                            args.cases)
            trials = sigkill_trials(tmp, provider, config, args.trials, args.cases, args.seed)
        finally:
            provider.stop()
    if points:
        print_table("named crash points (one run each)",
                    ["point", "in", "violations", "repeated calls"],
                    [(p["point"], p["where"], len(p["violations"]), p["repeated_calls"])
                     for p in points])
        for p in points:
            for v in p["violations"]:
                print(f"  VIOLATION at {p['point']}: {v}")
    rows = trials["trials"]
    killed = [r for r in rows if r["killed"]]
    recoveries = [r["recovery_s"] for r in killed if r["recovery_s"] is not None]
    violations = sum(len(r["violations"]) for r in rows)
    summary = {"trials": len(rows), "killed_mid_run": len(killed),
               "violations": violations,
               "repeated_calls": sum(r["repeated_calls"] for r in rows),
               "mean_recovery_s": sum(recoveries) / len(recoveries) if recoveries else None,
               "median_recovery_s": median(recoveries) if recoveries else None,
               "seconds": trials["seconds"], "kill_window_s": trials["window_s"]}
    print_table(f"random SIGKILLs of viano batch ({args.cases} cases, {args.delay_ms:g} ms "
                "model latency)",
                ["trials", "killed mid-run", "violations", "repeated calls",
                 "mean recovery s", "seconds"],
                [(summary["trials"], summary["killed_mid_run"], violations,
                  summary["repeated_calls"], summary["mean_recovery_s"] or 0,
                  summary["seconds"])])
    for r in rows:
        for v in r["violations"]:
            print(f"  VIOLATION in trial {r['trial']}: {v}")
    write_json("crash", {"args": vars(args), "points": points, "summary": summary,
                         "trials": rows})
    if violations or any(p["violations"] for p in points):
        sys.exit(1)


if __name__ == "__main__":
    main()
