"""What only the PostgreSQL backend has: opening a database (schema, format, foreign tables,
the blob root, URLs and their passwords, a role that may only read), leases as rows shared
by workers (claims with SKIP LOCKED, expiry, renewal, the fence on a worker whose lease was
taken over), the CLI with ``[store] url``, and export/import across the two backends.

The behaviour both backends share is tested by running the store, phase and CLI tests on
both (the ``backend`` fixture); this file holds what has no SQLite counterpart."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import psycopg
import pytest

from engine import (
    BytesSource,
    CaseLocked,
    CaseStatus,
    Change,
    ChangeRejected,
    ConfigError,
    NotAStore,
    NotFound,
    Published,
    PublishRequest,
    StaleGeneration,
    StorageError,
    StoreConfig,
    VianoError,
    new_package_id,
    open_backend,
)
from tests.conftest import PYTHON, Cli, child_env, run_viano
from tests.phase_helpers import completed_sample_store
from tests.store_helpers import create


def _open(url: str, root: Path, *, write: bool = True, **kw: Any) -> Any:
    return open_backend(url, write=write, blob_root=str(root), **kw)


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1")]


def _exec(url: str, stmt: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(stmt, params)  # type: ignore[arg-type]
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


_FIXTURE = '[[providers]]\nname = "f"\nkind = "fixture"\npath = "answers"\n'


def _config(tmp: Path, url: str, blob_root: Path, *, lease_s: float = 30,
            extra: str = "") -> Path:
    path = tmp / f"viano-{os.urandom(3).hex()}.toml"
    path.write_text(f'[store]\nurl = "{url}"\nblob_root = "{blob_root}"\nlease_s = {lease_s}\n'
                    + extra)
    return path


class TestOpening:
    def test_a_read_only_open_of_an_empty_database_creates_nothing(self, pg_url: str,
                                                                   tmp_path: Path) -> None:
        with pytest.raises(NotFound) as info:
            _open(pg_url, tmp_path / "blobs", write=False)
        assert info.value.reason == "no_store"
        assert _tables(pg_url) == [] and not (tmp_path / "blobs").exists()

    def test_a_write_open_creates_the_schema_and_its_version(self, pg_url: str,
                                                             tmp_path: Path) -> None:
        store = _open(pg_url, tmp_path / "b")
        out = store.commit_batch([create("PG-1")])
        assert isinstance(out[0], Published)
        store.close()
        assert _tables(pg_url) == ["viano_blobs", "viano_generations", "viano_leases",
                                   "viano_meta", "viano_refs"]
        meta = dict(_exec(pg_url, "SELECT key, value FROM viano_meta"))
        assert meta["format"] == "viano-pg/1"
        assert (tmp_path / "b" / "store-id").read_text().strip() == meta["store_id"]
        again = _open(pg_url, tmp_path / "b", write=False)
        assert [c.case_id for c in again.list_cases()] == ["PG-1"]
        again.close()

    @pytest.mark.parametrize(("value", "reason"), [("viano-pg/2", "store_format"),
                                                   ("viano-pg/0", "store_format"),
                                                   ("viano-store/2", "store_corrupt"),
                                                   ("", "store_corrupt")])
    def test_another_format_is_refused(self, pg_url: str, tmp_path: Path, value: str,
                                       reason: str) -> None:
        _open(pg_url, tmp_path / "b").close()
        _exec(pg_url, "UPDATE viano_meta SET value = %s WHERE key = 'format'", value)
        for write in (False, True):
            with pytest.raises(StorageError) as info:
                _open(pg_url, tmp_path / "b", write=write)
            assert info.value.reason == reason, (write, info.value.message)

    def test_a_database_holding_other_tables_is_not_taken_over(self, pg_url: str,
                                                               tmp_path: Path) -> None:
        _exec(pg_url, "CREATE TABLE invoices (id int)")
        with pytest.raises(NotAStore):
            _open(pg_url, tmp_path / "b")
        assert _tables(pg_url) == ["invoices"]

    def test_a_blob_root_is_required(self, pg_url: str) -> None:
        with pytest.raises(ConfigError) as info:
            open_backend(pg_url, write=True)
        assert "blob_root" in info.value.hint

    def test_a_blob_root_of_another_store_is_refused(self, pg_url: str, pg_databases: Any,
                                                     tmp_path: Path) -> None:
        _open(pg_url, tmp_path / "b").close()
        other = pg_databases.create()
        with pytest.raises(StorageError) as info:
            _open(other, tmp_path / "b")
        assert info.value.reason == "store_corrupt"
        (tmp_path / "c" / "blobs").mkdir(parents=True)  # blobs, but no store-id
        with pytest.raises(StorageError) as info:
            _open(other, tmp_path / "c")
        assert info.value.reason == "store_corrupt"

    def test_a_password_never_reaches_a_message_or_the_location(self, tmp_path: Path
                                                                ) -> None:
        url = "postgresql://viano:hunter2secret@127.0.0.1:1/viano?connect_timeout=2"
        with pytest.raises(StorageError) as info:
            _open(url, tmp_path / "b")
        assert info.value.reason == "store_unavailable"
        assert "hunter2secret" not in f"{info.value.message} {info.value.hint}"
        assert "viano@127.0.0.1:1/viano" in info.value.message
        r = run_viano("status", "--store", url, "--config",
                      _config(tmp_path, url, tmp_path / "b"), "--json")
        assert r.returncode == 1 and "hunter2secret" not in r.stdout + r.stderr
        assert json.loads(r.stdout)["error"]["reason"] == "store_unavailable"
        url2 = "postgresql://viano@127.0.0.1:1/viano?password=hunter2secret&connect_timeout=2"
        r = run_viano("status", "--store", url2, "--config",
                      _config(tmp_path, url2, tmp_path / "b"))
        assert r.returncode == 1 and "hunter2secret" not in r.stdout + r.stderr

    def test_a_bad_url_is_a_refusal(self, tmp_path: Path) -> None:
        for url in ("postgresql://[bad", "postgresql://u:s3c%zzret@host/db",
                    "postgresql://u:s3c@ret@127.0.0.1:1/db"):
            with pytest.raises(NotAStore) as info:
                _open(url, tmp_path / "b")
            assert info.value.__cause__ is None  # libpq's message may quote the password
            assert "s3c" not in info.value.message and "ret" not in info.value.message

    def test_every_password_parameter_is_kept_out_of_the_location(self) -> None:
        from engine import display_location

        shown = display_location("postgresql://u:pw1@h:5/db?password=pw2&sslpassword=pw3"
                                 "&sslmode=require")
        assert shown == "postgresql://u@h:5/db?sslmode=require"

    @pytest.mark.no_store
    @pytest.mark.parametrize("url", [
        "postgresql:///db3?host=/tmp/x&password=S3cr3tPW&bogus=1",
        "postgresql://pwuser@/db3?password=S3cr3tPW&host=/x%zz",
        "postgresql://h/db?sslpassword=S3cr3tPW&port=%zz",
        "postgresql://h/db#password=S3cr3tPW%zz",
        "postgresql://a@b@c/d?password=S3cr3tPW"])
    def test_a_url_libpq_cannot_read_shows_none_of_its_parameters(self, url: str) -> None:
        """Shown from its last '@' on, such a URL kept its query, so a password given as a
        parameter was printed whole (with any other parameter libpq refuses)."""
        from engine import display_location

        shown = display_location(url)
        assert "S3cr3tPW" not in shown and "pwuser" not in shown, shown
        assert shown.startswith("postgresql://") and shown.endswith("?…"), shown
        r = run_viano("status", "--json", "--store", url)
        assert r.returncode == 2, r.stderr
        assert "S3cr3tPW" not in r.stdout + r.stderr, (r.stdout, r.stderr)

    def test_without_the_driver_the_refusal_names_the_extra(self, tmp_path: Path,
                                                            pg_url: str) -> None:
        code = ("import sys; sys.modules['psycopg'] = None\n"
                "from viano_main import run; run()")
        r = subprocess.run([PYTHON, "-c", code, "status", "--json", "--store", pg_url,
                            "--config", str(_config(tmp_path, pg_url, tmp_path / "b"))],
                           capture_output=True, text=True, env=child_env(), timeout=60,
                           check=False)
        assert r.returncode == 1, r.stderr
        err = json.loads(r.stdout)["error"]
        assert err["reason"] == "store_unavailable" and "viano[postgres]" in err["hint"]

    def test_a_role_that_may_only_read_runs_every_read_command(
            self, cli: Cli, pg_url: str, tmp_path: Path, sample: Path) -> None:
        """status, show, cat, log, verify and export on a store the user can read but not
        write (a SELECT-only role); a write is refused by the server, not half-done."""
        cfg = _config(tmp_path, pg_url, tmp_path / "b")
        assert cli("intake", "--config", cfg, "--report", sample / "report.json").code == 0
        _exec(pg_url, "CREATE ROLE reader LOGIN")
        _exec(pg_url, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
        ro_url = pg_url.replace("postgres:@", "reader@", 1)
        ro = _config(tmp_path, ro_url, tmp_path / "b")
        for args in (["status"], ["show", "BUG-20"], ["cat", "BUG-20", "inputs/report.json"],
                     ["log", "BUG-20"], ["verify"],
                     ["export", "BUG-20", tmp_path / "out.zip"], ["gc"]):
            p = run_viano(*args, "--config", ro)
            assert p.returncode == 0, (args, p.stderr)
            # It took no lease, so it has none to give back: every command warned that it
            # "could not release this worker's leases" (the role may not delete them).
            assert "could not release" not in p.stderr, (args, p.stderr)
        r = cli("intake", "--config", ro, "--report", sample / "report.json", "--case-id",
                "NEW-2", "--json")
        assert r.code == 1 and r.json["error"]["reason"] == "store_read_only"  # type: ignore[index]
        assert [c.case_id for c in _open(pg_url, tmp_path / "b", write=False).list_cases()
                ] == ["BUG-20"]


class TestASchemaChangedBehindTheStore:
    @pytest.mark.parametrize(("damage", "named"), [
        ("DROP TABLE viano_leases", "the table viano_leases is missing"),
        ("ALTER TABLE viano_refs DROP COLUMN calls_started",
         "the column viano_refs.calls_started is missing"),
        ("ALTER TABLE viano_refs ALTER COLUMN generation TYPE text",
         "the column viano_refs.generation is text, not bigint")])
    def test_verify_and_gc_name_it(self, cli: Cli, pg_url: str, tmp_path: Path,
                                   sample: Path, damage: str, named: str) -> None:
        """verify said ok with viano_leases dropped (while batch said store_corrupt, "run
        viano verify"), failed on its own reads with a column dropped, and reported every
        case's ref as wrong with a column's type changed, and show and reopen then said
        "there is no generation '7'" (exit 2). Every command names the schema's damage."""
        cfg = _config(tmp_path, pg_url, tmp_path / "b")
        assert cli("intake", "--config", cfg, "--report", sample / "report.json").code == 0
        r = cli("verify", "--json", "--config", cfg)
        assert r.code == 0, r.out  # what the store makes is what it expects
        _exec(pg_url, damage)
        for args in (["verify"], ["gc"], ["status"], ["show", "BUG-20"],
                     ["reopen", "BUG-20", "--reason", "r"]):
            r = cli(*args, "--json", "--config", cfg)
            assert r.code == 1, (args, r.out)
            error = r.json["error"]  # type: ignore[index]
            assert error["reason"] == "store_corrupt" and named in error["message"], (args, error)


class TestADatabaseDroppedUnderAStore:
    def test_reads_and_writes_say_no_store_at_once(
            self, pg_url: str, pg_server: str, tmp_path: Path,
            caplog: pytest.LogCaptureFixture) -> None:
        """The database dropped while a store has it open: each read waited the pool's
        30 s and then said store_unavailable, every reconnection the pool tried was a
        warning line (a batch of 40 cases took 3 minutes and printed 40 of them). The
        store now says no_store as soon as the pool finds the database gone, and the
        pool's own lines are not shown."""
        store = _open(pg_url, tmp_path / "b")
        try:
            store.commit_batch([PublishRequest(new_package_id(), "GONE-1", None, Change(
                files={"inputs/r.txt": BytesSource.of(b"r")}, phase="INTAKE"))])
            name = pg_url.split("?")[0].rsplit("/", 1)[1]
            _exec(pg_server, f'DROP DATABASE "{name}" WITH (FORCE)')
            reasons = []
            for _ in range(5):  # the first may meet a connection the drop closed
                with pytest.raises(VianoError) as info:
                    store.list_cases()
                reasons.append(info.value.reason)
                if info.value.reason == "no_store":
                    break
            assert reasons[-1] == "no_store", reasons
            reasons = []
            for _ in range(5):  # the same for the writer's own connection
                with pytest.raises(VianoError) as info:
                    store.commit_batch([PublishRequest(new_package_id(), "GONE-2", None,
                                                       Change(files={"inputs/r.txt":
                                                                     BytesSource.of(b"r")},
                                                              phase="INTAKE"))])
                reasons.append(info.value.reason)
                if info.value.reason == "no_store":
                    break
            assert reasons[-1] == "no_store", reasons
        finally:
            store.close()
        assert not [r for r in caplog.records if "error connecting" in r.getMessage()]


class TestBlobRoot:
    def test_a_worker_whose_shared_folder_is_not_mounted_is_refused(
            self, pg_url: str, tmp_path: Path) -> None:
        """The blob root is the store's by a token the first writer recorded: a worker on
        a host where the shared folder is not mounted (an empty folder in its place) is
        refused before it writes, and nothing lands in that folder; read-only, the store
        opens (status needs no blobs) and verify names the problem."""
        shared = tmp_path / "shared"
        store = _open(pg_url, shared)
        big = BytesSource.of(os.urandom(300_000))
        store.commit_batch([PublishRequest(new_package_id(), "BIG-1", None, Change(
            files={"inputs/big.bin": big}, phase="INTAKE"))])
        store.close()
        unmounted = tmp_path / "not-mounted"
        unmounted.mkdir()
        with pytest.raises(StorageError) as info:
            _open(pg_url, unmounted)
        assert info.value.reason == "store_unavailable" and "mounted" in info.value.message
        assert list(unmounted.iterdir()) == []
        reader = _open(pg_url, unmounted, write=False)
        try:
            assert [c.case_id for c in reader.list_cases()] == ["BIG-1"]
            assert any("mounted" in p for p in reader.index_problems())
        finally:
            reader.close()
        again = _open(pg_url, shared)  # the real folder still works
        ref = again.case("BIG-1")
        entry = again.manifest(ref.package_id, 1).files["inputs/big.bin"]
        assert again.read_blob(entry.sha256) == big.data
        again.close()

    def test_two_first_writers_with_different_folders_agree_on_one(
            self, pg_url: str, tmp_path: Path) -> None:
        """Two hosts opening a new store at once, each with its own empty folder: one
        folder is recorded; the other host is refused."""
        a = _open(pg_url, tmp_path / "a")
        with pytest.raises(StorageError) as info:
            _open(pg_url, tmp_path / "b")
        assert info.value.reason == "store_unavailable"
        a.close()


class TestValuesTheDatabaseRefuses:
    def test_one_bad_value_never_fails_the_rest_of_its_batch(self, pg_url: str,
                                                             tmp_path: Path) -> None:
        """A status value that gets past every check (validators switched off here, as a
        bug would) and that PostgreSQL cannot hold (NUL in text) fails only its own
        request; the other request of the batch commits."""
        store = _open(pg_url, tmp_path / "b")
        try:
            first = store.commit_batch([create("V-1"), create("V-2")])
            with attrs.validators.disabled():
                bad = CaseStatus(status="READY", phase="INTAKE", attempt_id="a\x00b")
            out = store.commit_batch([
                PublishRequest(first[0].package_id, "V-1", 1, Change(
                    files={"notes/a": BytesSource.of(b"a")}), bad),
                PublishRequest(first[1].package_id, "V-2", 1, Change(
                    files={"notes/b": BytesSource.of(b"b")}))])
            assert isinstance(out[0], ChangeRejected) and out[0].reason == "invalid_change"
            assert isinstance(out[1], Published)
            assert store.case("V-1").generation == 1 and store.case("V-2").generation == 2
        finally:
            store.close()

    def test_a_stricter_server_default_isolation_changes_nothing(
            self, pg_url: str, tmp_path: Path) -> None:
        """A database whose default isolation is SERIALIZABLE: two workers publishing on
        the same parent still get one success and one stale_generation, and the other
        request in the loser's batch commits (the store sets READ COMMITTED itself)."""
        name = urlsplit(pg_url).path.lstrip("/")
        _exec(pg_url, f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = "
                      "'serializable'")
        a, b = _open(pg_url, tmp_path / "b"), _open(pg_url, tmp_path / "b")
        try:
            x, y = a.commit_batch([create("X-1"), create("Y-1")])

            def on_top(ref: Any, note: bytes) -> PublishRequest:
                return PublishRequest(ref.package_id, ref.case_id, 1, Change(
                    files={"notes/n": BytesSource.of(note)}))

            assert isinstance(a.commit_batch([on_top(x, b"a")])[0], Published)
            out = b.commit_batch([on_top(x, b"b"), on_top(y, b"y")])
            assert isinstance(out[0], StaleGeneration) and isinstance(out[1], Published)
            assert [r.case_id for r in b.claim_due(0.0, 10)] == ["X-1", "Y-1"]
        finally:
            a.close()
            b.close()


class TestLeases:
    def test_a_lease_held_by_another_worker_is_refused_at_once(self, pg_url: str,
                                                               tmp_path: Path) -> None:
        a, b = _open(pg_url, tmp_path / "b"), _open(pg_url, tmp_path / "b")
        try:
            with a.lease("L-1"):
                with pytest.raises(CaseLocked), b.lease("L-1"):
                    pass
                with b.lease("L-2"):  # other cases are independent
                    pass
                with pytest.raises(CaseLocked), a.lease("L-1"):  # not re-entrant either
                    pass
            with b.lease("L-1"):  # released
                pass
        finally:
            a.close()
            b.close()

    def test_512_cases_in_flight_need_no_more_connections_than_the_pool(
            self, pg_url: str, tmp_path: Path) -> None:
        """Leases are rows, not sessions: 512 leases held at once, with reads and a commit
        among them, use the pool's connections and the publisher's, not 512."""
        from contextlib import ExitStack

        from engine._store._postgres import POOL_SIZE

        store = _open(pg_url, tmp_path / "b")
        name = urlsplit(pg_url).path.lstrip("/")
        try:
            store.commit_batch([create(f"C-{i:03d}") for i in range(512)])
            with ExitStack() as held:
                for i in range(512):
                    held.enter_context(store.lease(f"C-{i:03d}"))
                assert store.head("C-007")[0].case_id == "C-007"
                assert _exec(pg_url, "SELECT count(*) FROM viano_leases") == [(512,)]
                (n,), = _exec(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                                      "datname = %s AND pid <> pg_backend_pid()", name)
                assert n <= POOL_SIZE + 1, n
        finally:
            store.close()

    def test_an_expired_lease_is_taken_over_and_the_late_worker_is_fenced(
            self, pg_url: str, tmp_path: Path) -> None:
        """A worker that stalls past its lease: another takes the case over; the stalled
        one's commit for that case is refused (lease_lost) and writes nothing, while its
        other requests in the same batch commit."""
        a, b = _open(pg_url, tmp_path / "b"), _open(pg_url, tmp_path / "b")
        try:
            first = a.commit_batch([create("F-1"), create("F-2")])
            assert all(isinstance(o, Published) for o in first)
            with a.lease("F-1"):
                _exec(pg_url, "UPDATE viano_leases SET expires_at = now() - interval '1 s'")
                with b.lease("F-1"):
                    late = [PublishRequest(o.package_id, o.case_id, 1, Change(
                        files={"notes/n.txt": BytesSource.of(b"late")})) for o in first]
                    out = a.commit_batch(late)
                    assert isinstance(out[0], StaleGeneration)
                    assert out[0].reason == "lease_lost"
                    assert isinstance(out[1], Published)  # F-2 is nobody else's
                    assert a.case("F-1").generation == 1 and a.case("F-2").generation == 2
                    a.leases.renew()
                    assert a.leases.lost == 1
                    with pytest.raises(StaleGeneration) as lost:  # no further step
                        a.head("F-1")
                    assert lost.value.reason == "lease_lost"
                    assert b.head("F-1")[0].generation == 1
        finally:
            a.close()
            b.close()

    def test_the_late_worker_stays_fenced_after_the_taker_gives_the_case_back(
            self, pg_url: str, tmp_path: Path) -> None:
        """Once renewal has found the lease taken over, the late worker's commits for that
        case are refused even when no other worker holds it any more: the other one
        took it, worked and gave it back, so the late worker's decision is stale whether or
        not the generation it read is still the head."""
        a, b = _open(pg_url, tmp_path / "b"), _open(pg_url, tmp_path / "b")
        try:
            first = a.commit_batch([create("G-1")])
            with a.lease("G-1"):
                _exec(pg_url, "UPDATE viano_leases SET expires_at = now() - interval '1 s'")
                with b.lease("G-1"):
                    a.leases.renew()
                assert a.leases.is_lost("G-1")
                assert _exec(pg_url, "SELECT count(*) FROM viano_leases") == [(0,)]
                late = PublishRequest(first[0].package_id, "G-1", 1, Change(
                    files={"notes/n.txt": BytesSource.of(b"late")}))
                out = a.commit_batch([late])
                assert isinstance(out[0], StaleGeneration), out
                assert out[0].reason == "lease_lost"
                assert a.case("G-1").generation == 1
                with pytest.raises(StaleGeneration):
                    a.check_lease("G-1")
            with a.lease("G-1"):  # held anew: no longer lost, and it writes
                assert isinstance(a.commit_batch([late])[0], Published)
        finally:
            a.close()
            b.close()

    def test_renewal_pushes_the_expiry_of_every_lease_held(self, pg_url: str,
                                                           tmp_path: Path) -> None:
        a = _open(pg_url, tmp_path / "b", lease_s=60)
        try:
            with a.lease("R-1"), a.lease("R-2"):
                _exec(pg_url, "UPDATE viano_leases SET expires_at = now() + interval '5 s'")
                a.leases.renew()
                left = _exec(pg_url, "SELECT EXTRACT(EPOCH FROM expires_at - now()) "
                                     "FROM viano_leases ORDER BY case_id")
                assert len(left) == 2 and all(float(s) > 50 for (s,) in left)
            assert _exec(pg_url, "SELECT count(*) FROM viano_leases") == [(0,)]
        finally:
            a.close()

    def test_concurrent_claims_are_disjoint_and_skip_live_leases(self, pg_url: str,
                                                                 tmp_path: Path) -> None:
        """Four workers claiming the due index at the same moment get disjoint cases
        (SKIP LOCKED), together every due case once; a case another worker holds live is
        never claimed, an expired one is."""
        seed = _open(pg_url, tmp_path / "b")
        seed.commit_batch([create(f"Q-{i:03d}") for i in range(120)])
        workers = [_open(pg_url, tmp_path / "b") for _ in range(4)]
        got: dict[int, list[str]] = {}
        start = threading.Barrier(4)

        def claim(i: int) -> None:
            start.wait()
            got[i] = [r.case_id for r in workers[i].claim_due(0.0, 40)]

        try:
            with seed.lease("Q-000"):
                threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
                claimed = [c for ids in got.values() for c in ids]
                assert len(claimed) == len(set(claimed)) == 119
                assert "Q-000" not in claimed
                late = _open(pg_url, tmp_path / "b")
                assert late.claim_due(0.0, 40) == []  # every due case is claimed
                _exec(pg_url, "UPDATE viano_leases SET expires_at = now() - interval '1 s' "
                              "WHERE case_id = 'Q-001'")
                assert [r.case_id for r in late.claim_due(0.0, 40)] == ["Q-001"]
                late.close()
            # a claim is taken up by the claimer's own lease without a second owner
            owner = next(i for i, ids in got.items() if "Q-002" in ids)
            with workers[owner].lease("Q-002"), pytest.raises(CaseLocked), \
                    workers[(owner + 1) % 4].lease("Q-002"):
                pass
        finally:
            for w in workers:
                w.close()
            seed.close()
        # closing a worker gives back its claims
        assert _exec(pg_url, "SELECT count(*) FROM viano_leases") == [(0,)]

    def test_a_claim_racing_others_still_takes_its_share(self, pg_url: str,
                                                         tmp_path: Path) -> None:
        """Four workers claiming as fast as they can: a claim whose rows another claim
        took between its snapshot and its row locks claims again, so every claim gets its
        full share while free cases remain (an empty claim reads as "no work" and ends a
        pass: a worker sat idle through a whole benchmark run)."""
        seed = _open(pg_url, tmp_path / "b")
        seed.commit_batch([create(f"S-{i:04d}") for i in range(1600)])
        workers = [_open(pg_url, tmp_path / "b") for _ in range(4)]
        sizes: list[list[int]] = [[] for _ in workers]
        start = threading.Barrier(len(workers))

        def claim(i: int) -> None:
            start.wait()
            for _ in range(15):  # 4 x 15 x 25 = 1500 of the 1600 cases
                sizes[i].append(len(workers[i].claim_due(0.0, 25)))

        try:
            threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert sizes == [[25] * 15] * 4
        finally:
            for w in workers:
                w.close()
            seed.close()

    def test_a_retry_is_claimed_only_when_due(self, pg_url: str, tmp_path: Path) -> None:
        store = _open(pg_url, tmp_path / "b")
        try:
            out = store.commit_batch([create("D-1")])[0]
            status = CaseStatus(status="RETRY_PENDING", phase="INTERPRETING_CASE",
                                reason="providers_unavailable", round=1, max_rounds=3,
                                due_at=1000.0, attempt_id="default")
            store.commit_batch([PublishRequest(out.package_id, "D-1", 1, Change(
                files={"notes/x": BytesSource.of(b"x")}), status)])
            assert store.claim_due(999.0, 10) == [] and store.next_due() == 1000.0
            assert [r.case_id for r in store.claim_due(1000.0, 10)] == ["D-1"]
        finally:
            store.close()


class TestCli:
    def test_every_command_on_a_store_named_in_the_config(
            self, cli: Cli, pg_url: str, pg_databases: Any, tmp_path: Path, sample: Path
            ) -> None:
        """[store] url and blob_root in the config (no --store): intake with a large
        attachment (a blob file under the blob root), then status, show, cat, log, verify,
        gc, export and import."""
        cfg = _config(tmp_path, pg_url, tmp_path / "shared")
        big = tmp_path / "big.log"
        big.write_bytes(os.urandom(300_000))
        assert cli("intake", "--config", cfg, "--report", sample / "report.json",
                   "--attach", f"diagnostics={big}").code == 0
        assert list((tmp_path / "shared" / "blobs").rglob("*"))  # the large blob's file
        assert cli("status", "--config", cfg, "--json").json[0]["case_id"] == "BUG-20"  # type: ignore[index]
        assert cli("show", "--config", cfg, "BUG-20").code == 0
        r = cli("cat", "--config", cfg, "BUG-20", "inputs/report.json")
        assert r.code == 0 and r.out == (sample / "report.json").read_text()
        assert cli("log", "--config", cfg, "BUG-20").code == 0
        assert cli("verify", "--config", cfg, "--json").json["ok"]  # type: ignore[index]
        assert cli("gc", "--config", cfg, "--min-age", "0", "--json").code == 0
        assert cli("verify", "--config", cfg, "--json").json["ok"]  # type: ignore[index]
        out = tmp_path / "e.zip"
        assert cli("export", "--config", cfg, "BUG-20", out).code == 0
        other_url = pg_databases.create()
        other = _config(tmp_path, other_url, tmp_path / "other-blobs")
        assert cli("import", "--config", other, out).code == 0
        imported = _open(other_url, tmp_path / "other-blobs", write=False)
        ref = imported.case("BUG-20")
        entry = imported.manifest(ref.package_id, ref.generation).files[f"inputs/{big.name}"]
        assert imported.read_blob(entry.sha256) == big.read_bytes()
        assert imported.blob_info(entry.sha256).inline is False  # a file under its root
        imported.close()
        assert cli("verify", "--config", other, "--json").json["ok"]  # type: ignore[index]


class TestAcrossBackends:
    def test_sqlite_to_postgresql_and_back_keeps_every_manifest_and_hash(
            self, cli: Cli, pg_url: str, pg_databases: Any, tmp_path: Path) -> None:
        """A completed case exported from SQLite, imported into PostgreSQL, exported again
        and imported into a new SQLite store: the same generations, byte for byte, with
        the same hashes, and every store verifies."""
        src = completed_sample_store(tmp_path / "sqlite-a")
        assert cli("export", "--store", src, "BUG-20", tmp_path / "a.zip").code == 0
        cfg = _config(tmp_path, pg_url, tmp_path / "pg-blobs")
        r = cli("import", "--config", cfg, tmp_path / "a.zip")
        assert r.code == 0, r.err
        assert cli("export", "--config", cfg, "BUG-20", tmp_path / "b.zip"
                   ).code == 0
        assert cli("import", "--store", tmp_path / "sqlite-b", tmp_path / "b.zip").code == 0
        stores = [open_backend(src, write=False),
                  open_backend(pg_url, write=False, blob_root=str(tmp_path / "pg-blobs")),
                  open_backend(tmp_path / "sqlite-b", write=False)]
        try:
            histories, contents = [], []
            for store in stores:
                ref = store.case("BUG-20")
                histories.append([(g.generation, g.manifest_sha256, g.manifest)
                                  for g in store.generations(ref.package_id)])
                contents.append({p: store.read_blob(e.sha256) for p, e in  # hash-checked
                                 store.manifest(ref.package_id, ref.generation).files.items()})
            assert len(histories[0]) >= 5 and len(contents[0]) >= 10
            assert histories[0] == histories[1] == histories[2]
            assert contents[0] == contents[1] == contents[2]
        finally:
            for store in stores:
                store.close()
        for args in (["--store", str(src)], ["--config", str(cfg)],
                     ["--store", str(tmp_path / "sqlite-b")]):
            assert cli("verify", *args, "--json").json["ok"]  # type: ignore[index]


class TestPasses:
    @pytest.mark.parametrize("concurrency", [1, 8])
    async def test_a_pass_claims_no_more_than_it_starts_soon(
            self, pg_url: str, tmp_path: Path, concurrency: int) -> None:
        """Claimed cases are leased to this worker: a pass over a shared store claims at
        most two slots' worth (what it starts soon), never a long read-ahead that would
        keep 4 x concurrency + 64 cases from the other workers for lease_s."""
        from tests.batch_helpers import batch_config
        from tests.phase_helpers import ENV
        from viano_bug_analysis import open_engine

        config = attrs.evolve(batch_config([]), store=StoreConfig(
            url=pg_url, blob_root=str(tmp_path / "b")))
        limits: list[int] = []
        async with open_engine(store=pg_url, config=config, environ=ENV,
                               concurrency=concurrency) as engine:
            real = engine.store.store.claim_due

            def claim_due(now: float, limit: int, **kw: Any) -> Any:
                limits.append(limit)
                return real(now, limit, **kw)

            engine.store.store.claim_due = claim_due  # type: ignore[method-assign]
            assert await engine.run_until_idle() == []
        assert limits == [2 * concurrency]


class TestWhatANewUserTypes:
    @pytest.mark.parametrize("password", ["S3cret/Pw_xyz", "S3cret#Pw_xyz", "S3c@ret@Pw_xyz"])
    def test_a_password_with_reserved_characters_is_refused_unprinted(
            self, tmp_path: Path, password: str) -> None:
        url = f"postgresql://probe:{password}@/vpw?host=/tmp/nowhere"
        r = run_viano("status", "--json", "--store", url, "--config",
                      _config(tmp_path, "x", tmp_path / "b"))
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "not_a_store"
        for part in ("S3c", "Pw_xyz", "ret"):
            assert part not in r.stdout + r.stderr, (password, r.stdout, r.stderr)

    def test_a_password_with_a_question_mark_is_never_printed(self, tmp_path: Path) -> None:
        """libpq reads 'Hunter?2secret' as the password (the URL is valid); no message
        shows it when the server cannot be reached."""
        url = "postgresql://postgres:Hunter?2secret@/db?host=/tmp/nowhere&connect_timeout=2"
        for args in (["status"], ["show", "X-1"], ["daemon"]):
            r = run_viano(*args, "--store", url, "--config",
                          _config(tmp_path, "x", tmp_path / "b", extra=_FIXTURE))
            assert r.returncode != 0 and "2secret" not in r.stdout + r.stderr, (args, r)
            assert "postgres@/db" in r.stdout + r.stderr

    @pytest.mark.parametrize("location", [
        "postgresl://postgres@/v1?host=/tmp", "PostgreSQL+psycopg://u@h/db", "postgresql:/v1",
        "mysql://u@h/db", "host=/tmp dbname=vpw user=probe password=S3cretPw_xyz"])
    def test_a_mistyped_database_address_never_becomes_a_folder_store(
            self, cli: Cli, tmp_path: Path, sample: Path, location: str) -> None:
        r = cli("intake", "--json", "--store", location, "--report", sample / "report.json")
        assert r.code == 2 and r.json["error"]["reason"] == "not_a_store"  # type: ignore[index]
        assert "S3cretPw_xyz" not in r.out + r.err
        assert list(tmp_path.iterdir()) == [], "a folder store was created"

    def test_the_scheme_is_read_in_any_case(self, pg_url: str, tmp_path: Path) -> None:
        store = _open("PostgreSQL" + pg_url[len("postgresql"):], tmp_path / "b")
        store.close()
        assert _tables(pg_url)

    def test_a_mistyped_database_name_is_no_store(self, cli: Cli, pg_server: str,
                                                  tmp_path: Path) -> None:
        url = pg_server.replace("/postgres?", "/no_such_db?")
        r = cli("status", "--summary", "--json", "--config", _config(tmp_path, url,
                                                                      tmp_path / "b"))
        assert r.code == 2 and r.json["error"]["reason"] == "no_store"  # type: ignore[index]

    def test_a_url_without_a_database_is_refused(self, pg_server: str, tmp_path: Path
                                                 ) -> None:
        with pytest.raises(NotAStore) as info:
            _open(pg_server.replace("/postgres?", "/?"), tmp_path / "b")
        assert "names no database" in info.value.message

    def test_an_option_libpq_refuses_is_a_refusal_that_quotes_no_value(
            self, pg_url: str, tmp_path: Path) -> None:
        with pytest.raises(NotAStore) as info:
            _open(pg_url + "&connect_timeout=abc", tmp_path / "b")
        assert "connect_timeout" in info.value.message
        assert "'abc'" not in info.value.message and '"abc"' not in info.value.message

    def test_read_commands_work_with_a_url_asking_for_a_read_write_session(
            self, cli: Cli, pg_url: str, tmp_path: Path, sample: Path) -> None:
        url = pg_url + "&target_session_attrs=read-write"
        cfg = _config(tmp_path, url, tmp_path / "b")
        assert cli("intake", "--config", cfg, "--report", sample / "report.json").code == 0
        for args in (["status"], ["verify"], ["show", "BUG-20"], ["log", "BUG-20"]):
            r = cli(*args, "--config", cfg)
            assert r.code == 0, (args, r.err)

    def test_a_database_of_other_tables_is_not_a_store_for_reading_either(
            self, cli: Cli, pg_url: str, tmp_path: Path) -> None:
        _exec(pg_url, "CREATE TABLE customers (id int)")
        for args in (["status"], ["verify"], ["status", "--summary"]):
            r = cli(*args, "--json", "--config", _config(tmp_path, pg_url, tmp_path / "b"))
            assert r.code == 2 and r.json["error"]["reason"] == "not_a_store", args  # type: ignore[index]

    def test_a_new_store_is_not_made_on_another_stores_blob_folder(
            self, pg_url: str, pg_databases: Any, tmp_path: Path) -> None:
        _open(pg_url, tmp_path / "b").close()
        other = pg_databases.create()
        with pytest.raises(StorageError) as info:
            _open(other, tmp_path / "b")
        assert info.value.reason == "store_corrupt"
        assert _tables(other) == [], "the schema was created before the refusal"

    def test_an_unmounted_blob_folder_tells_one_story(self, cli: Cli, pg_url: str,
                                                      tmp_path: Path, sample: Path) -> None:
        """Reading a file blob, verify and gc all say: mount the shared folder."""
        big = tmp_path / "big.log"
        big.write_bytes(os.urandom(300_000))
        good = _config(tmp_path, pg_url, tmp_path / "shared")
        assert cli("intake", "--config", good, "--report", sample / "report.json",
                   "--attach", f"diagnostics={big}").code == 0
        (tmp_path / "empty").mkdir()
        bad = _config(tmp_path, pg_url, tmp_path / "empty")
        r = cli("cat", "--json", "--config", bad, "BUG-20", f"inputs/{big.name}")
        assert r.json["error"]["reason"] == "store_unavailable"  # type: ignore[index]
        assert "mounted" in r.json["error"]["message"]  # type: ignore[index]
        for cmd in ("verify", "gc"):
            r = cli(cmd, "--json", "--config", bad)
            assert r.code != 0
            assert "blob folder" in r.json["error"]["hint"], cmd  # type: ignore[index]
            assert "store.sqlite3" not in r.json["error"]["hint"]  # type: ignore[index]

    def test_an_export_into_the_blob_folder_is_refused(self, cli: Cli, pg_url: str,
                                                       tmp_path: Path, sample: Path) -> None:
        cfg = _config(tmp_path, pg_url, tmp_path / "shared")
        assert cli("intake", "--config", cfg, "--report", sample / "report.json").code == 0
        r = cli("export", "--json", "--config", cfg, "BUG-20", tmp_path / "shared" / "x.zip")
        assert r.json["error"]["reason"] == "destination_in_store"  # type: ignore[index]

    @pytest.mark.no_store
    @pytest.mark.parametrize("lease_s", [0.01, 0.5, 86401, 1e9])
    def test_a_lease_out_of_bounds_is_refused(self, tmp_path: Path, lease_s: float) -> None:
        from engine import Config

        path = tmp_path / "c.toml"
        path.write_text(f"[store]\nlease_s = {lease_s}\n")
        with pytest.raises(ConfigError):
            Config.load(path)


class TestSecondReview:
    def test_a_worker_that_stalled_past_its_lease_takes_no_further_step(
            self, pg_url: str, tmp_path: Path) -> None:
        """A stalled worker whose renewals were late: before its next step the lease is
        asserted again (not trusted), and the case another worker took is refused to it,
        even though no renewal has noticed the loss yet."""
        a, b = _open(pg_url, tmp_path / "b", lease_s=2), _open(pg_url, tmp_path / "b")
        try:
            a.commit_batch([create("ST-1")])
            with a.lease("ST-1"):
                assert a.head("ST-1")[0].case_id == "ST-1"  # fresh: no round trip
                _exec(pg_url, "UPDATE viano_leases SET expires_at = now() - interval '1 s'")
                with b.lease("ST-1"):
                    a.leases._confirmed["ST-1"] -= 10  # as if it had stalled for 10 s
                    assert not a.leases.is_lost("ST-1")  # no renewal has run
                    with pytest.raises(StaleGeneration) as info:
                        a.head("ST-1")
                    assert info.value.reason == "lease_lost"
        finally:
            a.close()
            b.close()

    def test_the_blob_folder_is_not_adopted_when_blob_files_exist_elsewhere(
            self, pg_url: str, tmp_path: Path) -> None:
        """A store with blob files but no recorded blob-folder token (written before the
        token, or the row lost): an empty folder is refused, never adopted."""
        store = _open(pg_url, tmp_path / "real")
        store.commit_batch([PublishRequest(new_package_id(), "F-1", None, Change(
            files={"inputs/big.bin": BytesSource.of(os.urandom(300_000))}, phase="INTAKE"))])
        store.close()
        _exec(pg_url, "DELETE FROM viano_meta WHERE key = 'blob_root_id'")
        (tmp_path / "empty").mkdir()
        with pytest.raises(StorageError) as info:
            _open(pg_url, tmp_path / "empty")
        assert info.value.reason == "store_unavailable"
        assert list((tmp_path / "empty").iterdir()) == []
        _open(pg_url, tmp_path / "real").close()  # the real folder is taken up again
