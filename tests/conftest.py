from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import disarm_crash_points
from tests.pgmap.mapping import install_mapping, pg_database, pg_url_for
from viano_bug_analysis import bundled_sample
from viano_bug_analysis.cli import main

REPO = Path(__file__).resolve().parent.parent

# A shell that starts the suite as a background job (``make test &``, ``nohup … &``) hands
# it SIGINT ignored, and Python then leaves SIGINT ignored, in this process and in every
# child it starts. The tests of Ctrl-C handling assume what a terminal gives: SIGINT with
# Python's handler here, and its default in children (exec resets a caught signal to its
# default and keeps an ignored one ignored). Three of them failed under a background CI
# shell and passed at a terminal. Tests of a command started with SIGINT ignored set that
# up themselves (``preexec_fn``).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_armed_crash_points() -> Iterator[None]:
    disarm_crash_points()
    yield
    disarm_crash_points()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's local config or store."""
    monkeypatch.delenv("VIANO_STORE", raising=False)
    monkeypatch.delenv("VIANO_CONFIG", raising=False)
    monkeypatch.delenv("VIANO_CRASH_AT", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def sample() -> Path:
    return bundled_sample()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def json(self) -> object:
        return strict_json(self.out)


def strict_json(text: str) -> object:
    """``json.loads``, refusing what strict parsers refuse and Python accepts: a lone
    surrogate escape (RFC 8259 section 8.2), which no UTF-8 text can hold."""
    value = json.loads(text)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            item.encode("utf-8")  # UnicodeEncodeError on a lone surrogate
    return value


Cli = Callable[..., CliResult]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``viano`` in-process; returns exit code, stdout and stderr."""

    def run(*args: str | os.PathLike[str]) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def snapshot(root: Path) -> dict[str, bytes]:
    """What a store folder holds: every file with its bytes, except that the SQLite files
    (with their WALs) are represented by their rows, so a checkpoint that moves committed pages
    from the WAL into the database does not count as a change. Lock files are left out:
    they carry no data."""
    if not root.exists():
        return {}
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or "locks" in p.parts:
            continue
        database = next((d for d in ("store.sqlite3", "blob-index.sqlite3")
                         if p.name.startswith(d)), None)
        if database is not None:  # the store's file and the blob index's side file
            if p.name == database:
                out[f"{database} (rows)"] = _rows(p)
            continue
        out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _rows(db: Path) -> bytes:
    if db.stat().st_size == 0:
        return b"(empty file)"
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            dump = "\n".join(conn.iterdump())
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return db.read_bytes()
    return dump.encode("utf-8", "surrogateescape")


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def fixture_config(tmp: Path, sample: Path, *, path: Path | None = None) -> Path:
    """A configuration file in ``tmp`` whose one provider is the fixture provider over
    the sample's answers (or ``path``)."""
    cfg = tmp / "c.toml"
    cfg.write_text(f'[[providers]]\nname = "fx"\nkind = "fixture"\n'
                   f'path = "{path or sample / "fixtures"}"\n')
    return cfg


PYTHON = sys.executable
VIANO = [PYTHON, "-c", "from viano_main import run; run()"]  # the console script's code path


def unprivileged() -> list[str] | None:
    """A command prefix that runs a child without the power to ignore file permissions:
    as root, ``setpriv`` drops every capability (so mode bits apply again); as another user,
    nothing is needed. ``None`` if neither is possible here."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all", "--"]


def run_viano(*args: str | os.PathLike[str], prefix: list[str] | None = None,
              env: dict[str, str] | None = None, timeout: float = 120,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``viano`` as a real process (the installed entry point's code path)."""
    return subprocess.run([*(prefix or []), *VIANO, *[str(a) for a in args]],
                          capture_output=True, text=True, env=env or child_env(),
                          timeout=timeout, check=False, cwd=cwd)


def wait_until_paused(marker: Path, child: subprocess.Popen[Any]) -> None:
    """Block until a child started with ``VIANO_PAUSE_AT`` and ``VIANO_PAUSE_FILE=marker``
    reaches its pause point (it creates the marker). Not a timed assertion: the child's
    own progress ends the wait, or its exit does."""
    import select

    while not marker.exists():
        if child.poll() is not None:
            raise AssertionError(f"the child ended early: {child.communicate()}")
        select.select([], [], [], 0.01)


def rest_of(process: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """The rest of a child's stdout and stderr once it has exited, for a child whose pipes
    the test has already read from. ``communicate()`` reads the pipes' file descriptors
    itself, so it loses whatever the file objects had buffered past the lines read. The
    pipes are closed afterwards, as ``communicate()`` closes them."""
    import threading

    got: dict[str, str] = {}

    def read(name: str) -> None:
        stream = getattr(process, name)
        if stream is not None:
            with stream:
                got[name] = stream.read()

    readers = [threading.Thread(target=read, args=(name,)) for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    process.wait(timeout=timeout)
    for reader in readers:
        reader.join(timeout=timeout)
    return got.get("stdout", ""), got.get("stderr", "")


class PausedChild:
    """A child process paused at a named pause point (see :func:`paused_child`)."""

    def __init__(self, process: subprocess.Popen[str], marker: Path):
        self.process, self.marker = process, marker

    def resume(self, timeout: float = 60) -> tuple[str, str]:
        """Let it go on from the pause point; its stdout and stderr once it has exited."""
        self.marker.unlink()
        return self.process.communicate(timeout=timeout)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode


@contextlib.contextmanager
def paused_child(argv: list[str], point: str, marker: Path,
                 env: Callable[..., dict[str, str]] | None = None) -> Iterator[PausedChild]:
    """Start ``argv`` with ``VIANO_PAUSE_AT=point``; yield once it waits there. Killed on
    the way out if it is still running (a failed assertion leaves no process behind)."""
    make_env = env or child_env
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=make_env(VIANO_PAUSE_AT=point,
                                                       VIANO_PAUSE_FILE=str(marker)))
    try:
        wait_until_paused(marker, process)
        yield PausedChild(process, marker)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def make_readonly(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode & ~0o222)


def make_writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)


# -- the PostgreSQL backend -----------------------------------------------------------------
# A real PostgreSQL (the pgserver wheel: server binaries from the package index) started once
# per session in a temporary folder. Tests that take the ``backend`` fixture run against
# both backends: under "postgresql", every store location that is a folder path is opened
# as a PostgreSQL store in a database of its own, with that folder as its blob root, so the
# same test code (the public face: open_store, open_backend, the in-process CLI) runs on
# both. Tests whose subject is SQLite's own files carry ``@pytest.mark.sqlite_only``.


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The URL of the session's PostgreSQL server (its admin database)."""
    import tempfile

    made_xdg = None
    if not os.environ.get("XDG_RUNTIME_DIR"):  # platformdirs (pgserver) warns without one
        made_xdg = os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="vxdg-")
    pgserver = pytest.importorskip("pgserver")
    folder = tempfile.mkdtemp(prefix="vpg-", dir="/tmp")  # short: a Unix socket path
    server = pgserver.get_server(folder, cleanup_mode="stop")
    # The server runs as its own user in a 0700 folder that holds its socket; a child
    # without the power to ignore permissions (``unprivileged``) must still reach it.
    os.chown(folder, -1, os.getgid())
    os.chmod(folder, 0o750)
    try:
        yield str(server.get_uri())
    finally:
        _discard_server(server, folder)
        if made_xdg is not None:
            shutil.rmtree(made_xdg, ignore_errors=True)


