"""Pin the public faces: callers import from these, never from private modules."""

from __future__ import annotations

import inspect

import actors
import engine
import viano_bug_analysis


def _public(module: object) -> set[str]:
    """Public names, not counting submodules (importing one adds it as an attribute)."""
    return {n for n in dir(module)
            if not n.startswith("_") and not inspect.ismodule(getattr(module, n))}


ENGINE_API = [
    "ArchiveRejected",
    "Attachment",
    "AttemptContext",
    "AttemptResult",
    "AuditRecord",
    "BlobSource",
    "BytesSource",
    "CRASH_POINTS",
    "CaseExists",
    "CaseLocked",
    "CaseRef",
    "Change",
    "ChangeRejected",
    "Config",
    "ConfigError",
    "EXIT_DEFERRED",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_REJECTED",
    "ExportSummary",
    "FailureClass",
    "FileSource",
    "GatewayConfig",
    "GcReport",
    "HttpCall",
    "HypothesisLimits",
    "HypothesisPolicy",
    "INLINE_THRESHOLD",
    "ImportRejected",
    "ImportRequest",
    "InputRejected",
    "IntakeLimits",
    "IntakePlan",
    "InterpretationPolicy",
    "InvalidAnswer",
    "InvalidCaseId",
    "NotFound",
    "Outcome",
    "PACKAGE_FORMAT",
    "Prompt",
    "ProviderConfig",
    "PublishRequest",
    "Published",
    "ROLES",
    "Redactor",
    "RejectedInput",
    "ReportRejected",
    "Request",
    "RetryPolicy",
    "RoundOutcome",
    "RoundRequest",
    "RoundStatus",
    "SimulatedCrash",
    "SqliteStore",
    "StaleGeneration",
    "StorageError",
    "VerifyReport",
    "VianoError",
    "Violation",
    "arm_crash_point",
    "artifact_json",
    "backoff_delay",
    "build_call",
    "canonical_json",
    "case_lock",
    "collect_garbage",
    "disarm_crash_points",
    "export_package",
    "fixture_attempt",
    "http_attempt",
    "install_log_filter",
    "make_record",
    "new_package_id",
    "no_answer_status",
    "parse_contracted_json",
    "prepare_intake",
    "read_export",
    "remove_log_filter",
    "retry_after_seconds",
    "sha256_hex",
    "utc_now_iso",
    "validate_case_id",
    "verify_store",
]


def test_engine_face() -> None:
    """engine re-exports exactly its curated API (a change here is an API change)."""
    assert sorted(_public(engine)) == ENGINE_API


def test_actors_face() -> None:
    """actors exposes the publisher, the gateway pool and their handles."""
    assert _public(actors) == {
        "GatewayCancelled", "GatewayHandle", "GatewayPool", "PublishMsg", "PublisherStats",
        "StoreHandle", "mailbox", "open_gateway", "open_store", "run_gateway_pool",
        "run_publisher"}


def test_public_face() -> None:
    """viano_bug_analysis is the embedding face: store, gateway, intake, rounds."""
    assert _public(viano_bug_analysis) == {
        "Attachment", "AuditRecord", "Config", "FailureClass", "GatewayHandle", "IntakePlan",
        "Prompt", "Published", "RoundOutcome", "RoundRequest", "RoundStatus", "StoreHandle",
        "VianoError", "open_gateway", "open_store", "prepare_intake", "verify_store"}


async def test_embedding_through_the_face(tmp_path: object) -> None:
    """The face alone is enough to intake the sample and run a fixture round."""
    from pathlib import Path

    from engine import ProviderConfig
    from viano_bug_analysis.cli._commands import sample_dir

    root = Path(str(tmp_path))
    fixtures = root / "fx" / "interpretation_v1"
    fixtures.mkdir(parents=True)
    (fixtures / "default.json").write_text('{"summary": "s"}')
    config = viano_bug_analysis.Config.defaults()
    sample = sample_dir()
    plan = viano_bug_analysis.prepare_intake(
        sample / "report.json", [viano_bug_analysis.Attachment("diagnostics",
                                                               sample / "wowdiag.zip")],
        case_id=None, limits=config.intake.limits)
    provider = ProviderConfig(name="fx", kind="fixture", path=str(root / "fx"))
    async with viano_bug_analysis.open_store(root / "store") as store, \
            viano_bug_analysis.open_gateway([provider], config.gateway) as gateway:
        published = await store.intake(plan)
        catalogue = await store.read_file(published.case_id, "case/catalogue.json")
        outcome = await gateway.round(viano_bug_analysis.RoundRequest(viano_bug_analysis.Prompt(
            "interpretation_v1", "system", "{}", {"type": "object"}, published.case_id)))
    assert published.case_id == "BUG-20" and published.generation == 1
    assert outcome.status is viano_bug_analysis.RoundStatus.ANSWER
    assert outcome.parsed == {"summary": "s"}
    assert b'"source_id": "S1"' in catalogue


def test_engine_never_imports_actors() -> None:
    """The layering rule: engine/ does not import actors/ or trio."""
    from pathlib import Path

    root = Path(engine.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import actors" not in text and "from actors" not in text, path
        assert "import trio" not in text, path
