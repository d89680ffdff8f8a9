"""The bundled sample is reproducible from its sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("backend")


def test_rebuild_matches_committed_bytes(tmp_path: Path, sample: Path) -> None:
    """tests/sample_src/make_sample.py rebuilds exactly the committed sample files."""
    spec = importlib.util.spec_from_file_location(
        "make_sample", REPO / "tests" / "sample_src" / "make_sample.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in ("report.json", "wowdiag.zip", "wowsrc.zip"):
        assert (tmp_path / name).read_bytes() == (sample / name).read_bytes(), name
