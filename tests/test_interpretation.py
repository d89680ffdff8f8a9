"""Case interpretation: the strict answer contract, the context (catalogue, human texts,
bounded deterministic excerpts, all delimited as untrusted data), and the accepted
artifacts with their bindings."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import (
    INTERPRETATION,
    Config,
    InterpretationLimits,
    InterpretationPolicy,
    PackageView,
    Refusal,
    interpretation_policy,
    load_prompt,
    validate_interpretation,
)
from engine._phases._case import read_case
from engine._phases._interpretation import GROUNDED, KINDS, render_summary, statements_of
from engine._text import is_blank
from tests.phase_helpers import INTERPRETATION_ANSWER, intake_sample
from tests.store_helpers import open_ro

pytestmark = pytest.mark.usefixtures("backend")

IDS = [f"S{i}" for i in range(1, 14)]


class _Case:
    ids = frozenset(IDS)


def _problems(answer: Any) -> list[tuple[str, str]]:
    return [(p.rule, p.pointer) for p in validate_interpretation(answer, _Case())]  # type: ignore[arg-type]


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(INTERPRETATION_ANSWER)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_DELETE = object()

INVALID: dict[str, tuple[dict[str, Any] | Any, tuple[str, str]]] = {
    "extra top-level key": (_with(["confidence"], 0.9), ("unknown_field", "/confidence")),
    "extra statement key": (_with(["statements", 0, "id"], "I1"),
                            ("unknown_field", "/statements/0/id")),
    "missing summary": (_with(["summary"], _DELETE), ("missing_field", "/summary")),
    "missing source_ids": (_with(["statements", 1, "source_ids"], _DELETE),
                           ("missing_field", "/statements/1/source_ids")),
    "'S1' for ['S1']": (_with(["statements", 0, "source_ids"], "S1"),
                        ("wrong_type", "/statements/0/source_ids")),
    "number for a string": (_with(["statements", 0, "text"], 7),
                            ("wrong_type", "/statements/0/text")),
    "null summary": (_with(["summary"], None), ("wrong_type", "/summary")),
    "unknown source id": (_with(["statements", 2, "source_ids"], ["S99"]),
                          ("unknown_source", "/statements/2/source_ids/0")),
    "source id of another case": (_with(["statements", 2, "source_ids"], ["s1"]),
                                  ("unknown_source", "/statements/2/source_ids/0")),
    "two divergences": (_with(["statements", 0, "kind"], "first_known_divergence"),
                        ("duplicate_divergence", "/statements/8/kind")),
    "blank text": (_with(["statements", 3, "text"], "   "),
                   ("blank_string", "/statements/3/text")),
    "blank summary": (_with(["summary"], "\n\t"), ("blank_string", "/summary")),
    "grounded without a source": (_with(["statements", 4, "source_ids"], []),
                                  ("ungrounded_statement", "/statements/4/source_ids")),
    "unknown kind": (_with(["statements", 0, "kind"], "root_cause"),
                     ("unknown_kind", "/statements/0/kind")),
    "no statements": (_with(["statements"], []), ("empty_list", "/statements")),
    "statement not an object": (_with(["statements", 0], "text"),
                                ("wrong_type", "/statements/0")),
    "a list, not an object": ([INTERPRETATION_ANSWER], ("wrong_type", "/")),
    "missing observation blank": (_with(["missing_observations", 0], ""),
                                  ("blank_string", "/missing_observations/0")),
}


class TestValidation:
    def test_the_fixture_answer_is_valid(self) -> None:
        assert _problems(INTERPRETATION_ANSWER) == []

    @pytest.mark.parametrize("label", sorted(INVALID))
    def test_each_invalid_shape_names_its_rule_and_pointer(self, label: str) -> None:
        answer, expected = INVALID[label]
        assert expected in _problems(answer), (label, _problems(answer))

    def test_ungrounded_kinds_may_cite_nothing(self) -> None:
        for kind in ("assumption", "external_expectation", "implementation_reference"):
            assert _problems(_with(["statements", 9, "kind"], kind)) == []


_TEXT = st.text(min_size=1, max_size=40).filter(lambda s: not is_blank(s))


@st.composite
def _answers(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 8))
    statements = []
    divergence = False
    for _ in range(n):
        kinds = [k for k in KINDS if k != "first_known_divergence" or not divergence]
        kind = draw(st.sampled_from(kinds))
        divergence = divergence or kind == "first_known_divergence"
        ids = draw(st.lists(st.sampled_from(IDS), min_size=1 if kind in GROUNDED else 0,
                            max_size=4))
        statements.append({"kind": kind, "text": draw(_TEXT), "source_ids": ids})
    return {"summary": draw(_TEXT), "statements": statements,
            "missing_observations": draw(st.lists(_TEXT, max_size=3))}


@pytest.mark.no_store  # pure: runs once, not per backend
class TestValidationProperties:
    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(_answers())
    def test_valid_answers_are_accepted(self, answer: dict[str, Any]) -> None:
        assert _problems(answer) == []

    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(_answers(), st.data())
    def test_every_single_mutation_is_rejected(self, answer: dict[str, Any],
                                               data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(answer["statements"]) - 1))
        mutation = data.draw(st.sampled_from(["drop_field", "extra_field", "bad_id", "str_ids",
                                              "blank", "bad_kind"]))
        doc = copy.deepcopy(answer)
        st_ = doc["statements"][i]
        if mutation == "drop_field":
            del st_[data.draw(st.sampled_from(["kind", "text", "source_ids"]))]
        elif mutation == "extra_field":
            st_[data.draw(st.sampled_from(["id", "confidence", "priority", "x"]))] = 1
        elif mutation == "bad_id":
            st_["source_ids"] = [*st_["source_ids"], "S999"]
        elif mutation == "str_ids":
            st_["source_ids"] = "S1"
        elif mutation == "blank":
            st_["text"] = " "
        else:
            st_["kind"] = "root_cause"
        assert _problems(doc), (mutation, doc)


class TestContextAndArtifacts:
    async def _store(self, tmp_path: Path):  # type: ignore[no-untyped-def]
        from actors import open_store

        async with open_store(tmp_path / "s") as store:
            await intake_sample(store)
        return open_ro(tmp_path / "s")

    async def test_context_holds_the_case_as_untrusted_data(self, tmp_path: Path) -> None:
        """The catalogue, every human text under its S id, bounded excerpts of the textual
        members, a record of what was excerpted; binary members only in the catalogue;
        built twice, the same bytes."""
        store = await self._store(tmp_path)
        _ref, manifest = store.head("BUG-20")
        view = PackageView(manifest, store.read_blob, store.open_blob)
        policy = interpretation_policy(InterpretationPolicy())
        one = INTERPRETATION.context(view, policy, 1)
        two = INTERPRETATION.context(view, policy, 1)
        assert isinstance(one, bytes) and one == two
        doc = json.loads(one)
        untrusted = doc["untrusted_case_data"]
        assert "catalogue" not in doc  # its names and paths are the case's, so untrusted
        assert [s["source_id"] for s in untrusted["catalogue"]] == IDS
        assert [t["source_id"] for t in untrusted["human_texts"]] == ["S1", "S2", "S3", "S4",
                                                                      "S5"]
        assert untrusted["human_texts"][1]["author"] == "dev.oskar"
        assert "Events.lua:47" in untrusted["human_texts"][0]["text"]
        excerpted = {e["source_id"]: e for e in untrusted["excerpts"]}
        assert "Events.lua:47: attempt to index field" in excerpted["S7"]["text"]
        assert excerpted["S7"]["complete"] is True
        assert set(doc["excerpting"]["excerpted"]) == set(excerpted)
        assert "untrusted_case_data" in load_prompt("interpretation_v1").text
        store.close()

    async def test_excerpts_are_bounded_and_recorded(self, tmp_path: Path) -> None:
        store = await self._store(tmp_path)
        _, manifest = store.head("BUG-20")
        view = PackageView(manifest, store.read_blob, store.open_blob)
        limits = InterpretationLimits(max_excerpt_bytes=100, max_excerpts_total_bytes=350)
        doc = json.loads(INTERPRETATION.context(view, {"limits": {  # type: ignore[arg-type]
            **{k: getattr(limits, k) for k in ("max_context_bytes", "max_output_bytes",
                                               "max_summary_bytes")},
            "max_excerpt_bytes": 100, "max_excerpts_total_bytes": 350}}, 1))
        ex = doc["untrusted_case_data"]["excerpts"]
        assert all(e["bytes_included"] <= 100 for e in ex)
        assert sum(e["bytes_included"] for e in ex) <= 350
        assert not ex[0]["complete"]
        reasons = {s["reason"] for s in doc["excerpting"]["not_excerpted"]}
        assert "excerpt_budget_spent" in reasons
        store.close()

    async def test_a_context_over_its_limit_is_refused_not_truncated(self,
                                                                     tmp_path: Path) -> None:
        store = await self._store(tmp_path)
        _, manifest = store.head("BUG-20")
        view = PackageView(manifest, store.read_blob, store.open_blob)
        policy = interpretation_policy(InterpretationPolicy(
            limits=InterpretationLimits(max_context_bytes=2000)))
        refusal = INTERPRETATION.context(view, policy, 1)
        assert isinstance(refusal, Refusal) and refusal.reason == "limit_exceeded"
        store.close()

    def test_statements_get_aliases_and_pointers_verbatim(self) -> None:
        out = statements_of(INTERPRETATION_ANSWER)
        assert [s["alias"] for s in out[:3]] == ["I1", "I2", "I3"]
        assert out[2]["pointer"] == "/statements/2"
        assert out[0]["text"] == INTERPRETATION_ANSWER["statements"][0]["text"]

    def test_the_summary_is_escaped_markdown(self) -> None:
        """Model text cannot inject links, images, HTML, headings or mentions."""
        evil = {"summary": "# Title\n[click](http://evil) ![x](http://e/i.png) <script>x"
                           "</script> @admin #123 **bold**",
                "statements": [{"kind": "observation", "text": "[a](b) <img src=x> @you",
                                "source_ids": ["S1"]}], "missing_observations": []}
        import re

        md = render_summary("BUG-20", 1, evil, statements_of(evil)).decode()
        for raw in ("[click](", "![x](", "<script>", "<img", "@admin", "#123", "**bold**",
                    "# Title"):
            # present only with its markup characters backslash-escaped
            unescaped = re.escape(raw).replace(re.escape(raw[0]), "(?<!\\\\)" +
                                               re.escape(raw[0]), 1)
            assert not re.search(unescaped, md), raw
        assert "\\[click\\]" in md and "\\@\u2060admin" in md

    def test_config_policy_pins_limits_not_auto_confirm(self) -> None:
        a = INTERPRETATION.configured(Config.defaults())
        import attrs

        b = INTERPRETATION.configured(attrs.evolve(Config.defaults(), interpretation=
                                                   InterpretationPolicy(auto_confirm=True)))
        assert a == b and "limits" in a

    async def test_the_case_record_is_read_strictly(self, tmp_path: Path) -> None:
        store = await self._store(tmp_path)
        _, manifest = store.head("BUG-20")
        case = read_case(PackageView(manifest, store.read_blob, store.open_blob))
        assert case.human("S1") and not case.human("S7")
        store.close()


class TestDocumentCache:
    def test_bounded_by_the_memory_parsed_documents_hold(self) -> None:
        """An entry costs ENTRY_OVERHEAD plus its bytes, and a parsed document
        PARSED_FACTOR times its bytes beyond them; the least recently used goes first; a
        document over max_item is never kept."""
        from engine._phases import _view as view_module
        from engine._phases._view import _Documents

        cache = _Documents(max_bytes=1000, max_item=200)
        assert cache._cost(b"x" * 10, {"x": 1}) == cache.ENTRY_OVERHEAD + 10 * 5
        assert cache._cost(b"x" * 10, view_module._UNPARSED) == cache.ENTRY_OVERHEAD + 10
        cache.ENTRY_OVERHEAD = 0  # the arithmetic below, in bytes alone
        cache.put("a", b"x" * 100, {"a": 1})   # costs 500
        cache.put("b", b"y" * 50)                # costs 50: 550 in all
        cache.put("d", b"w" * 80, {"d": 1})     # costs 400: 950 in all
        assert cache.get("a") is not None and cache.get("b") is not None
        cache.put("c", b"z" * 80, {"c": 1})     # 400 more: "d", least recently used, goes
        assert cache.get("d") is None and cache.get("a") is not None
        cache.get("b")
        cache.put("e", b"v" * 20, {"e": 1})     # 100 more: then "c" (a and b were read)
        assert cache.get("c") is None and cache.get("a") is not None
        assert cache.get("b") is not None and cache.get("e") == (b"v" * 20, {"e": 1})
        cache.put("big", b"q" * 201)
        assert cache.get("big") is None

    def test_room_is_reserved_per_case_in_flight_and_given_back(self) -> None:
        """The bound grows by PER_CASE for each case reserved while the block runs; two
        reservations add up; leaving one evicts down to the smaller bound, also when the
        block raises."""
        from engine._phases._view import _Documents

        cache = _Documents(max_bytes=1000, max_item=10_000)
        cache.ENTRY_OVERHEAD = 0
        per = cache.PER_CASE
        with cache.reserve(2):
            assert cache.max_bytes == 1000 + 2 * per
            with cache.reserve(1):
                assert cache.max_bytes == 1000 + 3 * per
            for i in range(2 * per // 1000):
                cache.put(f"k{i}", b"x" * 1000)  # 2 cases' worth: none evicted
            assert cache.get("k0") is not None and cache._size == 2 * per // 1000 * 1000
            with pytest.raises(RuntimeError), cache.reserve(5):
                raise RuntimeError("the engine failed")
            assert cache.max_bytes == 1000 + 2 * per
        assert cache.max_bytes == 1000 and cache._size <= 1000
        assert cache.get("k1") is None and cache.get("k0") is not None  # k0 was read last
        with pytest.raises(ValueError), cache.reserve(-1):
            pass
        assert cache.max_bytes == 1000
        for bad in (float("inf"), 2.5, True, "3"):  # inf - inf left nan: never evicting
            with pytest.raises(ValueError), cache.reserve(bad):  # type: ignore[arg-type]
                pass
        assert cache.max_bytes == 1000
        with cache.reserve(10**9):  # an absurd concurrency does not lift the bound
            assert cache.max_bytes == 1000 + cache.MAX_ROOM == 1000 + (256 << 20)
        assert cache.max_bytes == 1000

    def test_a_phases_own_files_are_kept_as_written_but_request_bodies_are_not(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        from engine import BytesSource, Change
        from engine._phases import _view

        monkeypatch.setattr(_view, "DOCUMENTS", _view._Documents())
        context, body = BytesSource.of(b'{"task": 1}'), BytesSource.of(b'{"model": "m"}')
        change = Change(files={"analysis/interpretation/0001/context.json": context,
                               "analysis/interpretation/0001/requests/" + body.sha256
                               + ".json": body})
        assert _view.remember_written(change) is change
        assert _view.DOCUMENTS.get(context.sha256) is not None
        assert _view.DOCUMENTS.get(body.sha256) is None