def _discard_server(server: Any, folder: str) -> None:
    """Throw the session's server away. Its data is never read again, so it stops without
    a shutdown checkpoint (``immediate``), and its folder (a few GB: every test database)
    is deleted by a process the session does not wait for. pgserver's own cleanup (a fast
    shutdown, then a synchronous delete) took 25-45 s at the end of every run."""
    with contextlib.suppress(Exception):  # pg_ctl is pgserver's own, not public: if it
        from pgserver._commands import pg_ctl  # moves, cleanup() below stops the server

        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata,
               user=server.system_user)
        server.get_postmaster_info().process.wait(10)
    server.cleanup()  # "stop" mode: it finds the server stopped and deletes nothing
    # In "stop" mode pgserver keeps its exit hook, which would make the XDG folder again.
    atexit.unregister(getattr(server, "_cleanup", lambda: None))
    # sh starts rm in a session of its own (a kill of pytest's process group does not stop
    # it half way) and exits: nothing of this session waits for the delete.
    subprocess.run(["sh", "-c", 'setsid rm -rf -- "$1" </dev/null >/dev/null 2>&1 &', "sh",
                    folder], check=False)


class PgDatabases:
    """Fresh databases on the session's server: one per store location (its name derived
    from the folder's path, so a child process maps the same folder to the same database;
    see tests/pgmap/sitecustomize.py), or a new one per call of :meth:`create`."""

    def __init__(self, admin_url: str):
        self.admin_url = admin_url

    def create(self) -> str:
        return pg_database(self.admin_url, f"t_{os.urandom(8).hex()}")

    def url_for(self, location: str) -> str:
        return pg_url_for(self.admin_url, location)


@pytest.fixture
def pg_databases(pg_server: str) -> PgDatabases:
    return PgDatabases(pg_server)


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> str:
    """A fresh, empty PostgreSQL database."""
    return pg_databases.create()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only = any(metafunc.definition.get_closest_marker(m) is not None
                   for m in ("sqlite_only", "no_store"))
        metafunc.parametrize("backend", ["sqlite"] if only else ["sqlite", "postgresql"],
                             indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which backend this run of the test uses (see above)."""
    name: str = getattr(request, "param", "sqlite")  # unittest-style classes: SQLite
    if name == "postgresql":
        databases: PgDatabases = request.getfixturevalue("pg_databases")
        install_pg_mapping(monkeypatch, databases)
    return name


def install_pg_mapping(monkeypatch: pytest.MonkeyPatch, databases: PgDatabases) -> None:
    """In this process and in every child started with :func:`child_env`."""
    install_mapping(databases.admin_url, monkeypatch.setattr)
    monkeypatch.setenv("VIANO_TEST_PG_ADMIN", databases.admin_url)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests" / "pgmap") + os.pathsep +
                       os.environ.get("PYTHONPATH", ""))
