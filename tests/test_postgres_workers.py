"""Many workers on one PostgreSQL store: four ``viano daemon`` processes share 300 cases
through the loopback provider; one is SIGKILLed mid-run and its leases are taken over.

Counted at the provider (each worker's calls go to its own path prefix, ``/w<N>/v1``): no
case and phase was in flight at two workers at once, and no call came after a checkpointed
answer. Afterwards every case is COMPLETED with exactly one accepted interpretation and one
hypothesis batch, and ``viano verify`` is clean."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import open_backend
from tests.batch_helpers import loopback_toml, write_generic_answers
from tests.conftest import VIANO, child_env, run_viano
from tests.invariants import overlapping_calls, store_violations, worker_of
from tests.loopback.process import start_provider

pytestmark = pytest.mark.slow

CASES = 300
WORKERS = 4
LEASE_S = 2.0


def _config(tmp: Path, url: str, blob_root: Path, port: int, worker: int) -> Path:
    path = tmp / f"worker-{worker}.toml"
    path.write_text(f'[store]\nurl = "{url}"\nblob_root = "{blob_root}"\n'
                    f"lease_s = {LEASE_S}\n\n" +
                    loopback_toml(port, path_prefix=f"/w{worker}", model="test"))
    return path


def _wait_for(what: str, check: object, deadline_s: float) -> None:
    """Poll a condition of other processes (their progress cannot be awaited here)."""
    end = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _stop_all(procs: list[subprocess.Popen[str]], provider: Any) -> None:
    """However the test ended: no worker left running, and the provider stopped."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    provider.stop()


def test_four_daemons_share_one_store_and_take_over_a_killed_one(
        pg_url: str, tmp_path: Path) -> None:
    blob_root = tmp_path / "shared-blobs"
    reports = tmp_path / "reports"
    reports.mkdir()
    originals = {}
    for i in range(CASES):
        data = f"Crash number {i}\nIt crashes when started.\n".encode()
        (reports / f"W-{i:03d}.txt").write_bytes(data)
        originals[f"inputs/W-{i:03d}.txt"] = data
    provider = start_provider(tmp_path, write_generic_answers(tmp_path / "answers"),
                              delay_ms=100)
    procs: list[subprocess.Popen[str]] = []
    try:
        configs = [_config(tmp_path, pg_url, blob_root, provider.port, w)
                   for w in range(WORKERS)]
        r = run_viano("intake", "--config", configs[0], "--batch", reports, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["taken_in"] == CASES
        for w in range(WORKERS):
            log = (tmp_path / f"worker-{w}.err").open("w")
            procs.append(subprocess.Popen(
                [*VIANO, "daemon",
                 "--config", str(configs[w]), "--concurrency", "16", "--poll-s", "0.2"],
                stdout=subprocess.DEVNULL, stderr=log, text=True, env=child_env()))
            log.close()
        # Mid-run: the first worker has calls in flight (100 ms each), then it dies.
        _wait_for("the first worker's calls",
                  lambda: sum(worker_of(c) == "w0" for c in provider.calls) >= 40, 120)
        victim = procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        with psycopg.connect(pg_url) as conn:
            orphaned = [r[0] for r in conn.execute(
                "SELECT case_id FROM viano_leases WHERE holder LIKE %s",
                (f"%:{victim.pid}:%",))]
            unfinished = [r[0] for r in conn.execute(
                "SELECT case_id FROM viano_refs WHERE case_id = ANY(%s) AND status <> "
                "'COMPLETED'", (orphaned,))]
        assert unfinished, "the killed worker held no unfinished case: not killed mid-run"

        store = open_backend(pg_url, write=False, blob_root=str(blob_root))
        try:
            _wait_for("every case to complete", lambda: store.status_counts().get(
                ("GENERATING_HYPOTHESES", "COMPLETED"), 0) == CASES, 300)
        finally:
            store.close()
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs[1:]:
            assert p.wait(timeout=60) == 0
    finally:
        _stop_all(procs, provider)

    calls = provider.calls
    workers_seen = {worker_of(c) for c in calls}
    assert workers_seen == {f"w{w}" for w in range(WORKERS)}, workers_seen
    assert overlapping_calls(provider.finished) == []
    store = open_backend(pg_url, write=False, blob_root=str(blob_root))
    try:
        assert store_violations(store, originals, calls, one_batch=True) == []
        assert len(store.list_cases()) == CASES
        # The cases the killed worker left unfinished were taken over and completed.
        for case in unfinished:
            assert store.case(case).status.status == "COMPLETED"  # type: ignore[union-attr]
    finally:
        store.close()
    with psycopg.connect(pg_url) as conn:
        left = conn.execute("SELECT l.case_id, l.holder, r.status FROM viano_leases l "
                            "JOIN viano_refs r USING (case_id)").fetchall()
    # The survivors stopped cleanly and gave back every lease they held. A lease of the
    # killed worker stays only on a case it had itself completed (killed between that
    # commit and the release): nobody claims a completed case again, and it is expired.
    assert all(f":{victim.pid}:" in holder and status == "COMPLETED"
               for _case, holder, status in left), left
    r = run_viano("verify", "--config", tmp_path / "worker-1.toml", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout
    for w in range(1, WORKERS):
        assert "Traceback" not in (tmp_path / f"worker-{w}.err").read_text()


def test_two_batches_share_the_work_of_one_store(pg_url: str, tmp_path: Path) -> None:
    """``batch --all`` counted the due cases for its progress bar by claiming them: every
    one was leased to the first batch, and a second batch started beside it found
    "0 cases" and exited 0 (after a SIGKILL, the same command found none for lease_s).
    Counting takes no lease now: the second batch takes its share."""
    blob_root = tmp_path / "shared-blobs"
    reports = tmp_path / "reports"
    reports.mkdir()
    n = 40
    for i in range(n):
        (reports / f"T-{i:02d}.txt").write_bytes(f"Crash {i}\nIt crashes.\n".encode())
    provider = start_provider(tmp_path, write_generic_answers(tmp_path / "answers"),
                              delay_ms=150)
    procs: list[subprocess.Popen[str]] = []
    try:
        configs = [_config(tmp_path, pg_url, blob_root, provider.port, w) for w in (0, 1)]
        r = run_viano("intake", "--config", configs[0], "--batch", reports, "--json")
        assert r.returncode == 0, r.stderr
        for w in (0, 1):
            procs.append(subprocess.Popen(
                [*VIANO, "batch", "--all", "--json", "--config", str(configs[w]),
                 "--concurrency", "2"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()))
            if w == 0:  # the first has counted its cases and is at work
                _wait_for("the first batch's calls",
                          lambda: sum(worker_of(c) == "w0" for c in provider.calls) >= 2, 120)
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        _stop_all(procs, provider)
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    done = [{r["case_id"] for r in json.loads(o[0])["results"]
             if r["status"] == "COMPLETED"} for o in outs]
    assert done[1], "the second batch found no case: the first had leased them all"
    assert len(done[0] | done[1]) == n and not done[0] & done[1], done
    r = run_viano("verify", "--config", configs[0], "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stdout
