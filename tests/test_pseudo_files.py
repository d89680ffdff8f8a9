"""A pseudo-file that ``stat`` calls regular but that waits for data when read (``/proc/kmsg``
is one) is refused as unreadable_input wherever Viano reads a file the user names: it hung
intake, import and ``--config`` for ever, holding the case's lock at commit.

Such a file is stood in for by a FIFO whose writer stays open and never writes, with the
store's ``stat`` made to call it regular: read, it waits, as ``/proc/kmsg`` does. Without the
fix a read would wait until the watchdog closes the writer, then see an end of file (an
empty file, stored with exit 0): the tests fail instead of hanging.
"""

from __future__ import annotations

import os
import stat
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import open_regular
from engine._store import _sources
from engine._store._sources import WouldWait
from tests.conftest import Cli

WATCHDOG_S = 20.0  # only reached if a read waits, which is the defect


@pytest.fixture
def waiting_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "kmsg.log"
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # held open: a read waits, no EOF
    closed = threading.Lock()

    def close_writer() -> None:
        if closed.acquire(blocking=False):
            os.close(writer)

    watchdog = threading.Timer(WATCHDOG_S, close_writer)
    watchdog.daemon = True
    watchdog.start()
    fake = types.SimpleNamespace(**{k: getattr(stat, k) for k in dir(stat)
                                    if not k.startswith("__")})
    fake.S_ISREG = lambda mode: stat.S_ISREG(mode) or stat.S_ISFIFO(mode)
    monkeypatch.setattr(_sources, "stat", fake)
    try:
        yield path
    finally:
        watchdog.cancel()
        close_writer()


@pytest.mark.parametrize("how", ["read(n)", "read()", "readinto", "iterate"])
def test_every_read_of_a_waiting_file_raises(waiting_file: Path, how: str) -> None:
    with open_regular(waiting_file) as f, pytest.raises(WouldWait) as info:
        if how == "read(n)":
            f.read(1 << 20)
        elif how == "read()":
            f.read()
        elif how == "readinto":
            f.readinto(bytearray(4096))
        else:
            next(iter(f))
    assert info.value.errno == 11 and info.value.filename == str(waiting_file)


def test_a_regular_file_reads_seeks_and_ends_as_before(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    path.write_bytes(data)
    with open_regular(path) as f:
        assert f.read(10) == data[:10]
        f.seek(-7, os.SEEK_END)
        assert f.tell() == len(data) - 7 and f.read() == data[-7:]
        assert f.read() == b"" and f.read(5) == b""  # the end is an empty read, not an error
        f.seek(0)
        assert f.read() == data
        assert f.name == str(path)


def _write_report(tmp_path: Path) -> Path:
    report = tmp_path / "r.md"
    report.write_text("# A title\n\nIt fails.\n")
    return report


def _refused(cli: Cli, *args: str | os.PathLike[str], reason: str) -> None:
    r = cli("--json", *args)
    assert r.code == 2, (r.code, r.out, r.err)
    error = r.json["error"]  # type: ignore[index]
    assert error["reason"] == reason, error
    assert "would wait" in error["message"], error


def test_intake_refuses_a_waiting_attachment_and_writes_nothing(
        cli: Cli, tmp_path: Path, waiting_file: Path) -> None:
    store = tmp_path / "s"
    _refused(cli, "--store", store, "intake", "--report", _write_report(tmp_path),
             "--attach", waiting_file, reason="unreadable_input")
    assert not store.exists()


def test_intake_refuses_a_waiting_report(cli: Cli, tmp_path: Path, waiting_file: Path) -> None:
    store = tmp_path / "s"
    _refused(cli, "--store", store, "intake", "--report", waiting_file,
             reason="unreadable_input")
    assert not store.exists()


def test_import_refuses_a_waiting_export(cli: Cli, tmp_path: Path, waiting_file: Path) -> None:
    store = tmp_path / "s"
    _refused(cli, "--store", store, "import", waiting_file, reason="unreadable_input")
    assert not store.exists()


def test_a_waiting_config_is_config_invalid(cli: Cli, tmp_path: Path,
                                            waiting_file: Path) -> None:
    _refused(cli, "--config", waiting_file, "--store", tmp_path / "s", "status",
             reason="config_invalid")


def test_bulk_intake_refuses_a_waiting_folder_entry(waiting_file: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder's entry is read through its own descriptor (never through a link): that
    read waited too (an empty kernel buffer: a TypeError; with a message in it, the
    message taken in as a case). It is unreadable_input."""
    from engine import InputRejected, IntakeLimits
    from viano_bug_analysis.cli import _intake_commands

    monkeypatch.setattr(_intake_commands, "stat", _sources.stat)  # regular to stat
    with pytest.raises(InputRejected) as info:
        _intake_commands._read_entry(_intake_commands._Item("kmsg.log", waiting_file),
                                     IntakeLimits())
    assert info.value.reason == "unreadable_input" and "would wait" in info.value.message
