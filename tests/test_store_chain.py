"""Property tests of the generation chain: random publications, stale publications, mixed
batches, write-once replacements and concurrent publishers keep every chain linear and
every earlier generation byte-identical."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from actors import open_store
from engine import (
    BytesSource,
    CaseExists,
    Change,
    ChangeRejected,
    Published,
    PublishRequest,
    StaleGeneration,
    new_package_id,
    verify_store,
)
from tests.store_helpers import open_ro, open_rw

pytestmark = pytest.mark.usefixtures("backend")

WRITE_ONCE = ["inputs/a.txt", "inputs/b.log", "case/x.json", "analysis/h/1.json"]
PATHS = st.sampled_from([*WRITE_ONCE, "notes/n.txt", "extra/e.bin"])
CONTENT = st.binary(min_size=0, max_size=64)
PHASES = st.sampled_from(["INTAKE", "INTERPRETING_CASE", "GENERATING_HYPOTHESES"])


class ChainMachine(RuleBasedStateMachine):
    """Drives one store with sequential and batched publications, remembering every
    generation's manifest bytes and file contents as they were acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        # A tiny inline threshold exercises both blob paths (row and fsynced file).
        self.store = open_rw(Path(self.dir.name), inline_threshold=32)
        self.packages: dict[str, str] = {}            # case_id -> package_id
        self.heads: dict[str, int] = {}               # case_id -> generation
        self.history: dict[tuple[str, int], bytes] = {}
        self.contents: dict[str, bytes] = {}          # sha256 -> bytes

    def teardown(self) -> None:
        assert verify_store(self.store).ok
        self.store.close()
        self.dir.cleanup()

    def _request(self, case: str, expected: int | None, files: dict[str, bytes],
                 phase: str | None) -> PublishRequest:
        sources = {p: BytesSource.of(d) for p, d in files.items()}
        for src in sources.values():
            self.contents[src.sha256] = src.data
        pkg = self.packages.get(case) or new_package_id()
        return PublishRequest(pkg, case, expected, Change(files=sources, phase=phase))

    def _record(self, case: str, out: Published) -> None:
        self.packages[case] = out.package_id
        assert out.generation == self.heads.get(case, 0) + 1
        self.heads[case] = out.generation
        self.history[(case, out.generation)] = self.store.manifest(
            out.package_id, out.generation).raw

    @rule(case=st.sampled_from(["A", "B", "C"]), files=st.dictionaries(PATHS, CONTENT),
          phase=PHASES)
    def create(self, case: str, files: dict[str, bytes], phase: str) -> None:
        out = self.store.commit_batch([self._request(case, None, files, phase)])[0]
        if case in self.packages:
            assert isinstance(out, CaseExists)
        else:
            assert isinstance(out, Published)
            self._record(case, out)

    @precondition(lambda self: bool(self.packages))
    @rule(data=st.data(), files=st.dictionaries(PATHS, CONTENT, max_size=3),
          phase=st.none() | PHASES)
    def publish(self, data: st.DataObject, files: dict[str, bytes], phase: str | None) -> None:
        case = data.draw(st.sampled_from(sorted(self.packages)))
        head = self.heads[case]
        parent = json.loads(self.history[(case, head)])
        req = self._request(case, head, files, phase)
        out = self.store.commit_batch([req])[0]
        rewrites = [p for p, src in req.change.files.items() if p in WRITE_ONCE
                    and p in parent["files"] and parent["files"][p]["sha256"] != src.sha256]
        if rewrites:  # a write-once file replaced: the whole request is refused
            assert isinstance(out, ChangeRejected), out
            assert self.store.case(case).generation == head
            return
        assert isinstance(out, Published)
        self._record(case, out)
        for path, entry in parent["files"].items():
            got = out.manifest.files[path]
            if path not in files:  # not named in the change: exactly the parent's entry
                assert (got.sha256, got.size) == (entry["sha256"], entry["size"])

    @precondition(lambda self: bool(self.packages))
    @rule(data=st.data(), lag=st.integers(min_value=1, max_value=5))
    def stale(self, data: st.DataObject, lag: int) -> None:
        case = data.draw(st.sampled_from(sorted(self.packages)))
        expected = self.heads[case] - lag
        req = self._request(case, expected if expected > 0 else None, {"x": b"stale"}, "INTAKE")
        out = self.store.commit_batch([req])[0]
        assert isinstance(out, (StaleGeneration, CaseExists))

    @precondition(lambda self: bool(self.packages))
    @rule(data=st.data(), n=st.integers(min_value=2, max_value=6))
    def batch_same_parent(self, data: st.DataObject, n: int) -> None:
        """n requests on the same parent in one transaction: exactly the first commits."""
        case = data.draw(st.sampled_from(sorted(self.packages)))
        head = self.heads[case]
        reqs = [self._request(case, head, {"notes/n.txt": bytes([i])}, None) for i in range(n)]
        outs = self.store.commit_batch(reqs)
        assert isinstance(outs[0], Published)
        assert all(isinstance(o, StaleGeneration) for o in outs[1:])
        self._record(case, outs[0])

    @invariant()
    def chains_linear_and_immutable(self) -> None:
        for case, pkg in self.packages.items():
            rows = self.store.generations(pkg)
            assert [r.generation for r in rows] == list(range(1, self.heads[case] + 1))
            assert [r.parent for r in rows] == [None, *range(1, len(rows))]
            for r in rows:
                assert bytes(r.manifest) == self.history[(case, r.generation)]
            assert self.store.case(case).generation == self.heads[case]

    @invariant()
    def file_bytes_unchanged(self) -> None:
        for (_case, _gen), raw in list(self.history.items())[-3:]:
            for entry in json.loads(raw)["files"].values():
                assert self.store.read_blob(entry["sha256"]) == self.contents[entry["sha256"]]


