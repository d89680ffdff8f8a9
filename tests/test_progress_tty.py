"""Progress bars on a real terminal (a pseudo-terminal), plain lines elsewhere: bulk intake
and ``viano batch`` show counts and an ETA while they work."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path

from tests.conftest import VIANO, child_env, run_viano
from viano_bug_analysis import bundled_sample

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(*args: str | os.PathLike[str], env: dict[str, str]) -> tuple[int, str,
                                                                                 str]:
    """Run viano with stderr on a pseudo-terminal; (exit code, stdout, terminal text)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*VIANO,
                             *[str(a) for a in args]], stdout=subprocess.PIPE,
                            stderr=follower, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output on the terminal: {seen!r}")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read().decode()
    code = proc.wait(timeout=120)
    os.close(leader)
    return code, out, _ANSI.sub("", seen.decode("utf-8", "replace"))


def _env() -> dict[str, str]:
    return child_env(COLUMNS="160", TERM="xterm-256color")


def test_bulk_intake_shows_a_progress_bar_with_counts(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(30):
        (folder / f"{i:02d}.json").write_text(json.dumps(
            {"title": f"t{i}", "body": "b", "case_id": f"P-{i}"}))
    code, out, terminal = _on_a_terminal("intake", "--store", tmp_path / "s", "--batch",
                                         folder, env=_env())
    assert code == 0, terminal
    assert "reports" in terminal and "taken in" in terminal and "/30" in terminal, terminal
    assert "30 reports: taken in 30" in out
    # Not a terminal: no bar, no control sequences.
    plain = run_viano("intake", "--store", tmp_path / "t", "--batch", folder)
    assert "\x1b" not in plain.stderr and "/30" not in plain.stderr


def test_batch_shows_a_progress_bar_with_counts_by_status(tmp_path: Path) -> None:
    sample = bundled_sample()
    config = tmp_path / "c.toml"
    config.write_text(f'[interpretation]\nauto_confirm = true\n\n[[providers]]\n'
                      f'name = "f"\nkind = "fixture"\npath = "{sample / "fixtures"}"\n')
    store = tmp_path / "s"
    assert run_viano("intake", "--store", store, "--report", sample / "report.json",
                     "--attach", f"diagnostics={sample / 'wowdiag.zip'}",
                     "--attach", f"source={sample / 'wowsrc.zip'}").returncode == 0
    code, out, terminal = _on_a_terminal("batch", "--store", store, "--config", config,
                                         "--all", env=_env())
    assert code == 0, terminal
    assert "cases" in terminal and "COMPLETED 1" in terminal, terminal
    assert "1/1" in terminal, terminal
    assert "COMPLETED" in out
