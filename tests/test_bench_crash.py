"""bench/crash.py's invariant checker finds what it is there to find (a benchmark whose
checks cannot fail would report 0 violations whatever happened)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.crash import check
from tests.phase_helpers import completed_sample_store
from viano_bug_analysis import bundled_sample


@pytest.fixture(scope="module")
def completed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return completed_sample_store(tmp_path_factory.mktemp("crash") / "store")


def _originals() -> dict[str, bytes]:
    sample = bundled_sample()
    return {f"inputs/{n}": (sample / n).read_bytes()
            for n in ("report.json", "wowdiag.zip", "wowsrc.zip")}


def test_a_clean_store_has_no_violations(completed: Path) -> None:
    calls = [{"case_id": "BUG-20", "prompt_id": "interpretation_v1", "t": 0.0},
             {"case_id": "BUG-20", "prompt_id": "interpretation_v1", "t": 1.0}]
    problems, repeated = check(completed, _originals(), calls)
    assert problems == [] and repeated == 1


def test_a_call_after_the_checkpointed_answer_is_a_violation(completed: Path) -> None:
    late = [{"case_id": "BUG-20", "prompt_id": "hypotheses_v1", "t": time.time() + 60}]
    problems, _ = check(completed, _originals(), late)
    assert problems == ["BUG-20: 1 hypotheses call(s) after its checkpointed answer"]


def test_an_original_that_differs_is_a_violation(completed: Path) -> None:
    originals = _originals() | {"inputs/report.json": b"{}"}
    problems, _ = check(completed, originals, [])
    assert problems == ["inputs/report.json: the stored original differs from the file "
                        "taken in"]
