"""The case actor and the durable phase runner, proven on interpretation, in-process over
the real httpx adapters and the loopback server: the three generations, invalid answers,
attempts, pinned policy, the round policy in virtual time, unblocking, concurrency,
cancellation at every await, and crash points."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors import TrioClock, case_operation, dispatch_phase, open_store
from engine import (
    INTERPRETATION,
    CaseStatus,
    Change,
    Config,
    InterpretationLimits,
    InterpretationPolicy,
    SimulatedCrash,
    StaleGeneration,
    arm_crash_point,
    confirm_change,
    unblock_change,
    verify_store,
)
from tests.loopback import LoopbackServer, dead_port
from tests.phase_helpers import (
    INTERPRETATION_ANSWER,
    KEY,
    fixture_provider,
    http_provider,
    intake_sample,
    interpretation_request,
    normalized_package,
    package_files,
    services,
)
from tests.store_helpers import open_ro

pytestmark = pytest.mark.usefixtures("backend")

PREFIX = "analysis/interpretation/0001/"
ANSWER = json.dumps(INTERPRETATION_ANSWER)


@pytest.fixture
async def server(nursery: trio.Nursery) -> LoopbackServer:
    srv = LoopbackServer(retry_after="0")
    srv.answers["interpretation_v1"] = ANSWER
    await nursery.start(srv.serve)
    return srv


def _calls(srv: LoopbackServer) -> int:
    return sum(r.prompt_id == "interpretation_v1" for r in srv.requests)


class TestThreeGenerations:
    @pytest.mark.parametrize("kind", ["openai", "anthropic"])
    async def test_the_normal_path(self, tmp_path: Path, server: LoopbackServer,
                                   kind: str) -> None:
        """Enter, round, accept: three generations; the result is COMPLETED awaiting
        confirmation; the round record names what was sent, to whom, and what came back;
        a second dispatch reuses the result and calls nobody."""
        url = server.openai_url if kind == "openai" else server.anthropic_url
        async with services(tmp_path / "s", [http_provider("p1", kind, url)]) as sv:
            await intake_sample(sv.store)
            result = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                          interpretation_request())
            assert (result.status, result.reason) == ("COMPLETED", "awaiting_confirmation")
            assert result.package_generation == 4 and result.round == 1
            snap = await sv.store.snapshot("BUG-20")
            m = snap.manifest
            assert m.phase == "INTERPRETING_CASE"
            assert {p for p in m.files if p.startswith(PREFIX)} >= {
                PREFIX + "policy.json", PREFIX + "context.json",
                PREFIX + "rounds/0001-0001.answer.json", PREFIX + "interpretation.json",
                PREFIX + "summary.md"}
            record = json.loads(await snap.read(PREFIX + "rounds/0001-0001.answer.json"))
            attempt = record["attempts"][0]
            assert attempt["provider"] == "p1" and attempt["status"] == 200
            assert record["answer"]["content"] == ANSWER
            body = await snap.read(attempt["request_body"]["path"])
            assert body == server.requests[-1].body  # exactly what was sent
            assert json.loads(body)["model"] == "loopback-model"
            assert KEY not in json.dumps(record) and KEY.encode() not in body
            again = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request(attempt_id="other"))
            assert (again.status, again.reason) == ("COMPLETED", "completed")
            assert again.package_generation == 4 and _calls(server) == 1
            status = (await sv.store.case("BUG-20")).status
            assert status is not None and status.status == "COMPLETED"

    async def test_the_interpretation_artifacts(self, tmp_path: Path,
                                                server: LoopbackServer) -> None:
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            snap = await sv.store.snapshot("BUG-20")
            doc = json.loads(await snap.read(PREFIX + "interpretation.json"))
            assert [s["alias"] for s in doc["statements"]][:2] == ["I1", "I2"]
            b = doc["bindings"]
            assert b["inputs"] == {p: snap.manifest.files[p].sha256 for p in snap.manifest.files
                                   if p.startswith("inputs/")}
            assert b["summary"]["sha256"] == snap.manifest.files[PREFIX + "summary.md"].sha256
            assert snap.manifest.pointers["interpretation"] == PREFIX + "interpretation.json"
        check = open_ro(tmp_path / "s")
        from engine import PHASE_CHECKS

        assert verify_store(check, checks=PHASE_CHECKS).ok
        check.close()


INVALID_CONTENT = {
    "extra key": json.dumps({**INTERPRETATION_ANSWER, "confidence": 0.9}),
    "'S1' for ['S1']": json.dumps({**INTERPRETATION_ANSWER, "statements": [
        {"kind": "observation", "text": "x", "source_ids": "S1"}]}),
    "unknown source": json.dumps({**INTERPRETATION_ANSWER, "statements": [
        {"kind": "observation", "text": "x", "source_ids": ["S77"]}]}),
    "two divergences": json.dumps({**INTERPRETATION_ANSWER, "statements": [
        {"kind": "first_known_divergence", "text": "a", "source_ids": ["S1"]},
        {"kind": "first_known_divergence", "text": "b", "source_ids": ["S2"]}]}),
    "blank string": json.dumps({**INTERPRETATION_ANSWER, "summary": "  "}),
    "prose around the JSON": "Sure! Here you go: " + ANSWER,
    "two objects": ANSWER + "\n" + ANSWER,
    "a list": json.dumps([INTERPRETATION_ANSWER]),
    "deep nesting": '{"summary": ' + "[" * 5000 + "]" * 5000 + "}",
}


class TestInvalidAnswers:
    @pytest.mark.parametrize("kind", ["openai", "anthropic"])
    @pytest.mark.parametrize("label", sorted(INVALID_CONTENT))
    async def test_rejected_atomically(self, tmp_path: Path, server: LoopbackServer,
                                       kind: str, label: str) -> None:
        """ERROR invalid_answer; the round record keeps the raw answer, errors/<attempt-
        hash>.json names each problem, and nothing else of the answer is accepted."""
        server.answers["interpretation_v1"] = INVALID_CONTENT[label]
        url = server.openai_url if kind == "openai" else server.anthropic_url
        async with services(tmp_path / "s", [http_provider("p", kind, url)]) as sv:
            await intake_sample(sv.store)
            result = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                          interpretation_request())
            assert (result.status, result.reason) == ("ERROR", "invalid_answer"), result
            snap = await sv.store.snapshot("BUG-20")
            files = set(snap.manifest.files)
            errors = [p for p in files if p.startswith(PREFIX + "errors/")]
            assert len(errors) == 1
            assert not files & {PREFIX + "interpretation.json", PREFIX + "summary.md"}
            doc = json.loads(await snap.read(errors[0]))
            assert doc["errors"] and all(e["rule"] and "pointer" in e for e in doc["errors"])
            assert errors[0].endswith(f"{doc['attempt_hash']}.json")
            assert "interpretation" not in snap.manifest.pointers

    async def test_attempts_after_a_rejection(self, tmp_path: Path,
                                              server: LoopbackServer) -> None:
        """The same attempt id again: attempt_rejected with no model call; a new one asks
        again under the same pinned policy; a changed policy meanwhile is policy_changed and
        resets nothing."""
        server.answers["interpretation_v1"] = INVALID_CONTENT["extra key"]
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            first = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert first.reason == "invalid_answer" and _calls(server) == 1
            same = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (same.status, same.reason) == ("ERROR", "attempt_rejected")
            assert _calls(server) == 1 and same.package_generation == first.package_generation
            changed = Config.defaults()
            changed = attrs.evolve(changed, interpretation=InterpretationPolicy(
                limits=InterpretationLimits(max_context_bytes=999_999)))
            moved = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request(changed, attempt_id="2"))
            assert (moved.status, moved.reason) == ("ERROR", "policy_changed")
            assert _calls(server) == 1 and moved.package_generation == first.package_generation
            server.answers["interpretation_v1"] = ANSWER
            fixed = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request(attempt_id="2"))
            assert (fixed.status, fixed.reason) == ("COMPLETED", "awaiting_confirmation")
            assert _calls(server) == 2 and fixed.round == 2
            snap = await sv.store.snapshot("BUG-20")
            rounds = sorted(p for p in snap.manifest.files if "/rounds/" in p)
            assert [p.rsplit("/", 1)[1] for p in rounds] == ["0001-0001.answer.json",
                                                             "0001-0002.answer.json"]

    async def test_a_bug_in_the_validator_is_an_internal_error(
            self, tmp_path: Path, server: LoopbackServer,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """A check that crashes is our fault: the dispatch fails loudly, nothing of the
        answer is judged (no errors file), and it is not the model's invalid_answer."""
        import engine._phases._interpretation as interp

        def broken(answer: Any, case: Any) -> list[Any]:
            raise KeyError("a bug in the check")

        monkeypatch.setattr(interp, "validate_interpretation", broken)
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            with pytest.raises(KeyError):
                await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            snap = await sv.store.snapshot("BUG-20")
            assert not [p for p in snap.manifest.files if "/errors/" in p]
            assert PREFIX + "rounds/0001-0001.answer.json" in snap.manifest.files


