"""The case lease is non-blocking: a busy lease is reported, never waited on. The SQLite
backend implements it with flock, which the OS releases when a holder dies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine import CaseLocked
from tests.conftest import PYTHON, Cli, child_env
from tests.store_helpers import open_rw, sql

pytestmark = pytest.mark.usefixtures("backend")

HOLDER = """
import sys
from engine import open_backend
store = open_backend(sys.argv[1], write=True)
with store.lease(sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes our stdin or kills us
"""


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([PYTHON, "-c", HOLDER, str(tmp_path / "store"), "BUG-20"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout):
        assert stream is not None
        stream.close()


class TestLease:
    def test_same_process_second_holder_is_refused(self, tmp_path: Path) -> None:
        """A second lease on the same case fails at once with reason 'locked', even in the
        same process; it is free again after release."""
        store = open_rw(tmp_path / "s")
        with store.lease("A-1"), pytest.raises(CaseLocked) as info, store.lease("A-1"):
            pass
        assert info.value.reason == "locked" and info.value.exit_code == 11
        with store.lease("A-1"), store.lease("A-2"):  # released; other cases independent
            pass
        store.close()

    @pytest.mark.sqlite_only  # the lock files of the SQLite backend
    def test_a_removed_locks_folder_is_made_again(self, tmp_path: Path) -> None:
        """The folder is made when a lock file cannot be opened for its lack (not before
        every lease): removed behind the store's back, it comes back, and the lease still
        excludes a second holder."""
        import shutil

        store = open_rw(tmp_path / "s")
        with store.lease("A-1"):
            pass
        shutil.rmtree(tmp_path / "s" / "locks")
        with store.lease("A-1"), pytest.raises(CaseLocked), store.lease("A-1"):
            pass
        assert (tmp_path / "s" / "locks" / "A-1.lock").is_file()
        store.close()

    def test_other_process_holds_it(self, tmp_path: Path, holder: subprocess.Popen[str]) -> None:
        """A lease held by another process is refused without waiting (the call returns
        while the holder still holds it: it would block forever otherwise)."""
        store = open_rw(tmp_path / "store")
        with pytest.raises(CaseLocked), store.lease("BUG-20"):
            pass
        assert holder.poll() is None
        store.close()

    def test_released_when_the_holder_dies(self, tmp_path: Path, backend: str,
                                           holder: subprocess.Popen[str]) -> None:
        """The lease of a killed process is free again: at once under SQLite (the OS
        releases the flock); under PostgreSQL once its expiry has passed (the row's expiry
        is moved into the past here, as lease_s of server time would)."""
        holder.kill()
        holder.wait(timeout=10)
        if backend == "postgresql":
            sql(tmp_path / "store", "UPDATE viano_leases SET expires_at = now() - "
                                    "interval '1 second'")
        store = open_rw(tmp_path / "store")
        with store.lease("BUG-20"):
            pass
        store.close()

    def test_lease_names_are_validated(self, tmp_path: Path) -> None:
        """A case id that is not valid never becomes a lock file path."""
        from engine import InvalidCaseId

        store = open_rw(tmp_path / "s")
        for bad in ("../x", "a/b", "", ".hidden"):
            with pytest.raises(InvalidCaseId), store.lease(bad):
                pass
        assert not (tmp_path / "x.lock").exists()
        store.close()

    def test_intake_of_a_locked_case_is_deferred(self, tmp_path: Path, cli: Cli, sample: Path,
                                                 holder: subprocess.Popen[str]) -> None:
        """The CLI reports DEFERRED (exit 11, reason locked) and writes no package."""
        r = cli("intake", "--json", "--store", tmp_path / "store", "--report",
                sample / "report.json")
        assert r.code == 11
        assert r.json["error"]["reason"] == "locked"  # type: ignore[index]
        assert cli("status", "--json", "--store", tmp_path / "store").json == []