def test_the_chain_machine(backend: str) -> None:
    """The state machine on each backend (PostgreSQL's examples are fewer: each one is a
    database's worth of round trips)."""
    run_state_machine_as_test(ChainMachine, settings=settings(
        max_examples=100 if backend == "sqlite" else 25, stateful_step_count=30,
        deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.differing_executors]))


class TestConcurrentPublishers:
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                           # the backend parameter
                                                           HealthCheck.differing_executors])
    @given(tasks=st.integers(min_value=2, max_value=12), each=st.integers(min_value=1, max_value=6),
           group_commit=st.booleans())
    def test_read_modify_write_races_stay_linear(self, tasks: int, each: int,
                                                 group_commit: bool) -> None:
        """Many tasks racing on one package through the publisher: every acknowledged
        publication is a distinct generation, the chain is linear, stale ones wrote nothing."""
        with tempfile.TemporaryDirectory() as tmp:
            acked = trio.run(_race, Path(tmp), tasks, each, group_commit)
            store = open_ro(Path(tmp))
            rows = store.generations(acked["pkg"])
            assert len(rows) == 1 + tasks * each
            assert sorted(acked["gens"]) == list(range(2, 2 + tasks * each))
            assert [r.parent for r in rows] == [None, *range(1, len(rows))]
            for r in rows:
                assert bytes(r.manifest) == acked["manifests"][r.generation]
            assert verify_store(store).ok
            store.close()


async def _race(root: Path, tasks: int, each: int, group_commit: bool) -> dict:  # type: ignore[type-arg]
    pkg = new_package_id()
    gens: list[int] = []
    manifests: dict[int, bytes] = {}
    async with open_store(root, group_commit=group_commit) as store:
        first = await store.publish(PublishRequest(pkg, "RACE-1", None, Change(
            files={"inputs/r.txt": BytesSource.of(b"r")}, phase="INTAKE")))
        manifests[1] = first.manifest.raw
        assert first.generation == 1

        async def worker(w: int) -> None:
            for i in range(each):
                while True:
                    head = (await store.case("RACE-1")).generation
                    try:
                        out = await store.publish(PublishRequest(pkg, "RACE-1", head, Change(
                            files={f"w/{w}.txt": BytesSource.of(f"{w}:{i}".encode())})))
                        assert out.generation == head + 1
                    except StaleGeneration:
                        await trio.lowlevel.checkpoint()
                        continue
                    gens.append(out.generation)
                    manifests[out.generation] = out.manifest.raw
                    break

        async with trio.open_nursery() as nursery:
            for w in range(tasks):
                nursery.start_soon(worker, w)
    return {"pkg": pkg, "gens": gens, "manifests": manifests}