class TestRounds:
    async def test_the_round_policy_in_virtual_time(self, tmp_path: Path,
                                                    autojump_clock: trio.abc.Clock,
                                                    server: LoopbackServer) -> None:
        """Unavailable rounds get exponential due times; a dispatch before its due time is
        DEFERRED not_due and calls nobody; the max_rounds-th failure is BLOCKED, durable
        until unblock; then a new series succeeds."""
        events: list[dict[str, Any]] = []
        clock = TrioClock()
        down = http_provider("down", "openai", f"http://127.0.0.1:{dead_port()}/v1")
        req = interpretation_request(max_rounds=3, base_delay_s=30)
        async with services(tmp_path / "s", [down], clock=clock, events=events) as sv:
            await intake_sample(sv.store)
            r1 = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (r1.status, r1.reason, r1.round, r1.max_rounds) == (
                "RETRY_PENDING", "providers_unavailable", 1, 3)
            assert r1.due_at == pytest.approx(clock.now() + 30, abs=1)
            early = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (early.status, early.reason) == ("DEFERRED", "not_due")
            assert early.package_generation == r1.package_generation
            await trio.sleep(31)
            r2 = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (r2.status, r2.round) == ("RETRY_PENDING", 2)
            assert r2.due_at == pytest.approx(clock.now() + 60, abs=1)  # doubled
            await trio.sleep(59)
            assert (await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)).reason == "not_due"
            await trio.sleep(2)
            r3 = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (r3.status, r3.reason, r3.round) == ("BLOCKED", "rounds_exhausted", 3)
            await trio.sleep(10_000)
            still = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (still.status, still.reason) == ("BLOCKED", "rounds_exhausted")
            status = (await sv.store.case("BUG-20")).status
            assert status is not None and status.status == "BLOCKED"

            await case_operation(sv.store, "BUG-20",
                                 lambda view: unblock_change(view, INTERPRETATION, "qa"))
        up = http_provider("up", "openai", server.openai_url)
        async with services(tmp_path / "s", [down, up], clock=clock) as sv:
            done = await dispatch_phase(sv, INTERPRETATION, "BUG-20", req)
            assert (done.status, done.reason) == ("COMPLETED", "awaiting_confirmation")
            assert done.round == 1  # the first round of series 2
            snap = await sv.store.snapshot("BUG-20")
            assert PREFIX + "unblocks/0002.json" in snap.manifest.files
            unblock = json.loads(await snap.read(PREFIX + "unblocks/0002.json"))
            assert unblock["unblocked_by"] == "qa" and unblock["after_rounds"] == 3
        steps = [e["step"] for e in events if e["event"] == "step"]
        assert steps[:2] == ["enter", "round"]

    async def test_provider_configuration_is_an_error_without_retries(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Every provider refusing the request (401) is ERROR provider_configuration with no
        due time; a later dispatch (after fixing the configuration) asks again."""
        server.push("401")
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason, r.due_at) == ("ERROR", "provider_configuration", None)
            again = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert again.status == "COMPLETED" and again.round == 2

    async def test_the_at_least_once_count_is_durable(self, tmp_path: Path,
                                                      server: LoopbackServer) -> None:
        """A call whose dispatch died before the round was recorded is counted: the round
        record of the call that is recorded says it was the second."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            arm_crash_point("phase.answered")
            with pytest.raises(SimulatedCrash):
                await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert _calls(server) == 1
            done = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert done.status == "COMPLETED" and _calls(server) == 2
            snap = await sv.store.snapshot("BUG-20")
            record = json.loads(await snap.read(PREFIX + "rounds/0001-0001.answer.json"))
            assert record["calls_started"] == 2


class TestConcurrency:
    async def test_two_actors_on_one_case(self, tmp_path: Path,
                                          nursery: trio.Nursery) -> None:
        """While one dispatch holds the case (its model call is in flight), another is
        DEFERRED locked at once; there is one accepted interpretation."""
        srv = LoopbackServer(default_mode="held")
        srv.answers["interpretation_v1"] = ANSWER
        await nursery.start(srv.serve)
        results: list[Any] = []
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           srv.openai_url)]) as sv:
            await intake_sample(sv.store)

            async def one() -> None:
                results.append(await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                                    interpretation_request()))

            async with trio.open_nursery() as inner:
                inner.start_soon(one)
                while srv.held < 1:
                    await trio.testing.wait_all_tasks_blocked()
                second = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                              interpretation_request())
                assert (second.status, second.reason) == ("DEFERRED", "locked")
                srv.release.set()
            assert results[0].status == "COMPLETED", results[0]
            snap = await sv.store.snapshot("BUG-20")
            assert sum(p.endswith("interpretation.json") for p in snap.manifest.files) == 1

    async def test_a_stale_generation_is_deferred_and_replayed(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """Another writer moves the case while the model is asked: the round is not
        published (DEFERRED stale_generation) and the next dispatch replays."""
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            real = sv.gateway.round

            async def meddling(request: Any) -> Any:
                out = await real(request)
                snap = await sv.store.snapshot("BUG-20")
                from engine import BytesSource

                await snap.publish(Change(files={"notes/x.txt": BytesSource.of(b"x")}))
                return out

            sv.gateway.round = meddling  # type: ignore[method-assign]
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason) == ("DEFERRED", "stale_generation")
            sv.gateway.round = real  # type: ignore[method-assign]
            done = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert done.status == "COMPLETED"


