"""Pin the public faces (callers import from these, never from private modules) and the
layering between them."""

from __future__ import annotations

import inspect
import json
import subprocess
from pathlib import Path

import actors
import engine
import viano_bug_analysis
from tests.conftest import PYTHON, child_env


def _public(module: object) -> list[str]:
    """Public names, not counting submodules (importing one adds it as an attribute)."""
    return sorted(n for n in dir(module)
                  if not n.startswith("_") and not inspect.ismodule(getattr(module, n)))


ENGINE_API = [
    "Accepted", "ArchiveRejected", "Attachment", "AttemptContext", "AttemptResult",
    "AuditRecord", "BLOCKED", "BlobInfo", "BlobSource", "BytesSource", "COMPLETED",
    "CRASH_POINTS", "CaseExists", "CaseLocked", "CaseRef", "CaseStatus", "Change",
    "ChangeRejected", "Config", "ConfigError", "DEFERRED", "DestinationRejected",
    "DispatchRequest", "DispatchResult", "ERROR", "EXIT_BLOCKED", "EXIT_DEFERRED", "EXIT_ERROR",
    "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_REJECTED", "EXIT_RETRY_PENDING",
    "Enter", "ExportSummary", "FORMATS", "FailureClass", "FileEntry", "FileSource", "Finish",
    "GatewayCancelled", "GatewayConfig", "GatewayError", "GcReport", "GenerationRow",
    "HYPOTHESES", "HYPOTHESES_PHASE", "HistoryConflict", "HistoryProblem", "HttpCall",
    "HypothesisLimits",
    "HypothesisPolicy", "INLINE_THRESHOLD", "INTERPRETATION", "INTERPRETATION_PHASE",
    "ImportRejected", "ImportRequest", "InputRejected", "IntakeLimits", "IntakePlan",
    "InterpretationLimits", "InterpretationPolicy", "InterruptedAfterCommit", "InvalidAnswer",
    "InvalidCaseId", "Judge", "MAX_SHARDS",
    "Manifest", "NotAStore", "NotFound", "Outcome", "PACKAGE_FORMAT", "PHASE_CHECKS",
    "PackageCheck", "PackageView", "PhaseRefused", "PhaseSpec", "PhaseState", "PlanInput",
    "PostgresStore", "Problem", "Prompt", "ProviderConfig", "PublishRequest", "Published",
    "REOPENED",
    "RETRY_PENDING", "ROLES", "Redactor", "Refusal", "RejectedInput", "ReportRejected",
    "Request", "RetryPolicy", "RoundOutcome", "RoundRequest", "RoundStatus", "RunRound",
    "SPECS", "STATUSES", "Shard", "SimulatedCrash", "SqliteStore", "StaleGeneration",
    "StatusRequest",
    "Step", "StorageError", "Store", "StoreConfig", "StoreStats", "UntrustedJson", "UsageError",
    "VerifyReport", "VianoError", "Violation", "arm_crash_point", "artifact_json",
    "attempt_hash", "backoff_delay", "batch_problems", "build_call", "build_manifest",
    "canonical_json", "check_destination", "check_regular", "collect_garbage",
    "confirm_change", "crash_point",
    "decide", "disarm_crash_points", "display_location", "due_delay", "enclosing_store",
    "encode_manifest",
    "enter_change",
    "export_package", "fixture_attempt", "http_attempt", "hypotheses_paths",
    "hypothesis_policy", "install_log_filter", "interpretation_paths", "interpretation_policy",
    "interpretation_problems", "is_utf8", "iso_utc", "judge_change", "load_prompt", "load_state",
    "loads_untrusted", "make_record", "markdown_block", "markdown_inert",
    "markdown_inert_block", "markdown_inline", "new_package_id", "no_answer_status",
    "normalized", "open_backend", "open_regular", "parse_contracted_json", "person",
    "phase_dir", "plan_batch", "policy_like",
    "prepare_intake", "prompt_for", "provider_statistics", "read_export", "reading_bound",
    "remove_log_filter", "reopen_change", "report_document", "report_markdown",
    "reserve_documents",
    "retry_after_seconds",
    "round_change", "running", "sha256_hex", "shard_of", "store_errors_first",
    "successor_violations",
    "terminal_safe",
    "tune_collector", "unblock_change", "utc_now_iso", "validate_case_id", "validate_hypotheses",
    "validate_interpretation", "verify_store", "whole_history",
]