@pytest.mark.no_store  # pure: runs once, not per backend
class TestManifestEncoding:
    @given(st.dictionaries(PATHS, st.tuples(st.text(alphabet="0123456789abcdef", min_size=64,
                                                    max_size=64), st.integers(0, 2**40))),
           st.text(max_size=30), PHASES)
    def test_same_bytes_as_canonical_json(self, files: dict[str, tuple[str, int]],
                                          case_text: str, phase: str) -> None:
        """The fast manifest encoder produces exactly canonical_json's bytes."""
        from engine import canonical_json
        from engine._store._manifest import encode_manifest

        manifest = {"format": "viano-case-package/1", "package_id": "p", "case_id": case_text,
                    "package_generation": 3, "parent_generation": None, "analysis_revision": 1,
                    "phase": phase, "created_at": "2026-11-30T00:00:00.000000Z",
                    "pointers": {"catalogue": "case/catalogue.json"},
                    "files": {p: {"sha256": h, "size": n} for p, (h, n) in files.items()}}
        assert encode_manifest(manifest) == canonical_json(manifest)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=20)


@pytest.mark.no_store  # pure: runs once, not per backend
class TestArtifactEncoding:
    @given(_JSON_VALUES)
    def test_same_bytes_as_the_standard_encoder(self, value: object) -> None:
        """artifact_json (orjson) writes exactly json.dumps(indent=2, ensure_ascii=False)'s
        bytes for every JSON value without floats: control characters, quotes, non-ASCII,
        nesting, empty containers."""
        import json

        from engine import artifact_json

        expected = (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()
        assert artifact_json(value) == expected

    @pytest.mark.parametrize("value", [float("nan"), float("inf"), {"a": [None, -float("inf")]}])
    def test_non_finite_numbers_are_refused(self, value: object) -> None:
        from engine import artifact_json

        with pytest.raises(ValueError):
            artifact_json(value)

    @given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
                        | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=4),
                        lambda children: st.lists(children, max_size=4)
                        | st.tuples(children, children)
                        | st.dictionaries(st.text(max_size=4), children, max_size=4),
                        max_leaves=12))
    def test_refused_exactly_when_the_standard_encoder_refuses(self, value: object) -> None:
        """NaN and infinities are looked for only among the floats (not by encoding the
        value again): refused wherever they sit, and nothing else is."""
        import json

        from engine import artifact_json

        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            with pytest.raises(ValueError, match="Out of range float"):
                artifact_json(value)
        else:
            assert artifact_json(value).endswith(b"\n")

    def test_a_container_subclass_is_checked_as_the_encoders_see_it(self) -> None:
        """A dict whose values() hides a NaN from a walk: refused as json.dumps refuses
        it (a subclass takes the standard encoder's check)."""
        from engine import artifact_json

        class Hiding(dict[str, object]):
            def values(self) -> Iterator[object]:  # type: ignore[override]
                return iter(())

        with pytest.raises(ValueError, match="Out of range float"):
            artifact_json(Hiding(a=float("nan"), b=None))

    def test_the_artifacts_clock_is_utc_to_the_microsecond(self) -> None:
        import re

        from engine._canonical import utc_now_iso

        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", utc_now_iso())

    def test_what_orjson_does_not_take_goes_through_the_standard_encoder(self) -> None:
        from engine import artifact_json

        assert artifact_json({"n": 2**70}) == b'{\n  "n": 1180591620717411303424\n}\n'