class TestCommittedHead:
    async def test_later_steps_start_from_what_the_dispatch_committed(
            self, tmp_path: Path, server: LoopbackServer,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """The first step reads the head; each later one starts from the generation and
        status its own step committed, and that is exactly what the store holds then
        (the manifest and the status, compared at every step with a fresh read)."""
        import actors._case_actor as case_actor

        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            await intake_sample(sv.store)
            backend = sv.store.store
            heads: list[str] = []
            real_head, real_load = backend.head, case_actor.load_state
            compared: list[int] = []

            def counting_head(case_id: str) -> Any:
                heads.append(case_id)
                return real_head(case_id)

            def checked_load(spec: Any, view: Any, status: Any, request: Any) -> Any:
                ref = backend.case("BUG-20")
                assert view.manifest == backend.manifest(ref.package_id, ref.generation)
                assert status == ref.status
                compared.append(view.manifest.package_generation)
                return real_load(spec, view, status, request)

            monkeypatch.setattr(backend, "head", counting_head)
            monkeypatch.setattr(case_actor, "load_state", checked_load)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason) == ("COMPLETED", "awaiting_confirmation"), r
            assert compared == [1, 2, 3]  # enter, round, judge (its result ends it)
            assert heads == ["BUG-20"]
            again = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request())
            assert again.status == "COMPLETED" and heads == ["BUG-20", "BUG-20"]
        assert _calls(server) == 1

    async def test_a_writer_between_steps_is_fenced_and_nothing_is_asked_again(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A writer that ignores the lease moves the case after the round's answer is
        checkpointed and before it is judged: the judgement, decided on the generation
        this dispatch committed, is refused by the store (DEFERRED stale_generation),
        and the next dispatch judges the checkpointed answer without asking again."""
        from engine import BytesSource

        events: list[dict[str, Any]] = []
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)],
                            events=events) as sv:
            await intake_sample(sv.store)
            real = sv.store.run_local
            moved: list[int] = []

            async def meddling(fn: Callable[..., Any], *args: Any) -> Any:
                if getattr(fn, "__name__", "") == "_plan" and not moved and any(
                        e.get("step") == "round" for e in events):
                    snap = await sv.store.snapshot("BUG-20")
                    after = await snap.publish(Change(files={
                        "notes/x.txt": BytesSource.of(b"x")}))
                    moved.append(after.generation)
                return await real(fn, *args)

            sv.store.run_local = meddling  # type: ignore[method-assign]
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (r.status, r.reason) == ("DEFERRED", "stale_generation"), r
            assert moved == [4] and _calls(server) == 1
            sv.store.run_local = real  # type: ignore[method-assign]
            done = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert (done.status, done.reason) == ("COMPLETED", "awaiting_confirmation")
            snap = await sv.store.snapshot("BUG-20")
            assert snap.has("notes/x.txt") and snap.has(PREFIX + "interpretation.json")
        assert _calls(server) == 1


    async def test_a_lease_lost_between_steps_ends_the_dispatch_before_any_model_call(
            self, tmp_path: Path, server: LoopbackServer, backend: str) -> None:
        """On PostgreSQL a worker that stalls past its lease loses the case to another
        host. A later step starts from what this dispatch committed, not from a head read,
        so it must check the lease itself: after the enter step, another host takes the
        case's lease row (and renewal notices), and the dispatch stops with
        ``lease_lost`` before the round, with no model call."""
        if backend != "postgresql":
            pytest.skip("a SQLite lease is this process's own lock: it cannot be lost")
        events: list[dict[str, Any]] = []
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)],
                            events=events) as sv:
            await intake_sample(sv.store)
            leases = sv.store.store.leases  # type: ignore[attr-defined]
            real = sv.store.run_local
            taken: list[str] = []

            async def takeover(fn: Callable[..., Any], *args: Any) -> Any:
                if getattr(fn, "__name__", "") == "_plan" and not taken and any(
                        e.get("step") == "enter" for e in events):
                    with leases.connect() as conn:
                        conn.execute("UPDATE viano_leases SET holder = 'another-host' "
                                     "WHERE case_id = 'BUG-20'")
                    leases.renew()  # what the renewal thread does next
                    taken.append("BUG-20")
                return await real(fn, *args)

            sv.store.run_local = takeover  # type: ignore[method-assign]
            with pytest.raises(StaleGeneration) as lost:
                await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert lost.value.reason == "lease_lost" and taken == ["BUG-20"]
            assert [e.get("step") for e in events if e.get("step")] == ["enter"]
            assert (await sv.store.case("BUG-20")).generation == 2  # intake, enter
        assert _calls(server) == 0


class _Interrupt:
    """Cancels a dispatch at the k-th await of the store or gateway handle it uses."""

    def __init__(self, k: int, scope: trio.CancelScope):
        self.k, self.n, self.scope = k, 0, scope

    async def tick(self) -> None:
        self.n += 1
        if self.n == self.k:
            self.scope.cancel()
            await trio.lowlevel.checkpoint()

    def wrap(self, obj: Any, names: tuple[str, ...]) -> None:
        for name in names:
            real: Callable[..., Any] = getattr(obj, name)

            async def wrapped(*a: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
                await self.tick()
                out = await _real(*a, **kw)
                await self.tick()
                return out

            setattr(obj, name, wrapped)


class TestCancellation:
    async def test_cancelled_at_every_await_the_package_converges(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A dispatch cancelled at its k-th await (for every k a dispatch has) leaves only
        committed generations, and the next dispatch finishes with the same artifacts and
        hashes as an uninterrupted run, apart from timestamps and audit timings."""
        provider = [http_provider("p", "openai", server.openai_url)]
        async with services(tmp_path / "ref", provider) as sv:
            await intake_sample(sv.store)
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            reference = normalized_package(await package_files(sv.store, "BUG-20"))
        k = 1
        while True:
            async with services(tmp_path / f"k{k}", provider) as sv:
                await intake_sample(sv.store)
                handle = sv.store
                with trio.CancelScope() as scope:
                    interrupt = _Interrupt(k, scope)
                    interrupt.wrap(handle, ("head", "snapshot", "submit", "case"))
                    interrupt.wrap(sv.gateway, ("round",))
                    await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request())
                finished = not scope.cancelled_caught
            async with services(tmp_path / f"k{k}", provider) as sv:
                result = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                              interpretation_request())
                assert result.status == "COMPLETED", (k, result)
                got = normalized_package(await package_files(sv.store, "BUG-20"))
            assert got.keys() == reference.keys(), (k, set(got) ^ set(reference))
            for path in got:
                if got[path] != reference[path]:
                    a, b = got[path], reference[path]
                    diff = {key: (a.get(key), b.get(key)) for key in set(a) | set(b)
                            if a.get(key) != b.get(key)} if isinstance(a, dict) else None
                    raise AssertionError((k, path, diff))
            check = open_ro(tmp_path / f"k{k}")
            assert verify_store(check).ok
            check.close()
            if finished:
                break
            k += 1
        assert k > 8  # the dispatch really had that many awaits to cancel at


