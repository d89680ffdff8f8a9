"""The Hypothesis Builder v1, through its public API over the real adapters and the
loopback server: preconditions, the three generations, the registry and budgets, pinned
policies, one batch per revision whatever happens, portable replay, reopening, crashes,
concurrency and tamper resistance."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors import TrioClock, case_operation, dispatch_phase, open_store
from engine import (
    INTERPRETATION,
    PHASE_CHECKS,
    BytesSource,
    CaseStatus,
    Change,
    HypothesisPolicy,
    PhaseRefused,
    SimulatedCrash,
    arm_crash_point,
    confirm_change,
    reopen_change,
    verify_store,
)
from tests.conftest import run_viano
from tests.loopback import LoopbackServer, dead_port
from tests.phase_helpers import (
    HYP_ANSWER,
    INTERPRETATION_ANSWER,
    http_provider,
    intake_sample,
    interpretation_request,
    json_edit,
    package_files,
    rewrite_export,
    services,
    start_sample_server,
)
from tests.store_helpers import import_refused_then_placed, open_ro
from viano_bug_analysis.analysis import HypothesisBuilder, HypothesisConfig

pytestmark = pytest.mark.usefixtures("backend")

H = "analysis/hypotheses/0001/"


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv: LoopbackServer = await start_sample_server(nursery)
    return srv


def _calls(srv: LoopbackServer, prompt: str = "hypotheses_v1") -> int:
    return sum(r.prompt_id == prompt for r in srv.requests)


async def _confirmed(sv: Any, *, interpretation: dict[str, Any] | None = None,
                     server: LoopbackServer | None = None) -> str:
    """Intake the sample, interpret it and confirm it; the package id."""
    if interpretation is not None and server is not None:
        server.answers["interpretation_v1"] = json.dumps(interpretation)
    published = await intake_sample(sv.store)
    r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
    assert r.status == "COMPLETED", r
    await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))
    return published.package_id


def _policy(**kw: Any) -> HypothesisConfig:
    return HypothesisConfig(hypotheses=HypothesisPolicy(**kw))


def _verify(root: Path) -> None:
    check = open_ro(root)
    report = verify_store(check, checks=PHASE_CHECKS)
    check.close()
    assert report.ok, report.violations


class TestTheBatch:
    @pytest.mark.parametrize("kind", ["openai", "anthropic"])
    async def test_three_generations_records_and_registry(
            self, tmp_path: Path, server: LoopbackServer, kind: str) -> None:
        """Enter, round, accept; hypotheses.json, registry.json and hypotheses.md together
        with the five pointers; H1..H3, equal budgets, a registry that counts creations and
        whose origins resolve to the records' bytes."""
        url = server.openai_url if kind == "openai" else server.anthropic_url
        async with services(tmp_path / "s", [http_provider("p", kind, url)]) as sv:
            pkg = await _confirmed(sv)
            before = (await sv.store.snapshot("BUG-20")).generation
            builder = HypothesisBuilder(sv.store, sv.gateway, _policy(initial_budget=40))
            result = await builder.build("BUG-20", pkg)
            assert (result.status, result.reason) == ("COMPLETED", "completed"), result
            assert result.phase == "GENERATING_HYPOTHESES"
            assert result.package_generation == before + 3
            snap = await sv.store.snapshot("BUG-20")
            m = snap.manifest
            assert m.phase == "GENERATING_HYPOTHESES" and m.package_id == pkg
            assert {k: m.pointers[k] for k in ("hypothesis_policy", "hypothesis_context",
                                                "hypotheses", "hypothesis_registry",
                                                "hypotheses_summary")} == {
                "hypothesis_policy": H + "policy.json", "hypothesis_context": H + "context.json",
                "hypotheses": H + "hypotheses.json", "hypothesis_registry": H + "registry.json",
                "hypotheses_summary": H + "hypotheses.md"}
            body = await snap.read(H + "hypotheses.json")
            doc = json.loads(body)
            registry = json.loads(await snap.read(H + "registry.json"))
        assert doc["budget_accounting"] == "not_started" and doc["analysis_revision"] == 1
        records = doc["hypotheses"]
        assert [r["id"] for r in records] == ["H1", "H2", "H3"]
        assert [r["budget_allocation"]["initial"] for r in records] == [40, 40, 40]
        assert (registry["max_hypotheses"], registry["created_count"],
                registry["remaining_slots"], registry["next_id"]) == (5, 3, 2, "H4")
        for i, creation in enumerate(registry["creations"]):
            assert creation["origin"]["artifact"] == H + "hypotheses.json"
            assert creation["origin"]["sha256"] == hashlib.sha256(body).hexdigest()
            assert creation["origin"]["pointer"] == f"/hypotheses/{i}"
            assert records[i]["id"] == creation["id"]
            assert creation["budget_allocation"] == records[i]["budget_allocation"]
        assert sum(c["budget_allocation"]["initial"] for c in registry["creations"]) == 3 * 40
        _verify(tmp_path / "s")

    async def test_the_context_holds_no_raw_payloads(self, tmp_path: Path,
                                                     server: LoopbackServer) -> None:
        """The model gets the catalogue, the statements as I aliases with pointers and the
        frozen policy; never the archives' contents or the report's raw text."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            context = await (await sv.store.snapshot("BUG-20")).read(H + "context.json")
        doc = json.loads(context)
        assert doc["untrusted_case_data"]["interpretation"][8]["alias"] == "I9"
        assert doc["untrusted_case_data"]["interpretation"][8]["pointer"] == "/statements/8"
        assert doc["policy"]["min_hypotheses"] == 3
        assert b"groupGUID = \\\"Party-3676" not in context  # a log line's raw content
        assert b"Client 11.0.5 (57212)" not in context        # the report's raw text
        sent = next(r for r in server.requests if r.prompt_id == "hypotheses_v1")
        assert json.loads(sent.body)["messages"][1]["content"] == context.decode()


class TestPreconditions:
    async def test_an_unconfirmed_interpretation_generates_nothing(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = (await intake_sample(sv.store)).package_id
            builder = HypothesisBuilder(sv.store, sv.gateway, _policy())
            r = await builder.build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "interpretation_not_confirmed")
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            r = await builder.build("BUG-20", pkg)
            assert r.reason == "interpretation_not_confirmed"
            assert _calls(server, "interpretation_v1") == 1  # never started silently
            snap = await sv.store.snapshot("BUG-20")
            assert not [p for p in snap.manifest.files if p.startswith("analysis/hypotheses/")]
        assert _calls(server) == 0

    async def test_a_binding_that_does_not_verify_is_a_mismatch(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A confirmation whose hash does not bind the interpretation (as a crafted package
        would carry): interpretation_mismatch, nothing generated."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = (await intake_sample(sv.store)).package_id
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            snap = await sv.store.snapshot("BUG-20")
            forged = json.dumps({"analysis_revision": 1, "interpretation_sha256": "0" * 64,
                                 "confirmed_by": "x"}).encode()
            await snap.publish(Change(files={
                "analysis/interpretation/0001/confirmation.json": BytesSource.of(forged)}))
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "interpretation_mismatch"), r
        assert _calls(server) == 0

    async def test_an_edit_after_a_remembered_check_is_checked_again(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """interpretation_problems is remembered per package by what it read
        (engine/_phases/_memo.py). Once it passed for this package in this process, a
        generation that changes nothing it read gets the kept answer, and one that edits
        a file it read is checked again, not answered from memory."""
        from engine import PackageView, interpretation_problems
        from engine._phases._memo import MEMO

        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            snap = await sv.store.snapshot("BUG-20")

            def problems(s: Any) -> list[str]:
                return interpretation_problems(
                    PackageView(s.manifest, sv.store.store.read_blob), 1)

            assert problems(snap) == []
            hits = MEMO.hits
            unrelated = await snap.publish(Change(files={
                "notes/unrelated.txt": BytesSource.of(b"a note")}))
            assert problems(unrelated) == [] and MEMO.hits == hits + 1
            # analysis files are write-once; a raw input added later is what changes here
            edited = await unrelated.publish(Change(files={
                "inputs/added-later.txt": BytesSource.of(b"another input")}))
            found = problems(edited)
            assert any("raw inputs" in p for p in found), found
            assert MEMO.hits == hits + 1

    @pytest.mark.parametrize("human_cited_by", ["nothing", "an assumption"])
    async def test_missing_observations(self, tmp_path: Path, server: LoopbackServer,
                                        human_cited_by: str) -> None:
        """An interpretation whose grounded statements cite no human source: nothing to
        ground a hypothesis in. An assumption citing the report is not grounded."""
        only_logs = {"summary": "A Lua error.", "missing_observations": [],
                     "statements": [{"kind": "technical_fact", "text": "The log shows it.",
                                     "source_ids": ["S7"]},
                                    {"kind": "assumption", "text": "It is the migration.",
                                     "source_ids": [] if human_cited_by == "nothing"
                                     else ["S1"]}]}
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv, interpretation=only_logs, server=server)
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "missing_observations")
        assert _calls(server) == 0

    async def test_case_and_package_must_belong_together(self, tmp_path: Path,
                                                         server: LoopbackServer) -> None:
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await _confirmed(sv)
            with pytest.raises(PhaseRefused) as info:
                await HypothesisBuilder(sv.store, sv.gateway, _policy()).build(
                    "BUG-20", "00000000-0000-0000-0000-000000000000")
            assert info.value.reason == "package_mismatch"
        assert _calls(server) == 0


class TestOneBatchPerRevision:
    async def test_pinned_policy_and_reuse(self, tmp_path: Path,
                                           server: LoopbackServer) -> None:
        """An invalid answer under a pinned policy; a changed count or budget is refused
        (policy_changed, nothing reset); a new attempt id under the same policy completes;
        afterwards any config or attempt id reuses the batch: no second batch, no refill."""
        server.answers["hypotheses_v1"] = json.dumps({"hypotheses": HYP_ANSWER["hypotheses"]
                                                      + HYP_ANSWER["hypotheses"]})
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            first = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (first.status, first.reason) == ("ERROR", "invalid_answer")
            snap = await sv.store.snapshot("BUG-20")
            assert not snap.has(H + "registry.json") and not snap.has(H + "hypotheses.json")
            for changed in (_policy(max_hypotheses=6), _policy(initial_budget=1000),
                            _policy(min_hypotheses=2)):
                r = await HypothesisBuilder(sv.store, sv.gateway, changed).build(
                    "BUG-20", pkg, attempt_id="second")
                assert (r.status, r.reason) == ("ERROR", "policy_changed"), r
            assert _calls(server) == 1
            server.answers["hypotheses_v1"] = json.dumps(HYP_ANSWER)
            builder = HypothesisBuilder(sv.store, sv.gateway, _policy())
            again = await builder.build("BUG-20", pkg)
            assert again.reason == "attempt_rejected" and _calls(server) == 1
            done = await builder.build("BUG-20", pkg, attempt_id="second")
            assert (done.status, done.reason) == ("COMPLETED", "completed")
            registry = (await sv.store.snapshot("BUG-20")).manifest.files[H + "registry.json"]
            for later, attempt in ((_policy(initial_budget=5), "third"),
                                   (_policy(max_hypotheses=9), "default")):
                r = await HypothesisBuilder(sv.store, sv.gateway, later).build(
                    "BUG-20", pkg, attempt_id=attempt)
                assert (r.status, r.reason) == ("COMPLETED", "completed")
            snap = await sv.store.snapshot("BUG-20")
            assert snap.manifest.files[H + "registry.json"] == registry
            assert sum(p.endswith("/registry.json") for p in snap.manifest.files) == 1
        assert _calls(server) == 2

    async def test_rounds_and_blocking_in_the_hypothesis_phase(
            self, tmp_path: Path, autojump_clock: trio.abc.Clock,
            server: LoopbackServer) -> None:
        """The same ten-round policy (here three), persisted due times and an explicit
        block; the events name GENERATING_HYPOTHESES as the phase."""
        events: list[dict[str, Any]] = []
        up = http_provider("up", "openai", server.openai_url)
        async with services(tmp_path / "s", [up], clock=TrioClock()) as sv:
            pkg = await _confirmed(sv)
        down = http_provider("down", "openai", f"http://127.0.0.1:{dead_port()}/v1")
        policy = attrs.evolve(_policy(), retry=attrs.evolve(_policy().retry, max_rounds=3))
        async with services(tmp_path / "s", [down], clock=TrioClock(), events=events) as sv:
            builder = HypothesisBuilder(sv.store, sv.gateway, policy, clock=sv.clock,
                                        events=sv.events)
            seen = []
            for _ in range(3):
                r = await builder.build("BUG-20", pkg)
                seen.append((r.status, r.reason, r.round))
                await trio.sleep(4000)
            assert seen == [("RETRY_PENDING", "providers_unavailable", 1),
                            ("RETRY_PENDING", "providers_unavailable", 2),
                            ("BLOCKED", "rounds_exhausted", 3)]
        phases = {e["phase"] for e in events}
        assert phases == {"GENERATING_HYPOTHESES"}


class TestPortableReplay:
    async def test_export_import_reuses_the_batch(self, tmp_path: Path,
                                                  server: LoopbackServer) -> None:
        """A completed case exported and imported elsewhere: the builder there reuses the
        batch (no model call), with identical hashes."""
        async with services(tmp_path / "a", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            original = await package_files(sv.store, "BUG-20")
        assert run_viano("export", "--store", tmp_path / "a", "BUG-20",
                         tmp_path / "x.zip").returncode == 0
        assert run_viano("import", "--store", tmp_path / "b", tmp_path / "x.zip").returncode == 0
        calls = len(server.requests)
        async with services(tmp_path / "b", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy(initial_budget=7)).build(
                "BUG-20", pkg, attempt_id="elsewhere")
            assert (r.status, r.reason) == ("COMPLETED", "completed")
            assert await package_files(sv.store, "BUG-20") == original
        assert len(server.requests) == calls
        _verify(tmp_path / "b")


class TestReopening:
    async def test_a_new_revision_gets_a_fresh_batch_and_keeps_the_old(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            before = await package_files(sv.store, "BUG-20")
            await case_operation(sv.store, "BUG-20",
                                 lambda v: reopen_change(v, "new SavedVariables", "qa"))
            builder = HypothesisBuilder(sv.store, sv.gateway, _policy(initial_budget=60))
            r = await builder.build("BUG-20", pkg)
            assert r.reason == "interpretation_not_confirmed" and r.analysis_revision == 2
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))
            r = await builder.build("BUG-20", pkg)
            assert (r.status, r.analysis_revision) == ("COMPLETED", 2)
            after = await package_files(sv.store, "BUG-20")
            snap = await sv.store.snapshot("BUG-20")
            context = json.loads(await snap.read("analysis/hypotheses/0002/context.json"))
        assert all(after[p] == data for p, data in before.items())  # byte for byte
        new = json.loads(after["analysis/hypotheses/0002/hypotheses.json"])
        old = json.loads(after[H + "hypotheses.json"])
        assert [h["id"] for h in new["hypotheses"]] == ["H1", "H2", "H3"]
        assert {h["budget_allocation"]["initial"] for h in new["hypotheses"]} == {60}
        assert {h["budget_allocation"]["initial"] for h in old["hypotheses"]} == {100}
        prior = context["untrusted_case_data"]["prior_initial_proposals"]
        assert [(p["analysis_revision"], p["label"]) for p in prior] == [
            (1, "untested initial proposals")]
        assert [h["id"] for h in prior[0]["hypotheses"]] == ["H1", "H2", "H3"]
        _verify(tmp_path / "s")

    async def test_too_many_prior_revisions_is_limit_exceeded(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """History is never truncated: past max_prior_generations, limit_exceeded."""
        small = _policy(limits=attrs.evolve(HypothesisPolicy().limits, max_prior_generations=1))
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            for _ in range(2):
                assert (await HypothesisBuilder(sv.store, sv.gateway, small).build(
                    "BUG-20", pkg)).status == "COMPLETED"
                await case_operation(sv.store, "BUG-20",
                                     lambda v: reopen_change(v, "again", "qa"))
                await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
                await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))
            r = await HypothesisBuilder(sv.store, sv.gateway, small).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "limit_exceeded"), r


CRASHES = [(p, 1) for p in ("phase.entered", "phase.answered", "phase.recorded",
                            "phase.judged")] + [
    (p, n) for p in ("txn.before_commit", "txn.after_commit") for n in (1, 2, 3)]


class TestCrashRecovery:
    @pytest.mark.parametrize(("point", "nth"), CRASHES)
    async def test_each_step(self, tmp_path: Path, server: LoopbackServer, point: str,
                             nth: int) -> None:
        """A crash at each step of the hypothesis dispatch: the next one finishes with one
        batch and one allocation per hypothesis; no model call after the checkpoint."""
        provider = [http_provider("p", "openai", server.openai_url)]
        async with services(tmp_path / "s", provider) as sv:
            pkg = await _confirmed(sv)
        with pytest.RaisesGroup(SimulatedCrash, allow_unwrapped=True, flatten_subgroups=True):
            async with services(tmp_path / "s", provider) as sv:
                arm_crash_point(point, nth)
                await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
        async with open_store(tmp_path / "s") as store:
            checkpointed = any(p.startswith(H + "rounds/") and p.endswith(".answer.json")
                               for p in (await store.snapshot("BUG-20")).manifest.files)
        calls = _calls(server)
        async with services(tmp_path / "s", provider) as sv:
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert r.status == "COMPLETED", r
            snap = await sv.store.snapshot("BUG-20")
            registry = json.loads(await snap.read(H + "registry.json"))
        assert registry["created_count"] == 3 and len(registry["creations"]) == 3
        assert sum(p.endswith("/registry.json") for p in snap.manifest.files) == 1
        if checkpointed:
            assert _calls(server) == calls
        _verify(tmp_path / "s")


class TestConcurrentChanges:
    async def test_two_builders_at_once(self, tmp_path: Path, nursery: trio.Nursery) -> None:
        srv = LoopbackServer()
        srv.answers["interpretation_v1"] = json.dumps(INTERPRETATION_ANSWER)
        srv.answers["hypotheses_v1"] = json.dumps(HYP_ANSWER)
        await nursery.start(srv.serve)
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           srv.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            srv.default_mode = "held"
            results = []

            async def build() -> None:
                results.append(await HypothesisBuilder(sv.store, sv.gateway, _policy()).build(
                    "BUG-20", pkg))

            async with trio.open_nursery() as inner:
                inner.start_soon(build)
                while srv.held < 1:
                    await trio.testing.wait_all_tasks_blocked()
                second = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build(
                    "BUG-20", pkg)
                assert (second.status, second.reason) == ("DEFERRED", "locked")
                assert second.phase == "GENERATING_HYPOTHESES"  # the phase it was refused
                srv.release.set()
            assert results[0].status == "COMPLETED"
            snap = await sv.store.snapshot("BUG-20")
            assert sum(p.endswith("/hypotheses.json") for p in snap.manifest.files) == 1


class TestTamperResistance:
    async def test_declared_artifacts_without_history(self, tmp_path: Path,
                                                      server: LoopbackServer) -> None:
        """A registry (or records) declared with no creation history behind it:
        unsupported_history, no model call, no fresh allocation."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            snap = await sv.store.snapshot("BUG-20")
            fake = json.dumps({"analysis_revision": 1, "max_hypotheses": 5,
                               "created_count": 0, "creations": []}).encode()
            await snap.publish(Change(files={H + "registry.json": BytesSource.of(fake)}))
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "unsupported_history"), r
            snap = await sv.store.snapshot("BUG-20")
            assert not snap.has(H + "hypotheses.json")
        assert _calls(server) == 0

    async def test_terminal_status_markers_do_not_fake_or_undo_a_batch(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A marker file and a durable status of COMPLETED before the batch: the builder
        still generates exactly one; a marker of failure after it: the batch is reused."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            snap = await sv.store.snapshot("BUG-20")
            snap = await snap.publish(Change(files={H + "COMPLETED": BytesSource.of(b"done"),
                                                    "notes/status.json": BytesSource.of(
                                                        b'{"status": "COMPLETED"}')}))
            await snap.set_status(CaseStatus(status="COMPLETED", phase="GENERATING_HYPOTHESES"))
            builder = HypothesisBuilder(sv.store, sv.gateway, _policy())
            r = await builder.build("BUG-20", pkg)
            assert r.status == "COMPLETED" and _calls(server) == 1, r
            snap = await sv.store.snapshot("BUG-20")
            await snap.publish(Change(files={H + "REJECTED": BytesSource.of(b"x")}))
            await (await sv.store.snapshot("BUG-20")).set_status(CaseStatus(
                status="ERROR", phase="GENERATING_HYPOTHESES", reason="invalid_answer"))
            r = await builder.build("BUG-20", pkg, attempt_id="again")
            assert (r.status, r.reason) == ("COMPLETED", "completed")
        assert _calls(server) == 1

    async def test_a_repointed_pointer_does_not_reopen_the_batch(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Pointers cannot be removed; pointing one elsewhere neither hides the batch from
        the builder nor passes verify."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            snap = await sv.store.snapshot("BUG-20")
            await snap.publish(Change(files={"notes/empty.json": BytesSource.of(b"{}")},
                                      pointers={"hypotheses": "notes/empty.json",
                                                "hypothesis_registry": "notes/empty.json"}))
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "unsupported_history"), r
            assert _calls(server) == 1
        check = open_ro(tmp_path / "s")
        report = verify_store(check, checks=PHASE_CHECKS)
        check.close()
        assert any("pointer hypotheses" in v.what for v in report.violations)

    async def test_a_batch_the_first_release_accepted_still_verifies(
            self, tmp_path: Path, server: LoopbackServer,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Near-duplicate titles (one with a U+FE0F the first release's normaliser kept)
        are refused now, but a batch that release accepted stays valid: verify judges it
        by that release's rule, not today's."""
        import engine._phases._hypotheses as hyp

        answer = json.loads(json.dumps(HYP_ANSWER))
        answer["hypotheses"][2]["title"] = answer["hypotheses"][0]["title"].replace(
            " ", " \ufe0f", 1)
        server.answers["hypotheses_v1"] = json.dumps(answer)
        real = hyp.normalized
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            with monkeypatch.context() as m:  # the first release's builder
                m.setattr(hyp, "normalized", lambda text, legacy=False: real(text, legacy=True))
                r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20",
                                                                                  pkg)
            assert r.status == "COMPLETED", r
        check = open_ro(tmp_path / "s")
        report = verify_store(check, checks=PHASE_CHECKS)
        check.close()
        assert report.ok, report.violations
        async with services(tmp_path / "t", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "invalid_answer"), r
            assert "duplicate_title" in r.message

    @pytest.mark.parametrize("forged", ["no record", "a stray record"])
    async def test_a_revision_raised_without_a_reopen_gets_no_second_batch(
            self, tmp_path: Path, server: LoopbackServer, forged: str) -> None:
        """A generation published through the store's API that only raises the revision
        (no reopen, so no record, or a record where reopen never writes one) is refused by
        both phases before any model call (unsupported_history): it got a new
        interpretation, a second batch and another allocation, and only verify saw it."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert r.status == "COMPLETED" and _calls(server) == 1, r
            calls = len(server.requests)
            snap = await sv.store.snapshot("BUG-20")
            files = {} if forged == "no record" else {
                "analysis/revisions/0003.json": BytesSource.of(b"{}")}
            await snap.publish(Change(files=files, analysis_revision=2))
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason) == ("ERROR", "unsupported_history"), r
            assert "revision" in r.message
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "unsupported_history"), r
            assert len(server.requests) == calls
            snap = await sv.store.snapshot("BUG-20")
            assert not snap.has("analysis/hypotheses/0002/registry.json")
            assert not snap.has("analysis/interpretation/0002/policy.json")

    @pytest.mark.parametrize("edit", ["registry", "budget unit"])
    async def test_an_imported_history_whose_batch_was_edited(
            self, tmp_path: Path, server: LoopbackServer, edit: str) -> None:
        """An export whose batch generation carries a registry the answer does not give,
        or whose pinned policy counts its budget in another unit (hashes all recomputed,
        so the store's own rules accept it): the builder says unsupported_history and
        verify reports it; nothing is regenerated."""
        async with services(tmp_path / "a", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            pkg = await _confirmed(sv)
            await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
        assert run_viano("export", "--store", tmp_path / "a", "BUG-20",
                         tmp_path / "x.zip").returncode == 0
        edited = _edit_registry(tmp_path / "x.zip", tmp_path / "edited.zip") \
            if edit == "registry" else rewrite_export(
                tmp_path / "x.zip", tmp_path / "edited.zip", [(H + "policy.json", json_edit(
                    lambda doc, _sha: doc["policy"].update(budget_unit="dollars")))])
        import_refused_then_placed(edited, tmp_path / "b", run_viano)
        calls = _calls(server)
        async with services(tmp_path / "b", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert (r.status, r.reason) == ("ERROR", "unsupported_history"), r
        assert _calls(server) == calls
        check = open_ro(tmp_path / "b")
        assert not verify_store(check, checks=PHASE_CHECKS).ok
        check.close()


def _edit_registry(src: Path, dest: Path) -> Path:
    """The registry refilled (remaining_slots back to 5), every hash recomputed."""
    return rewrite_export(src, dest, [(H + "registry.json", json_edit(
        lambda doc, _sha: doc.update(remaining_slots=5)))])


class TestPromptAndSchema:
    def test_the_prompt_states_every_rule(self) -> None:
        from engine import load_prompt
        from engine._phases._hypotheses import FIELDS

        text = load_prompt("hypotheses_v1").text
        for needle in (*FIELDS, "first_known_divergence", "failure_stage", "reported_behavior",
                       "human", "ids", "priorities", "statuses", "confidence", "budgets",
                       "patches", "tool requests", "same title", "falsif", "untested",
                       "untrusted_case_data", "min_hypotheses", "max_hypotheses",
                       "EXAMPLE"):
            assert needle in text, needle

    def test_the_schema_uses_only_features_every_server_supports(self) -> None:
        from engine._phases._hypotheses import SCHEMA
        from engine._phases._interpretation import SCHEMA as INTERP

        allowed = {"type", "properties", "required", "additionalProperties", "items", "enum"}

        def keywords(node: Any) -> set[str]:
            if isinstance(node, dict):
                found = set(node) - {"properties"} if "type" in node else set()
                for key, value in node.items():
                    if key == "properties":
                        for sub in value.values():
                            found |= keywords(sub)
                    elif isinstance(value, dict | list):
                        found |= keywords(value)
                return found
            if isinstance(node, list):
                return set().union(*(keywords(x) for x in node)) if node else set()
            return set()

        for schema in (SCHEMA, INTERP):
            assert keywords(schema) <= allowed, keywords(schema) - allowed

    def test_released_prompts_never_change(self) -> None:
        """A released prompt is frozen: a new text needs a new version."""
        from engine import load_prompt

        assert {p: load_prompt(p).sha256 for p in ("interpretation_v1", "hypotheses_v1")} == \
            RELEASED


RELEASED = {
    "interpretation_v1": "8eedf596e5f21588dc40a7438d400460e4ec03e3b96593c9520e6deebf8db506",
    "hypotheses_v1": "481a8e5d76ddba7935da678065bc8b8e038d05062277c7cca4f4c934b1aa4723"}


class TestTheSampleRegression:
    async def test_bug20_end_to_end_preserves_everything(self, tmp_path: Path) -> None:
        """The sample's diagnostics and source archives: intake, interpretation,
        confirmation and hypotheses with the fixture provider; every earlier generation and
        both archives stay byte for byte."""
        from tests.phase_helpers import SAMPLE, fixture_provider

        async with services(tmp_path / "s", [fixture_provider()]) as sv:
            pkg = await _confirmed(sv)
            before = [(g.generation, g.manifest_sha256, g.manifest)
                      for g in sv.store.store.generations(pkg)]
            r = await HypothesisBuilder(sv.store, sv.gateway, _policy()).build("BUG-20", pkg)
            assert r.status == "COMPLETED"
            after = [(g.generation, g.manifest_sha256, g.manifest)
                     for g in sv.store.store.generations(pkg)]
            files = await package_files(sv.store, "BUG-20")
        assert after[:len(before)] == before
        for name in ("wowdiag.zip", "wowsrc.zip", "report.json"):
            assert files[f"inputs/{name}"] == (SAMPLE / name).read_bytes()
        md = files[H + "hypotheses.md"].decode()
        for h in ("## H1:", "## H2:", "## H3:", "**Mechanism.**", "**Expected evidence:**",
                  "**Falsifying evidence:**",
                  # The spec: each is a candidate, never a confirmed root cause.
                  "Untested, competing candidate causes", "None is a confirmed root cause."):
            assert h in md
        _verify(tmp_path / "s")
