from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import disarm_crash_points
from viano_bug_analysis.cli import main
from viano_bug_analysis.cli._commands import sample_dir

REPO = Path(__file__).resolve().parent.parent


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
    return sample_dir()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def json(self) -> object:
        return json.loads(self.out)


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
    """Every file under ``root`` with its bytes (lock files excluded: they carry no data)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "locks" not in p.parts}


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


PYTHON = sys.executable