# Each phase point is hit once per dispatch; a store point once per publication of it
# (enter, round, accept): its 1st, 2nd and 3rd hits are the three generations.
CRASHES = [(p, 1) for p in ("phase.entered", "phase.answered", "phase.recorded",
                            "phase.judged")] + [
    (p, n) for p in ("txn.before_commit", "txn.after_commit") for n in (1, 2, 3)]


class TestCrashPoints:
    @pytest.mark.parametrize(("point", "nth"), CRASHES)
    async def test_a_crash_resumes_from_what_is_durable(self, tmp_path: Path,
                                                        server: LoopbackServer, point: str,
                                                        nth: int) -> None:
        """A crash at each named step (its n-th hit in the dispatch): the next dispatch
        finishes with exactly one accepted interpretation, verify is clean, and no model
        call follows a checkpointed answer."""
        with pytest.RaisesGroup(SimulatedCrash, allow_unwrapped=True, flatten_subgroups=True):
            async with services(tmp_path / "s", [http_provider("p", "openai",
                                                               server.openai_url)]) as sv:
                await intake_sample(sv.store)
                arm_crash_point(point, nth)
                await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
        async with open_store(tmp_path / "s") as store:
            snap = await store.snapshot("BUG-20")
            checkpointed = any(p.endswith(".answer.json") for p in snap.manifest.files)
            before = _calls(server)
        async with services(tmp_path / "s", [http_provider("p", "openai",
                                                           server.openai_url)]) as sv:
            result = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                          interpretation_request())
            assert result.status == "COMPLETED", result
            snap = await sv.store.snapshot("BUG-20")
            assert sum(p.endswith("/interpretation.json") for p in snap.manifest.files) == 1
        if checkpointed:
            assert _calls(server) == before, "a model call followed a checkpointed answer"
        check = open_ro(tmp_path / "s")
        from engine import PHASE_CHECKS

        report = verify_store(check, checks=PHASE_CHECKS)
        assert report.ok, report.violations
        check.close()


    async def test_a_call_never_recorded_is_not_paid_for_for_ever(
            self, tmp_path: Path, server: LoopbackServer) -> None:
        """A process that dies after the model answered and before the record, every time
        (a crash loop, an internal error repeated by each retry): each restart paid for
        the same call again, for ever. After MAX_CALL_STARTS starts the next dispatch
        calls nobody and ends BLOCKED ``calls_unrecorded``, durably (batch and daemon no
        longer offer the case); a dispatch by its id after that tries again, from one."""
        from engine._phases._protocol import MAX_CALL_STARTS

        def provider() -> Any:
            return [http_provider("p", "openai", server.openai_url)]

        async with services(tmp_path / "s", provider()) as sv:
            await intake_sample(sv.store)
        for n in range(1, MAX_CALL_STARTS + 1):
            with pytest.RaisesGroup(SimulatedCrash, allow_unwrapped=True,
                                    flatten_subgroups=True):
                async with services(tmp_path / "s", provider()) as sv:
                    arm_crash_point("phase.answered")
                    await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request())
            assert _calls(server) == n
        async with services(tmp_path / "s", provider()) as sv:
            result = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                          interpretation_request())
            assert (result.status, result.reason, result.round) == (
                "BLOCKED", "calls_unrecorded", 1), result
            assert _calls(server) == MAX_CALL_STARTS  # nobody was called
            ref = await sv.store.case("BUG-20")
            assert ref.status is not None
            assert (ref.status.status, ref.status.reason) == ("BLOCKED", "calls_unrecorded")
            assert [c.case_id for c in sv.store.store.due_cases(1e12, 10)] == []
            from engine import PhaseRefused

            with pytest.raises(PhaseRefused) as info:  # no series is exhausted: it says
                await case_operation(sv.store, "BUG-20",  # what to run instead
                                     lambda v: unblock_change(v, INTERPRETATION, "qa"))
            assert info.value.reason == "not_blocked"
            assert "calls_unrecorded" in str(info.value.hint)
            assert "viano interpret" in str(info.value.hint)
            again = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                         interpretation_request())
            assert (again.status, again.reason) == ("COMPLETED", "awaiting_confirmation")
            assert _calls(server) == MAX_CALL_STARTS + 1
        check = open_ro(tmp_path / "s")
        from engine import PHASE_CHECKS

        report = verify_store(check, checks=PHASE_CHECKS)
        check.close()
        assert report.ok, report.violations


