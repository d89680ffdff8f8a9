"""The bundled sample case (BUG-20: a report, a diagnostics archive, a source archive)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled_sample() -> Path:
    """The folder holding ``report.json``, ``wowdiag.zip`` and ``wowsrc.zip``."""
    return Path(str(resources.files("viano_bug_analysis") / "sample"))
