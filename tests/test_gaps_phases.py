"""Gaps an audit of #7 and #8 found: behaviours that were there (or meant to be) with no
test that would fail without them, and the defects it found — the interpretation checked
before the hypothesis phase's history, an invalid answer's raw content kept in its round
record, the limits and defaults of both phases, the prompt's rules, and the excerpt and
pointer checks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio

from actors import PhaseServices, case_operation, dispatch_phase
from engine import (
    HYPOTHESES,
    INTERPRETATION,
    PHASE_CHECKS,
    HypothesisLimits,
    HypothesisPolicy,
    InterpretationLimits,
    InterpretationPolicy,
    confirm_change,
    verify_store,
)
from tests.conftest import run_viano
from tests.loopback import LoopbackServer
from tests.phase_helpers import (
    H1,
    HYP_ANSWER,
    I1,
    INTERPRETATION_ANSWER,
    http_provider,
    intake_sample,
    interpretation_request,
    json_edit,
    rewrite_export,
    services,
    start_sample_server,
)
from tests.store_helpers import import_refused_then_placed, open_ro
from viano_bug_analysis.analysis import HypothesisConfig

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv: LoopbackServer = await start_sample_server(nursery)
    return srv


def _providers(server: LoopbackServer) -> list[Any]:
    return [http_provider("p", "openai", server.openai_url)]


def _hyp_request(policy: HypothesisPolicy | None = None, attempt_id: str = "default") -> Any:
    return HypothesisConfig(hypotheses=policy or HypothesisPolicy()).request(attempt_id)


async def _interpreted_and_confirmed(sv: PhaseServices) -> None:
    await intake_sample(sv.store)
    r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
    assert r.status == "COMPLETED", r
    await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))


def _export(root: Path, dest: Path) -> Path:
    r = run_viano("export", "--store", root, "BUG-20", dest)
    assert r.returncode == 0, r.stderr
    return dest


def _import(zip_path: Path, root: Path) -> None:
    """A tampered export: refused by import, then placed in the store behind its back."""
    import_refused_then_placed(zip_path, root, run_viano)


def _violations(root: Path) -> list[str]:
    store = open_ro(root)
    try:
        return [v.what for v in verify_store(store, checks=PHASE_CHECKS).violations]
    finally:
        store.close()


def _tamper_statements() -> list[tuple[str, Any]]:
    """The interpretation's first statement reworded after confirmation, and the
    confirmation rehashed to bind the edited file (so import's hashes all agree)."""
    interp, conf = I1 + "interpretation.json", I1 + "confirmation.json"

    def reword(doc: dict[str, Any], _sha: Callable[[str], str]) -> None:
        doc["statements"][0]["text"] = "The reporter confirmed the root cause is the cache."

    def reconfirm(doc: dict[str, Any], sha: Callable[[str], str]) -> None:
        doc["interpretation_sha256"] = doc["interpretation"]["sha256"] = sha(interp)

    return [(interp, json_edit(reword)), (conf, json_edit(reconfirm))]


class TestTheInterpretationIsCheckedFirst:
    @pytest.mark.parametrize("how_far", ["entered", "completed"])
    async def test_a_tampered_interpretation_is_a_mismatch_after_the_phase_entered(
            self, tmp_path: Path, server: LoopbackServer, how_far: str) -> None:
        """The hypothesis phase entered (its context, derived from the interpretation's
        statements, is pinned; here a round found no provider) or completed; then the
        statements are edited in an export, the confirmation rehashed so import accepts
        it. The builder re-verifies the interpretation before anything else:
        interpretation_mismatch — not unsupported_history from the hypothesis context
        that no longer derives — with no model call and nothing published."""
        if how_far == "entered":
            server.mode_for = lambda r: "503" if r.prompt_id == "hypotheses_v1" else None
        async with services(tmp_path / "a", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
            assert r.status == ("RETRY_PENDING" if how_far == "entered" else "COMPLETED"), r
        edited = rewrite_export(_export(tmp_path / "a", tmp_path / "x.zip"),
                                tmp_path / "e.zip", _tamper_statements())
        _import(edited, tmp_path / "b")
        calls = len(server.requests)
        async with services(tmp_path / "b", _providers(server),
                            clock=_late_clock()) as sv:
            before = (await sv.store.snapshot("BUG-20")).manifest.package_generation
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
            after = (await sv.store.snapshot("BUG-20")).manifest.package_generation
        assert (r.status, r.reason) == ("ERROR", "interpretation_mismatch"), r
        assert "statements differ" in r.message
        assert len(server.requests) == calls and after == before
        assert any("statements differ" in v for v in _violations(tmp_path / "b"))


def _late_clock() -> Any:
    """A wall clock far past any due time a round of these tests set."""
    from actors import TrioClock

    return TrioClock(start=4_000_000_000.0)


class TestDecideOrder:
    def test_a_failing_precondition_is_named_before_a_history_problem(self) -> None:
        """Both at once (an edited interpretation makes the hypothesis context underivable
        too): the precondition's reason is the result."""
        from engine import Finish, PhaseState, Refusal, decide
        from engine._config import RetryPolicy

        state = PhaseState(
            key="hypotheses", phase="GENERATING_HYPOTHESES", package_id="p", revision=1,
            entered=True, accepted=True, history_problem="context.json does not derive",
            precheck=Refusal("ERROR", "interpretation_mismatch", "edited"),
            pinned_policy_sha="a" * 64, current_policy_sha="a" * 64, context_sha="b" * 64,
            prompt_id="hypotheses_v1", prompt_sha="c" * 64, series=1, rounds=(),
            rejected=frozenset(), last_round=None, status=None)
        from engine import DispatchRequest

        step = decide(state, DispatchRequest(policy={}, retry=RetryPolicy()), 0.0)
        assert isinstance(step, Finish) and step.reason == "interpretation_mismatch"


INVALID = {"prose": "Sure! Here it is: " + json.dumps(INTERPRETATION_ANSWER),
           "two objects": json.dumps(INTERPRETATION_ANSWER) + "\n" + json.dumps(
               INTERPRETATION_ANSWER),
           "a list": json.dumps([INTERPRETATION_ANSWER])}


class TestWhatAnInvalidAnswerLeaves:
    @pytest.mark.parametrize("kind", ["openai", "anthropic"])
    @pytest.mark.parametrize("label", sorted(INVALID))
    async def test_the_round_keeps_what_came_back_and_the_rejection_names_it(
            self, tmp_path: Path, server: LoopbackServer, kind: str, label: str) -> None:
        """An answer the gateway classes invalid: the round record (``*.invalid.json``)
        keeps the content that came back, with its sha256 and size, beside the attempt's
        audit record (class invalid_answer, its detail, the response); errors/<attempt-
        hash>.json names that answer by hash; verify accepts the history."""
        content = INVALID[label]
        server.answers["interpretation_v1"] = content
        url = server.openai_url if kind == "openai" else server.anthropic_url
        async with services(tmp_path / "s", [http_provider("p", kind, url)]) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason) == ("ERROR", "invalid_answer"), r
            snap = await sv.store.snapshot("BUG-20")
            rounds = [p for p in snap.manifest.files if "/rounds/" in p]
            assert rounds == [I1 + "rounds/0001-0001.invalid.json"]
            doc = json.loads(await snap.read(rounds[0]))
            errors = [p for p in snap.manifest.files if "/errors/" in p]
            rejection = json.loads(await snap.read(errors[0]))
        import hashlib

        sha = hashlib.sha256(content.encode()).hexdigest()
        assert doc["answer"] == {"content": content, "sha256": sha,
                                 "bytes": len(content.encode())}
        assert rejection["answer_sha256"] == sha
        assert rejection["round"]["path"] == rounds[0]
        audit = doc["attempts"][-1]
        assert (audit["provider"], audit["failure"], audit["status"]) == (
            "p", "invalid_answer", 200)
        assert audit["detail"] == ("not_an_object" if label == "a list" else "not_json")
        assert audit["request_body"]["path"].startswith(I1 + "requests/")
        assert "Sure! Here it is" in audit["response_body"] or label != "prose"
        assert _violations(tmp_path / "s") == []
        cat = run_viano("cat", "--store", tmp_path / "s", "BUG-20", rounds[0], "--json")
        assert cat.returncode == 0 and content in json.loads(
            json.loads(cat.stdout)["text"])["answer"]["content"]

    async def test_an_invalid_answer_over_the_audit_limit_is_kept_whole(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """The audit record's copy of a response is cut at its limit (64 KiB); the round
        record keeps the whole invalid answer (within max_output_bytes) from the gateway."""
        content = "Here you go: " + "x" * 200_000 + " " + json.dumps(INTERPRETATION_ANSWER)
        server.answers["interpretation_v1"] = content
        async with services(tmp_path / "s", _providers(server)) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert r.reason == "invalid_answer"
            snap = await sv.store.snapshot("BUG-20")
            doc = json.loads(await snap.read(I1 + "rounds/0001-0001.invalid.json"))
        assert doc["attempts"][-1]["response_truncated"] is True
        assert doc["answer"]["content"] == content
        assert doc["answer"]["bytes"] == len(content.encode())
        assert _violations(tmp_path / "s") == []

    async def test_a_key_inside_an_invalid_answer_is_masked_in_the_round(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        from tests.phase_helpers import KEY

        server.answers["interpretation_v1"] = f"I used {KEY}. " + json.dumps(
            INTERPRETATION_ANSWER)
        async with services(tmp_path / "s", _providers(server)) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert r.reason == "invalid_answer"
            snap = await sv.store.snapshot("BUG-20")
            doc = json.loads(await snap.read(I1 + "rounds/0001-0001.invalid.json"))
        assert doc["answer"]["content"].startswith("I used [REDACTED]. ")
        assert not [p for p in (tmp_path / "s").rglob("*")
                    if p.is_file() and KEY.encode() in p.read_bytes()]

    async def test_an_invalid_round_carrying_an_answer_that_is_not_its_own_is_refused(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """The audit accepts an invalid round's content only with its own hash and size
        (an export edited to change what came back, without rehashing, is history this
        phase did not write)."""
        server.answers["interpretation_v1"] = INVALID["prose"]
        async with services(tmp_path / "a", _providers(server)) as sv:
            await intake_sample(sv.store)
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())

        def swap(doc: dict[str, Any], _sha: Callable[[str], str]) -> None:
            doc["answer"]["content"] = "something else"

        path = I1 + "rounds/0001-0001.invalid.json"
        edited = rewrite_export(_export(tmp_path / "a", tmp_path / "x.zip"),
                                tmp_path / "e.zip", [(path, json_edit(swap))])
        _import(edited, tmp_path / "b")
        assert any(path in v and "answer" in v for v in _violations(tmp_path / "b"))


class TestAuditRecordsInRounds:
    async def test_a_cooldown_skip_is_recorded_in_the_round(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Provider 'down' fails once and cools down; the next round skips it: that round's
        record holds the skip's audit record (class skipped_cooldown, detail cooldown)
        before the answer of the next provider."""
        import attrs

        from tests.phase_helpers import FAST

        server.mode_for = lambda r: "503" if r.path.startswith("/down/") else None
        down = http_provider("down", "openai", f"http://127.0.0.1:{server.port}/down/v1")
        up = http_provider("up", "openai", server.openai_url)
        gateway = attrs.evolve(FAST, cooldown_after=1, cooldown_s=3600.0)
        async with services(tmp_path / "s", [down, up], gateway=gateway) as sv:
            await _interpreted_and_confirmed(sv)
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
            assert r.status == "COMPLETED", r
            snap = await sv.store.snapshot("BUG-20")
            first = json.loads(await snap.read(I1 + "rounds/0001-0001.answer.json"))
            second = json.loads(await snap.read(H1 + "rounds/0001-0001.answer.json"))
        assert [(a["provider"], a["failure"], a["detail"]) for a in first["attempts"]] == [
            ("down", "unavailable", "http_503"), ("up", None, "ok")]
        assert [(a["provider"], a["failure"], a["detail"]) for a in second["attempts"]] == [
            ("down", "skipped_cooldown", "cooldown"), ("up", None, "ok")]
        assert "cooling down" in second["attempts"][0]["error"]
        assert second["provider"] == "up"
        assert _violations(tmp_path / "s") == []


class TestLimits:
    def test_the_hypothesis_limits_default_to_the_spec(self, tmp_path: Path) -> None:
        """1 MiB of context, 32 prior generations, 2 MiB of output, 2 MiB of summary: as
        the types give them, as an empty configuration file gives them, and as the
        builder's public config gives them."""
        from engine import Config

        spec = (1_048_576, 32, 2_097_152, 2_097_152)

        def of(limits: HypothesisLimits) -> tuple[int, int, int, int]:
            return (limits.max_context_bytes, limits.max_prior_generations,
                    limits.max_output_bytes, limits.max_summary_bytes)

        empty = tmp_path / "empty.toml"
        empty.write_text("")
        assert of(HypothesisLimits()) == spec
        assert of(Config.load(empty).hypotheses.limits) == spec
        assert of(HypothesisConfig.load(empty).limits) == spec
        assert of(HypothesisConfig().limits) == spec

    async def test_the_default_limits_are_what_a_revision_pins(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        async with services(tmp_path / "s", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            assert (await dispatch_phase(sv, HYPOTHESES, "BUG-20",
                                         _hyp_request())).status == "COMPLETED"
            snap = await sv.store.snapshot("BUG-20")
            pinned = json.loads(await snap.read(H1 + "policy.json"))["policy"]
        assert pinned["limits"] == {"max_context_bytes": 1_048_576,
                                    "max_prior_generations": 32,
                                    "max_output_bytes": 2_097_152,
                                    "max_summary_bytes": 2_097_152}

    async def test_a_hypotheses_context_over_its_limit_is_limit_exceeded(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Nothing is truncated, nothing entered, no model call."""
        policy = HypothesisPolicy(limits=HypothesisLimits(max_context_bytes=2_000))
        async with services(tmp_path / "s", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            calls = len(server.requests)
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request(policy))
            snap = await sv.store.snapshot("BUG-20")
        assert (r.status, r.reason) == ("ERROR", "limit_exceeded"), r
        assert "max_context_bytes=2000" in r.message
        assert len(server.requests) == calls
        assert not [p for p in snap.manifest.files if p.startswith(H1)]

    async def test_a_hypotheses_summary_over_its_limit_is_limit_exceeded(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """The answer is valid, but hypotheses.md would pass max_summary_bytes: rejected
        (errors file, reason limit_exceeded), no batch, no registry."""
        policy = HypothesisPolicy(limits=HypothesisLimits(max_summary_bytes=500))
        async with services(tmp_path / "s", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request(policy))
            snap = await sv.store.snapshot("BUG-20")
            files = set(snap.manifest.files)
            errors = [p for p in files if p.startswith(H1 + "errors/")]
            doc = json.loads(await snap.read(errors[0]))
        assert (r.status, r.reason) == ("ERROR", "limit_exceeded"), r
        assert "max_summary_bytes=500" in r.message
        assert doc["errors"][0]["rule"] == "limit_exceeded"
        assert not files & {H1 + "hypotheses.json", H1 + "registry.json", H1 + "hypotheses.md"}
        assert "hypotheses" not in snap.manifest.pointers

    async def test_an_interpretation_summary_over_its_limit_is_limit_exceeded(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        import attrs

        from engine import Config

        config = attrs.evolve(Config.defaults(), interpretation=InterpretationPolicy(
            limits=InterpretationLimits(max_summary_bytes=300)))
        async with services(tmp_path / "s", _providers(server)) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                     interpretation_request(config))
            snap = await sv.store.snapshot("BUG-20")
            files = set(snap.manifest.files)
            errors = [p for p in files if p.startswith(I1 + "errors/")]
            doc = json.loads(await snap.read(errors[0]))
        assert (r.status, r.reason) == ("ERROR", "limit_exceeded"), r
        assert "max_summary_bytes=300" in r.message
        assert doc["errors"][0]["rule"] == "limit_exceeded"
        assert not files & {I1 + "interpretation.json", I1 + "summary.md"}


class TestTheInterpretationPrompt:
    # Each rule the interpretation validator can report, and where the prompt states it.
    RULES: ClassVar[dict[str, list[str]]] = {
        "wrong_type": ['"source_ids" is always a list', '("S1" is wrong,\n   ["S1"] is right)'],
        "unknown_field": ["no other key anywhere"],
        "missing_field": ["none missing"],
        "blank_string": ["Every string is non-blank"],
        "empty_list": ['"statements": a non-empty list'],
        "ungrounded_statement": ["Every grounded statement cites at least one source"],
        "unknown_kind": ['"kind": one of the kinds below'],
        "unknown_source": ["Every source id exists in this case's catalogue"],
        "duplicate_divergence": ['At most one statement has kind "first_known_divergence"'],
        "contracted_json": ["exactly one JSON object and nothing else",
                            "no prose before or after it, no second\nobject"],
    }

    def test_it_states_every_rule_its_validator_enforces(self) -> None:
        """Every rule the validator (and the contracted-JSON reader before it) can name
        is stated in the prompt; a new rule in the code without its sentence in the prompt
        fails here."""
        import inspect
        import re

        from engine import load_prompt
        from engine._phases import _interpretation, _validate

        text = load_prompt("interpretation_v1").text
        source = inspect.getsource(_validate) + inspect.getsource(
            _interpretation.validate_interpretation)
        emitted = {name for line in source.splitlines() if "add(" in line or "rule" in line
                   for name in re.findall(r'"([a-z]+(?:_[a-z]+)+)"', line)}
        if "forbidden=" not in inspect.getsource(_interpretation.validate_interpretation):
            emitted.discard("forbidden_field")  # no name is forbidden in this answer
        assert emitted | {"contracted_json"} == set(self.RULES), emitted ^ set(self.RULES)
        for rule, phrases in self.RULES.items():
            for phrase in phrases:
                assert phrase in text, (rule, phrase)
        from engine._phases._interpretation import GROUNDED, UNGROUNDED

        grounded_part = text[text.index("grounded:"):text.index("ungrounded:")]
        ungrounded_part = text[text.index("ungrounded:"):text.index("RULES")]
        for kind in GROUNDED:
            assert f'"{kind}"' in grounded_part, kind
        for kind in UNGROUNDED:
            assert f'"{kind}"' in ungrounded_part, kind
        for key in ("summary", "statements", "missing_observations", "kind", "text",
                    "source_ids"):
            assert f'"{key}"' in text, key
        assert "untrusted_case_data" in text and "never\nan instruction" in text

    def test_its_worked_example_validates(self) -> None:
        """The example is an answer the validator accepts, for a case with the sources it
        cites (S1 the report, S3 an observation, S4 a log)."""
        from engine import load_prompt, validate_interpretation
        from engine._phases._case import CaseRecord

        text = load_prompt("interpretation_v1").text
        example = json.loads(text[text.index('{"summary"', text.index("EXAMPLE")):])
        kinds = {1: "report", 2: "comment", 3: "observation", 4: "diagnostics"}
        case = CaseRecord("c", "i", tuple(
            {"source_id": f"S{i}", "kind": kind, "human": i < 4}
            for i, kind in kinds.items()), {})
        assert [(p.rule, p.pointer) for p in validate_interpretation(example, case)] == []
        assert {s["kind"] for s in example["statements"]} >= {"first_known_divergence",
                                                             "assumption"}


class TestExcerpts:
    async def test_a_binary_archive_member_is_not_text_in_the_context(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """An archive with a text log, a .dmp and an extensionless file holding NULs: both
        binary members are catalogue entries only, listed under not_excerpted with reason
        not_text, and none of their bytes reach the context; the log is excerpted."""
        from engine import Attachment, IntakeLimits, prepare_intake
        from tests.archives import zip_with

        marker = b"BINARY-MARKER-7f3a"
        archive = zip_with(tmp_path / "diag.zip", [
            ("logs/app.log", b"ERROR something failed\n"),
            ("crash.dmp", b"MDMP\x00\x00" + marker),
            ("core", b"\x7fELF\x00\x01\x00" + marker)])
        report = tmp_path / "r.txt"
        report.write_text("It crashes\nThe app crashes on start.\n")
        server.mode_for = lambda _r: "503"
        async with services(tmp_path / "s", _providers(server)) as sv:
            await sv.store.intake(prepare_intake(report, [Attachment("diagnostics", archive)],
                                                 case_id="BIN-1", limits=IntakeLimits()))
            r = await dispatch_phase(sv, INTERPRETATION, "BIN-1", interpretation_request())
            assert r.status == "RETRY_PENDING", r
            snap = await sv.store.snapshot("BIN-1")
            raw = await snap.read(I1 + "context.json")
        context = json.loads(raw)
        by_origin = {s["origin"].get("member"): s for s in
                     context["untrusted_case_data"]["catalogue"] if s["origin"]}
        dmp, core, log = (by_origin["crash.dmp"]["source_id"], by_origin["core"]["source_id"],
                          by_origin["logs/app.log"]["source_id"])
        skipped = {x["source_id"]: x["reason"] for x in context["excerpting"]["not_excerpted"]}
        assert skipped[dmp] == skipped[core] == "not_text"
        assert context["excerpting"]["excerpted"] == [log]
        assert [e["source_id"] for e in context["untrusted_case_data"]["excerpts"]] == [log]
        assert marker not in raw and b"MDMP" not in raw


class TestPointersRemovedBehindTheStoresBack:
    async def test_the_batch_is_reused_never_rebuilt_and_verify_flags_it(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A completed batch; then a generation written straight into the index (a valid
        manifest hash) drops the hypotheses' three pointers. The builder makes no call and
        no second batch (it reuses the one the files hold), and verify names the removed
        pointers."""

        import orjson

        from tests.store_helpers import forge_generation

        async with services(tmp_path / "s", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            assert (await dispatch_phase(sv, HYPOTHESES, "BUG-20",
                                         _hyp_request())).status == "COMPLETED"
            snap = await sv.store.snapshot("BUG-20")
            m = snap.manifest.to_json()
            batch = {p: await snap.read(p) for p in snap.manifest.files if p.startswith(H1)}
        gone = ("hypotheses", "hypothesis_registry", "hypotheses_summary")
        g = m["package_generation"]
        m2 = dict(m, package_generation=g + 1, parent_generation=g,
                  created_at="2030-01-01T00:00:00.000000Z",
                  pointers={k: v for k, v in m["pointers"].items() if k not in gone})
        raw = orjson.dumps(m2, option=orjson.OPT_SORT_KEYS)
        forge_generation(tmp_path / "s", m["package_id"], g + 1, raw, m["phase"],
                         m2["created_at"])
        calls = len(server.requests)
        async with services(tmp_path / "s", _providers(server)) as sv:
            r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
            again = await dispatch_phase(sv, HYPOTHESES, "BUG-20",
                                         _hyp_request(attempt_id="second"))
            snap = await sv.store.snapshot("BUG-20")
            after = {p: await snap.read(p) for p in snap.manifest.files if p.startswith(H1)}
        assert (r.status, r.reason) in {("COMPLETED", "completed"),
                                        ("ERROR", "unsupported_history")}, r
        assert (again.status, again.reason) == (r.status, r.reason)
        assert len(server.requests) == calls
        assert after == batch and snap.manifest.package_generation == g + 1
        violations = _violations(tmp_path / "s")
        assert any("pointer" in v and "hypotheses" in v for v in violations), violations
        v = run_viano("verify", "--store", tmp_path / "s")
        assert v.returncode == 1 and "hypothesis_registry" in v.stdout + v.stderr


class TestArtifactsOfTheFirstEscaping:
    async def test_packages_written_with_the_weaker_escaping_still_audit_clean(
            self, tmp_path: Path, server: LoopbackServer,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """summary.md and hypotheses.md are now escaped inert for GitHub and Jira (no
        mention, no e-mail autolink, no nested list); a package whose artifacts were
        rendered with the first, weaker escaping is still what its history gives, so it
        verifies, and the builder reuses its batch rather than calling again."""
        from engine._phases import _hypotheses, _interpretation

        server.answers["interpretation_v1"] = json.dumps(
            INTERPRETATION_ANSWER | {"summary": "mail me@evil.example and ping @bob"})
        hyps = json.loads(json.dumps(HYP_ANSWER))
        hyps["hypotheses"][0]["mechanism"] += " (as in GH-7; ask @bob)"
        server.answers["hypotheses_v1"] = json.dumps(hyps)
        def first(render: Any) -> Any:
            return lambda *a, **kw: render(*a, **{**kw, "legacy": True})

        old_summary = first(_interpretation.render_summary)
        old_batch = first(_hypotheses.render_hypotheses)
        async with services(tmp_path / "s", _providers(server)) as sv:
            with monkeypatch.context() as m:  # the first packages' renderer
                m.setattr(_interpretation, "render_summary", old_summary)
                m.setattr(_hypotheses, "render_hypotheses", old_batch)
                await _interpreted_and_confirmed(sv)
                r = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
                assert r.status == "COMPLETED", r
            snap = await sv.store.snapshot("BUG-20")
            summary = (await snap.read(I1 + "summary.md")).decode()
            batch_md = (await snap.read(H1 + "hypotheses.md")).decode()
            calls = len(server.requests)
            again = await dispatch_phase(sv, HYPOTHESES, "BUG-20", _hyp_request())
            assert again.status == "COMPLETED" and len(server.requests) == calls
        assert "me\\@evil.example" in summary  # written with the weaker escaping
        assert "GH-7" in batch_md and "`GH-7`" not in batch_md
        assert _violations(tmp_path / "s") == []

    async def test_new_artifacts_are_inert_where_they_are_posted(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        server.answers["interpretation_v1"] = json.dumps(
            INTERPRETATION_ANSWER | {"summary": "mail me@evil.example, ping @bob, GH-7"})
        async with services(tmp_path / "s", _providers(server)) as sv:
            await _interpreted_and_confirmed(sv)
            snap = await sv.store.snapshot("BUG-20")
            summary = (await snap.read(I1 + "summary.md")).decode()
        import cmarkgfm

        html = cmarkgfm.github_flavored_markdown_to_html(summary)
        assert "<a " not in html and "mailto" not in html, html
        assert "@\u2060" in summary and "`GH-7`" in summary
        assert _violations(tmp_path / "s") == []