class TestOperations:
    async def test_confirm_binds_the_current_interpretation(self, tmp_path: Path) -> None:
        """Confirmation binds the interpretation's hash and revision; confirming twice
        changes nothing; before an interpretation it is refused."""
        from engine import PhaseRefused

        async with services(tmp_path / "s", [fixture_provider()]) as sv:
            await intake_sample(sv.store)
            with pytest.raises(PhaseRefused) as info:
                await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))
            assert info.value.reason == "no_interpretation"
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            snap = await case_operation(sv.store, "BUG-20", lambda v: confirm_change(v, "qa"))
            assert snap is not None
            conf = json.loads(await snap.read(PREFIX + "confirmation.json"))
            assert conf["interpretation_sha256"] == snap.manifest.files[
                PREFIX + "interpretation.json"].sha256
            assert conf["confirmed_by"] == "qa" and conf["analysis_revision"] == 1
            assert await case_operation(sv.store, "BUG-20",
                                        lambda v: confirm_change(v, "qa")) is None

    async def test_auto_confirm_is_recorded_as_the_policy(self, tmp_path: Path) -> None:
        async with services(tmp_path / "s", [fixture_provider()]) as sv:
            await intake_sample(sv.store)
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20",
                                     interpretation_request(auto_confirm=True))
            assert r.reason == "confirmed"
            snap = await sv.store.snapshot("BUG-20")
            conf = json.loads(await snap.read(PREFIX + "confirmation.json"))
            assert conf["confirmed_by"] == "policy:auto_confirm"

    async def test_reopen_keeps_everything_and_needs_a_new_interpretation(
            self, tmp_path: Path) -> None:
        from engine import reopen_change

        async with services(tmp_path / "s", [fixture_provider()]) as sv:
            await intake_sample(sv.store)
            await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            before = await package_files(sv.store, "BUG-20")
            snap = await case_operation(sv.store, "BUG-20",
                                        lambda v: reopen_change(v, "new logs", "qa"))
            assert snap is not None and snap.manifest.analysis_revision == 2
            after = await package_files(sv.store, "BUG-20")
            assert all(after[p] == data for p, data in before.items())
            r = await dispatch_phase(sv, INTERPRETATION, "BUG-20", interpretation_request())
            assert r.status == "COMPLETED" and r.analysis_revision == 2
            snap = await sv.store.snapshot("BUG-20")
            assert "analysis/interpretation/0002/interpretation.json" in snap.manifest.files
            status = (await sv.store.case("BUG-20")).status
            assert isinstance(status, CaseStatus) and status.status == "COMPLETED"

    async def test_unblock_is_refused_unless_blocked(self, tmp_path: Path) -> None:
        from engine import PhaseRefused

        async with services(tmp_path / "s", [fixture_provider()]) as sv:
            await intake_sample(sv.store)
            with pytest.raises(PhaseRefused) as info:
                await case_operation(sv.store, "BUG-20",
                                     lambda v: unblock_change(v, INTERPRETATION, "qa"))
            assert info.value.reason == "not_blocked"



