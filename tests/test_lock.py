"""The cross-process case lock is non-blocking: a busy lock is reported, never waited on."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from engine import CaseLocked, case_lock
from tests.conftest import PYTHON, Cli, child_env

HOLDER = """
import sys, time
from pathlib import Path
from engine import case_lock
with case_lock(Path(sys.argv[1]), sys.argv[2]):
    print("locked", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([PYTHON, "-c", HOLDER, str(tmp_path / "store"), "BUG-20"],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


class TestCaseLock:
    def test_same_process_second_holder_is_refused(self, tmp_path: Path) -> None:
        """A second acquisition fails at once with reason 'locked'."""
        with case_lock(tmp_path, "A-1"), pytest.raises(CaseLocked) as info, \
                case_lock(tmp_path, "A-1"):
            pass
        assert info.value.reason == "locked" and info.value.exit_code == 11
        with case_lock(tmp_path, "A-1"):  # released again
            pass

    def test_other_process_holds_it(self, tmp_path: Path, holder: subprocess.Popen[str]) -> None:
        """A lock held by another process is reported immediately, without waiting."""
        t0 = time.monotonic()
        with pytest.raises(CaseLocked), case_lock(tmp_path / "store", "BUG-20"):
            pass
        assert time.monotonic() - t0 < 1.0

    def test_released_when_the_holder_dies(self, tmp_path: Path,
                                           holder: subprocess.Popen[str]) -> None:
        """The OS releases the lock of a killed process."""
        holder.kill()
        holder.wait(timeout=10)
        with case_lock(tmp_path / "store", "BUG-20"):
            pass

    def test_intake_of_a_locked_case_is_deferred(self, tmp_path: Path, cli: Cli, sample: Path,
                                                 holder: subprocess.Popen[str]) -> None:
        """The CLI reports DEFERRED (exit 11, reason locked) and writes no package."""
        r = cli("intake", "--json", "--store", tmp_path / "store", "--report",
                sample / "report.json")
        assert r.code == 11
        assert r.json["error"]["reason"] == "locked"  # type: ignore[index]
        assert cli("status", "--json", "--store", tmp_path / "store").json == []
