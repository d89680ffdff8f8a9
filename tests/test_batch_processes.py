"""``viano run|batch --processes N``: the cases spread over N worker processes, each on its
shard of the due index (a hash of the case id), as real processes against the loopback
provider in its own process. Every case is advanced once, by the worker whose shard holds
it; SIGTERM to the parent stops every worker and the same command resumes; a parent that
dies (SIGKILL) takes its workers with it; a worker that dies is reported, not hidden; and
the shard itself partitions the due index exactly, on both backends."""

from __future__ import annotations

import json
import os
import select
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import Shard, UsageError, shard_of
from tests.conftest import run_viano
from tests.loopback.process import Provider
from tests.store_helpers import create, open_ro
from tests.test_batch_cli import (  # noqa: F401  (_no_orphans: the autouse fixture)
    _completed_in,
    _config,
    _env,
    _intake,
    _no_orphans,
    _one_batch_each,
    _Process,
)
from viano_bug_analysis.cli._batch_workers import _added, share, share_of_config

pytestmark = pytest.mark.slow


class TestShard:
    def test_the_hash_is_pinned_and_parts_are_disjoint_and_cover(self) -> None:
        """Workers of different hosts or releases must agree on who holds a case: the
        hash is MD5's first four bytes, pinned here."""
        assert [shard_of("C-00001", n) for n in (2, 3, 1000)] == [0, 1, 932]
        ids = [f"C-{i:05d}" for i in range(2000)]
        for count in (1, 2, 3, 7):
            parts = [{c for c in ids if Shard(i, count).holds(c)} for i in range(count)]
            assert set().union(*parts) == set(ids)
            assert sum(len(p) for p in parts) == len(ids)  # disjoint
            assert min(len(p) for p in parts) > len(ids) / count * 0.8  # and even

    def test_the_hash_is_md5s_first_four_bytes(self) -> None:
        import hashlib

        digest = hashlib.md5(b"BUG-20").digest()
        assert shard_of("BUG-20", 97) == int.from_bytes(digest[:4], "big") % 97

    @pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "2", "1/257", "-1/2"])
    def test_bad_shards_are_refused(self, text: str) -> None:
        with pytest.raises(UsageError):
            Shard.parse(text)

    def test_shown_one_based(self) -> None:
        assert str(Shard.parse("2/4")) == "2/4" and Shard.parse("2/4").index == 1

    def test_shares_add_up(self) -> None:
        for value in (1, 5, 16, 17, 512):
            for count in (1, 2, 3, 4):
                shares = [share(value, Shard(i, count)) for i in range(count)]
                assert sum(shares) == max(value, count), (value, count, shares)

    def test_each_provider_limit_is_shared(self) -> None:
        from engine import ProviderConfig
        from tests.batch_helpers import batch_config

        config = batch_config([ProviderConfig(
            name="a", kind="openai", base_url="http://127.0.0.1:9/v1", model="m",
            api_key_env="K", max_concurrency=5)])
        limits = [share_of_config(config, Shard(i, 2)).providers[0].max_concurrency
                  for i in range(2)]
        assert sorted(limits) == [2, 3]

    def test_counters_are_added(self) -> None:
        total = _added([{"transactions": 2, "publications": 10, "largest_batch": 6,
                         "publications_per_transaction": 5.0},
                        {"transactions": 3, "publications": 5, "largest_batch": 4,
                         "publications_per_transaction": 1.67}])
        assert total == {"transactions": 5, "publications": 15, "largest_batch": 6,
                         "publications_per_transaction": 3.0}


@pytest.mark.usefixtures("backend")
class TestTheDueIndexByShard:
    async def test_shards_partition_due_cases_claims_and_next_due(self, tmp_path: Path
                                                                  ) -> None:
        """Union of the shards = the whole due index, no case in two; each shard's next
        due time is its own retries' (a worker waiting for another shard's retry spun)."""
        from actors import open_store
        from engine import CaseStatus

        ids = [f"P-{i:03d}" for i in range(40)]
        async with open_store(tmp_path / "s") as store:
            for i, case_id in enumerate(ids):
                out = await store.publish(create(case_id))
                if i % 4 == 0:
                    await store.snapshot_of(out).set_status(CaseStatus(
                        status="RETRY_PENDING", phase="INTAKE", due_at=1000.0 + i))
        store2 = open_ro(tmp_path / "s")
        try:
            whole = {r.case_id for r in store2.due_cases(now=10_000.0, limit=100)}
            assert whole == set(ids)
            for count in (2, 3):
                parts = [{r.case_id for r in store2.due_cases(
                    now=10_000.0, limit=100, shard=Shard(i, count))} for i in range(count)]
                assert set().union(*parts) == whole
                assert sum(len(p) for p in parts) == len(whole)
                for i, part in enumerate(parts):
                    assert all(shard_of(c, count) == i for c in part)
                    claimed = {r.case_id for r in store2.claim_due(
                        10_000.0, 100, shard=Shard(i, count))}
                    assert claimed == part
                    retries = [1000.0 + j for j, c in enumerate(ids)
                               if j % 4 == 0 and shard_of(c, count) == i]
                    assert store2.next_due(Shard(i, count)) == min(retries, default=None)
        finally:
            store2.close()