class TestABigCaseIsPlannedOffTheLoop:
    """A plan derives the case's context, which reads each attachment it excerpts to its end
    (the store's hash check). On SQLite a plan runs on the event loop's thread, so a case
    with big files would hold every other case for as long: such a case (its files over
    ``INLINE_PLAN_BYTES`` together) is planned on a worker thread, a small one still
    inline."""

    async def test_where_the_attachments_are_read(
            self, tmp_path: Path, server: LoopbackServer,
            monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        import engine._phases._case as case_module
        from actors._case_actor import INLINE_PLAN_BYTES
        from engine import Attachment, IntakeLimits, prepare_intake

        on_loop: dict[str, bool] = {}
        read_heads = case_module._read_heads

        def watched(view: Any, *args: Any) -> Any:
            on_loop[view.manifest.case_id] = threading.current_thread() is \
                threading.main_thread()
            return read_heads(view, *args)

        monkeypatch.setattr(case_module, "_read_heads", watched)
        report = tmp_path / "report.txt"
        report.write_text("The worker crashes\nIt loses its queue connection.\n")
        async with services(tmp_path / "s", [http_provider("p1", "openai",
                                                           server.openai_url)]) as sv:
            # A tar.gz far smaller than the bound when stored, which a plan inflates up to
            # its member's head (up to 200 times its size within the limits).
            member = b"".join(b"%08x ERROR lost the queue\n" % (i * 2654435761 % 2**32)
                              for i in range(60_000))
            packed = io.BytesIO()
            with tarfile.open(fileobj=packed, mode="w:gz") as tar:
                info = tarfile.TarInfo("logs/app.log")
                info.size = len(member)
                tar.addfile(info, io.BytesIO(member))
            gz = tmp_path / "diag.tar.gz"
            gz.write_bytes(packed.getvalue())
            assert 200 * gz.stat().st_size > INLINE_PLAN_BYTES > 4 * gz.stat().st_size
            # A small zip of many members, each a chunk's read of it when they are
            # excerpted (their reads may jump between its parts).
            zipped = tmp_path / "many.zip"
            with zipfile.ZipFile(zipped, "w") as z:
                for i in range(100):
                    z.writestr(f"logs/{i:03d}.log", b"ERROR lost the queue\n")
            for case_id, size in (("SMALL-1", 10_000), ("BIG-1", INLINE_PLAN_BYTES + 1),
                                  ("GZ-1", 0), ("ZIP-1", -1)):
                log = tmp_path / f"{case_id}.log"
                log.write_bytes(b"ERROR lost the queue\n" * (size // 21 + 1))
                attached = [Attachment("diagnostics", gz)] if size == 0 else \
                    [Attachment("diagnostics", zipped)] if size < 0 else \
                    [Attachment("attachment", log)]
                await sv.store.intake(prepare_intake(
                    report, attached, case_id=case_id, limits=IntakeLimits()))
                # (the fixture's answer cites the sample case's sources: it is rejected)
                result = await dispatch_phase(sv, INTERPRETATION, case_id,
                                              interpretation_request())
                assert result.package_generation > 1  # entered: its context derived
            inline = not sv.store.store.reads_block
        assert on_loop == {"SMALL-1": inline, "BIG-1": False, "GZ-1": False, "ZIP-1": False}
