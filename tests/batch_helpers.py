"""What the many-case tests share: answers that fit any case, a configuration, cases taken
in by the dozen, and the verify check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from engine import (
    PHASE_CHECKS,
    Config,
    HypothesisPolicy,
    IntakeLimits,
    InterpretationPolicy,
    RetryPolicy,
    prepare_intake,
    verify_store,
)
from tests.loopback import LoopbackServer
from tests.phase_helpers import FAST
from tests.store_helpers import open_ro

# Answers that fit any case: they cite only S1 (every case's report) and I1-I6.
GENERIC_INTERPRETATION = json.dumps({
    "summary": "The reported operation fails.",
    "statements": [
        {"kind": "reported_behavior", "text": "The operation fails as reported.",
         "source_ids": ["S1"]},
        {"kind": "expected_behavior", "text": "It should succeed.", "source_ids": ["S1"]},
        {"kind": "failure_stage", "text": "It fails when the operation runs.",
         "source_ids": ["S1"]},
        {"kind": "first_known_divergence", "text": "The result first differs at the call.",
         "source_ids": ["S1"]},
        {"kind": "technical_fact", "text": "The report names the version.",
         "source_ids": ["S1"]},
        {"kind": "assumption", "text": "It may be a regression.", "source_ids": []}],
    "missing_observations": []})


def _hypothesis(i: int, cites: list[str]) -> dict[str, Any]:
    return {"title": f"Candidate cause number {i}", "mechanism": f"Mechanism {i} happens.",
            "rationale": "The report says so.", "distinction": f"Differs by {i}.",
            "source_ids": ["S1"], "interpretation_ids": cites,
            "expected_evidence": ["A trace shows it."],
            "falsifying_evidence": ["A trace shows otherwise."], "open_questions": []}


GENERIC_HYPOTHESES = json.dumps({"hypotheses": [_hypothesis(1, ["I4", "I1"]),
                                                _hypothesis(2, ["I3"]),
                                                _hypothesis(3, ["I5", "I6"])]})


def write_generic_answers(folder: Path) -> Path:
    """``folder`` (made if needed) holding the generic answers as the loopback server's
    ``--answers`` reads them: ``<prompt_id>.json`` answers that prompt for any case."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "interpretation_v1.json").write_text(GENERIC_INTERPRETATION)
    (folder / "hypotheses_v1.json").write_text(GENERIC_HYPOTHESES)
    return folder


def loopback_toml(port: int, *, path_prefix: str = "", model: str = "bench") -> str:
    """A config file's text for the loopback provider in its own process: auto-confirm,
    no cooldown, one provider at ``http://127.0.0.1:{port}{path_prefix}/v1`` (a prefix
    per worker tells their calls apart in the provider's log)."""
    return f"""[interpretation]
auto_confirm = true

[gateway]
cooldown_after = 1000000

[[providers]]
name = "loopback"
kind = "openai"
base_url = "http://127.0.0.1:{port}{path_prefix}/v1"
model = "{model}"
retries = 0
timeout_s = 60
max_concurrency = 16
"""


def batch_config(providers: list[Any], *, auto_confirm: bool = True, max_rounds: int = 10,
                 base_delay_s: float = 30.0,
                 hypotheses: HypothesisPolicy | None = None) -> Config:
    return attrs.evolve(Config.defaults(), providers=tuple(providers), gateway=FAST,
                        interpretation=InterpretationPolicy(auto_confirm=auto_confirm),
                        hypotheses=hypotheses or HypothesisPolicy(),
                        retry=RetryPolicy(max_rounds=max_rounds, base_delay_s=base_delay_s,
                                          max_delay_s=max(base_delay_s, 1.0)))


def generic_server() -> LoopbackServer:
    srv = LoopbackServer(retry_after="0")
    srv.answers["interpretation_v1"] = GENERIC_INTERPRETATION
    srv.answers["hypotheses_v1"] = GENERIC_HYPOTHESES
    return srv


async def intake_many(engine: Any, tmp: Path, ids: list[str],
                       texts: dict[str, str] | None = None) -> None:
    texts = texts or {}
    for case_id in ids:
        report = tmp / f"{case_id}.txt"
        report.write_text(texts.get(case_id, f"Crash in {case_id}\nIt crashes.\n"))
        await engine.store.intake(prepare_intake(report, [], case_id=case_id,
                                                 limits=IntakeLimits()))


def verified(root: Path) -> None:
    check = open_ro(root)
    report = verify_store(check, checks=PHASE_CHECKS)
    check.close()
    assert report.ok, report.violations[:5]
