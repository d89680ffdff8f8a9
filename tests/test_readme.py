"""The README's embedding example runs exactly as written."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import PYTHON, REPO, child_env, run_viano
from tests.phase_helpers import FIXTURES, SAMPLE


def _snippet(name: str) -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(rf"<!-- snippet: {re.escape(name)}[^>]*-->\s*```python\n(.*?)```",
                      text, re.S)
    assert found, f"README has no snippet {name!r}"
    return found.group(1)


def test_the_hypothesis_builder_snippet(tmp_path: Path) -> None:
    """A working folder as a user would have it — config/analysis.local.toml and a store
    with BUG-20 interpreted and confirmed — and the snippet, unchanged, run in it."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "analysis.local.toml").write_text(
        f'[[providers]]\nname = "fixture"\nkind = "fixture"\npath = "{FIXTURES}"\n')
    for args in (["intake", "--report", SAMPLE / "report.json", "--attach",
                  f"diagnostics={SAMPLE / 'wowdiag.zip'}", "--attach",
                  f"source={SAMPLE / 'wowsrc.zip'}"],
                 ["interpret", "BUG-20"], ["confirm", "BUG-20", "--by", "qa"]):
        r = run_viano(*args, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    script = tmp_path / "example.py"
    script.write_text(_snippet("hypothesis-builder"))
    proc = subprocess.run([PYTHON, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("COMPLETED completed 3 hypotheses accepted"), proc.stdout
    r = run_viano("cat", "BUG-20", "analysis/hypotheses/0001/registry.json", cwd=tmp_path)
    assert '"created_count": 3' in r.stdout
    assert os.path.exists(tmp_path / "viano-store" / "store.sqlite3")