@pytest.fixture
def provider(tmp_path: Path) -> Provider:
    from tests.batch_helpers import write_generic_answers

    p = Provider(tmp_path, write_generic_answers(tmp_path / "answers"), delay_ms=30)
    yield p  # type: ignore[misc]
    p.stop()


@pytest.fixture
def slow(tmp_path: Path) -> Provider:
    from tests.batch_helpers import write_generic_answers

    p = Provider(tmp_path, write_generic_answers(tmp_path / "answers-slow"), delay_ms=200)
    yield p  # type: ignore[misc]
    p.stop()


def _children(pid: int) -> list[int]:
    """Of every thread of ``pid`` (trio starts a process from a worker thread)."""
    return sorted(int(x) for task in Path(f"/proc/{pid}/task").iterdir()
                  for x in (task / "children").read_text().split())


def _wait_gone(pid: int, timeout: float = 30) -> bool:
    """Whether process ``pid`` (not our child) ended within ``timeout``: a pidfd becomes
    readable when it does, so this waits on the event, not the clock."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


class TestProcesses:
    @pytest.mark.usefixtures("backend")
    async def test_every_case_once_by_the_worker_of_its_shard(
            self, tmp_path: Path, provider: Provider) -> None:
        store = tmp_path / "s"
        ids = [f"W-{i:02d}" for i in range(18)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, provider.port))
        r = run_viano("batch", "--store", store, "--all", "--processes", "3",
                      "--concurrency", "6", "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        summary = doc["summary"]
        assert summary["cases"] == len(ids) and summary["by_status"] == {"COMPLETED": 18}
        assert sorted(x["case_id"] for x in doc["results"]) == ids
        workers = summary["processes"]
        assert [w["shard"] for w in workers] == ["1/3", "2/3", "3/3"]
        assert all(w["finished"] and w["exit_code"] == 0 for w in workers), workers
        # each worker advanced exactly the cases of its shard
        assert [w["cases"] for w in workers] == [
            sum(shard_of(c, 3) == i for c in ids) for i in range(3)]
        assert summary["store"]["publications"] >= 6 * len(ids)
        assert summary["providers"]["loopback"]["answers"] == 2 * len(ids)
        calls = Counter((c["case_id"], c["prompt_id"]) for c in provider.calls)
        assert len(calls) == 2 * len(ids) and set(calls.values()) == {1}, calls
        _one_batch_each(store, ids)

    async def test_text_lines_and_a_selection(self, tmp_path: Path, provider: Provider
                                              ) -> None:
        """Given ids (not --all): each is advanced once, by its shard's worker; a line per
        result on a pipe, then the summary line."""
        store = tmp_path / "s"
        ids = [f"L-{i}" for i in range(8)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, provider.port))
        r = run_viano("run", "--store", store, *ids[:5], "--processes", "2",
                      "--concurrency", "2", env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert sorted(x.split()[0] for x in lines[:-1]) == ids[:5]
        assert lines[-1].startswith("5 cases: COMPLETED 5;"), lines[-1]
        assert _completed_in(store) == set(ids[:5])

    async def test_sigterm_stops_every_worker_and_the_same_command_resumes(
            self, tmp_path: Path, slow: Provider) -> None:
        store = tmp_path / "s"
        ids = [f"S-{i}" for i in range(8)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow.port))
        args = ("batch", "--store", store, "--all", "--processes", "2", "--concurrency", "2")
        first = _Process(*args, env=env)
        first.until(lambda seen: len(seen) >= 1)
        workers = _children(first.proc.pid)
        assert len(workers) == 2
        first.proc.send_signal(signal.SIGTERM)
        rc, err = first.finish(timeout=60)
        assert rc == 130, (first.seen, err)
        assert "interrupted: run the same command to resume" in first.seen[-1]
        assert all(_wait_gone(pid) for pid in workers)
        assert set(ids) - _completed_in(store)  # it really stopped mid-batch
        again = run_viano(*args, "--json", env=env)
        assert again.returncode == 0, again.stderr
        assert _completed_in(store) == set(ids)
        _one_batch_each(store, ids)
        calls = Counter((c["case_id"], c["prompt_id"]) for c in slow.calls)
        assert max(calls.values()) <= 2, calls  # a call cut off before its checkpoint

    async def test_a_parent_killed_takes_its_workers_with_it(
            self, tmp_path: Path, slow: Provider) -> None:
        """SIGKILL of the parent: its workers see their stdin end and stop (no orphans
        advancing cases nobody reports); the same command resumes."""
        store = tmp_path / "s"
        ids = [f"K-{i}" for i in range(8)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow.port))
        args = ("batch", "--store", store, "--all", "--processes", "2", "--concurrency", "2")
        first = _Process(*args, env=env)
        first.until(lambda seen: len(seen) >= 1)
        workers = _children(first.proc.pid)
        assert len(workers) == 2
        first.proc.kill()
        first.finish(timeout=30)
        assert all(_wait_gone(pid) for pid in workers), "a worker outlived its parent"
        assert set(ids) - _completed_in(store), "the workers went on without their parent"
        again = run_viano(*args, env=env)
        assert again.returncode == 0, again.stderr
        _one_batch_each(store, ids)

    async def test_a_worker_killed_is_reported_and_the_rest_finish(
            self, tmp_path: Path, slow: Provider) -> None:
        store = tmp_path / "s"
        ids = [f"X-{i}" for i in range(10)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, slow.port))
        args = ("batch", "--store", store, "--all", "--processes", "2", "--concurrency", "2")
        first = _Process(*args, "--json", "--log-json", "-", env=env)

        def both_entered(err: list[str]) -> bool:  # a case of each shard has begun
            entered = [json.loads(x)["case_id"] for x in err
                       if x.startswith("{") and '"step": "enter"' in x]
            return {shard_of(c, 2) for c in entered} == {0, 1}

        first.until(both_entered, stream="err")
        workers = _children(first.proc.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        rc, err = first.finish(timeout=120)
        doc = json.loads("\n".join(first.seen))
        assert rc == 1, (rc, err)
        assert "ended by SIGKILL before it finished" in err
        assert "run the same command again" in err
        finished = [w["finished"] for w in doc["summary"]["processes"]]
        assert sorted(finished) == [False, True], doc["summary"]["processes"]
        again = run_viano(*args, env=env)
        assert again.returncode == 0, again.stderr
        _one_batch_each(store, ids)


class TestRefusals:
    @pytest.mark.parametrize("extra", [["--processes", "0"], ["--processes", "65"],
                                       ["--processes", "3", "--concurrency", "2"],
                                       ["--worker-shard", "3/2"]])
    async def test_usage_errors_write_nothing(self, tmp_path: Path, provider: Provider,
                                              extra: list[str]) -> None:
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["U-1"])
        env = _env(_config(tmp_path, provider.port))
        r = run_viano("batch", "--store", store, "--all", *extra, env=env)
        assert r.returncode == 2, r.stderr
        assert "usage_error" in r.stderr or "error:" in r.stderr
        assert not provider.calls and _completed_in(store) == set()

    def test_a_missing_store_is_said_once(self, tmp_path: Path, provider: Provider) -> None:
        env = _env(_config(tmp_path, provider.port))
        r = run_viano("batch", "--store", tmp_path / "nope", "--all", "--processes", "3",
                      "--concurrency", "3", env=env)
        assert r.returncode == 2 and r.stderr.count("error[no_store]") == 1, r.stderr
        assert not (tmp_path / "nope").exists()

    async def test_an_unknown_case_is_said_once(self, tmp_path: Path, provider: Provider
                                                ) -> None:
        store = tmp_path / "s"
        await _intake(store, tmp_path, ["U-1"])
        env = _env(_config(tmp_path, provider.port))
        r = run_viano("batch", "--store", store, "U-1", "NOPE", "--processes", "2",
                      "--concurrency", "2", env=env)
        assert r.returncode == 2 and r.stderr.count("error[unknown_case]") == 1, r.stderr
        assert not provider.calls

    def test_help_names_the_option(self) -> None:
        r = run_viano("batch", "--help")
        assert "--processes N" in r.stdout and "--worker-shard" not in r.stdout


class TestShardedDaemons:
    async def test_two_daemons_each_serve_their_shard(self, tmp_path: Path,
                                                      provider: Provider) -> None:
        store = tmp_path / "s"
        ids = [f"DS-{i}" for i in range(10)]
        await _intake(store, tmp_path, ids)
        env = _env(_config(tmp_path, provider.port))
        daemons = [_Process("daemon", "--store", store, "--concurrency", "2", "--poll-s",
                            "0.2", "--shard", f"{i + 1}/2", env=env) for i in range(2)]
        mine = [{c for c in ids if shard_of(c, 2) == i} for i in range(2)]

        def done(i: int) -> Callable[[list[str]], bool]:
            return lambda seen: {x.split()[0] for x in seen
                                 if " COMPLETED completed (phase GENERATING" in x} >= mine[i]

        for i, daemon in enumerate(daemons):
            daemon.until(done(i))
        for daemon in daemons:
            daemon.proc.send_signal(signal.SIGTERM)
        for i, daemon in enumerate(daemons):
            rc, err = daemon.finish(timeout=60)
            assert rc == 0, err
            assert f"shard {i + 1}/2" in err
            served = {x.split()[0] for x in daemon.seen}
            assert served == mine[i], (i, served)  # nothing of the other shard
        _one_batch_each(store, ids)
        calls = Counter((c["case_id"], c["prompt_id"]) for c in provider.calls)
        assert set(calls.values()) == {1} and len(calls) == 2 * len(ids)

    def test_a_bad_shard_is_a_usage_error(self, tmp_path: Path) -> None:
        r = run_viano("daemon", "--store", tmp_path / "s", "--shard", "3/2")
        assert r.returncode == 2 and "--shard" in r.stderr, r.stderr