ACTORS_API = [
    "CaseResult", "Clock", "Engine", "GatewayHandle", "GatewayPool", "PhaseServices",
    "ProviderStats", "PublishMsg", "PublisherStats", "Snapshot", "StoreHandle", "SystemClock",
    "TrioClock", "case_operation", "check_concurrency", "dispatch_phase", "log_event",
    "mailbox", "open_engine_on",
    "open_gateway", "open_store", "run_gateway_pool", "run_phase", "run_publisher", "worst_exit",
]

FACE_API = [
    "ArchiveRejected", "Attachment", "AuditRecord", "CaseExists", "CaseLocked", "CaseResult",
    "CaseStatus", "Change", "Config", "ConfigError", "DispatchResult", "Engine", "FailureClass",
    "GatewayCancelled", "GatewayConfig", "GatewayError", "GatewayHandle", "HistoryConflict",
    "HypothesisLimits",
    "HypothesisPolicy", "IntakeLimits", "IntakePlan", "InterpretationPolicy", "Manifest",
    "NotFound", "Prompt", "ProviderConfig", "ProviderStats", "Published", "RejectedInput",
    "RetryPolicy", "RoundOutcome", "RoundRequest", "RoundStatus", "Shard", "Snapshot",
    "StaleGeneration", "StorageError", "StoreHandle", "VianoError", "bundled_sample", "open_engine",
    "open_gateway", "open_store", "prepare_intake",
]


def test_engine_face() -> None:
    """engine re-exports exactly its curated API (a change here is an API change)."""
    assert _public(engine) == ENGINE_API


def test_actors_face() -> None:
    """actors exposes the actors, their handles and their messages."""
    assert _public(actors) == ACTORS_API


def test_public_face() -> None:
    """viano_bug_analysis is the embedding face: what a host needs, and nothing private."""
    assert _public(viano_bug_analysis) == FACE_API


LAYERS = """
import json, sys
import {module}
loaded = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps(loaded))
"""


def _loaded_by(module: str) -> set[str]:
    proc = subprocess.run([PYTHON, "-c", LAYERS.replace("{module}", module)],
                          capture_output=True, text=True, env=child_env(), timeout=60,
                          check=True)
    return set(json.loads(proc.stdout))


def test_engine_never_loads_actors_or_trio() -> None:
    """Importing engine, in a fresh interpreter, loads neither actors, the face, trio nor
    trio-util (checked in sys.modules, not by reading source)."""
    loaded = _loaded_by("engine")
    assert not loaded & {"actors", "viano_bug_analysis", "trio", "trio_util"}, loaded


def test_actors_never_load_the_face() -> None:
    """actors depends on engine only, never on the public face or the CLI."""
    loaded = _loaded_by("actors")
    assert "engine" in loaded and "viano_bug_analysis" not in loaded, loaded


async def test_embedding_through_the_face_alone(tmp_path: Path) -> None:
    """The face alone is enough to intake the sample, read it back through a snapshot and
    run a fixture round — no import from engine, actors or the CLI."""
    import viano_bug_analysis as v

    fixtures = tmp_path / "fx" / "interpretation_v1"
    fixtures.mkdir(parents=True)
    (fixtures / "default.json").write_text('{"summary": "s"}')
    config = v.Config.defaults()
    sample = v.bundled_sample()
    plan = v.prepare_intake(sample / "report.json",
                            [v.Attachment("diagnostics", sample / "wowdiag.zip")],
                            case_id=None, limits=config.intake.limits)
    provider = v.ProviderConfig(name="fx", kind="fixture", path=str(tmp_path / "fx"))
    async with v.open_gateway([provider], config.gateway) as gateway, \
            v.open_store(tmp_path / "store") as store:
        published = await store.intake(plan)
        snap = await store.snapshot(published.case_id)
        catalogue = await snap.read("case/catalogue.json")
        outcome = await gateway.round(v.RoundRequest(v.Prompt(
            "interpretation_v1", "system", "{}", {"type": "object"}, published.case_id)))
    assert published.case_id == "BUG-20" and snap.generation == published.generation == 1
    assert outcome.status is v.RoundStatus.ANSWER
    assert outcome.parsed == {"summary": "s"}
    assert b'"source_id": "S1"' in catalogue
