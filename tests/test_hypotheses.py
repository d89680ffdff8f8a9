"""The hypotheses answer, checked by the strict controller: every rule of the spec with its
rule name and JSON pointer, and property tests (valid answers are accepted, each single
mutation of one is rejected); the records and registry the controller derives."""

from __future__ import annotations

import copy
import json
import unicodedata
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import normalized, validate_hypotheses
from engine._phases._case import CaseRecord
from engine._phases._hypotheses import FIELDS, FORBIDDEN, Interpretation, records_of
from engine._phases._interpretation import statements_of
from tests.phase_helpers import FIXTURES, INTERPRETATION_ANSWER

pytestmark = pytest.mark.usefixtures("backend")

ANSWER: dict[str, Any] = json.loads((FIXTURES / "hypotheses_v1" / "BUG-20.json").read_text())
HUMAN = ("report", "comment", "comment", "observation", "observation")
CASE = CaseRecord("case/catalogue.json", "case/intake.json", tuple(
    [{"source_id": f"S{i + 1}", "kind": k, "human": True} for i, k in enumerate(HUMAN)]
    + [{"source_id": f"S{i}", "kind": "diagnostics", "human": False} for i in range(6, 14)]),
    {})
INTERP = Interpretation(tuple(statements_of(INTERPRETATION_ANSWER)))


def _problems(answer: Any, minimum: int = 3, maximum: int = 5,
              interp: Interpretation = INTERP) -> list[tuple[str, str]]:
    return [(p.rule, p.pointer) for p in validate_hypotheses(answer, CASE, interp, minimum,
                                                             maximum)]


def _edit(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(ANSWER)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is _DEL:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


_DEL = object()

RULES: dict[str, tuple[Any, tuple[str, str]]] = {
    "a model id": (_edit(["hypotheses", 0, "id"], "H7"), ("forbidden_field", "/hypotheses/0/id")),
    "a priority": (_edit(["hypotheses", 1, "priority"], 1),
                   ("forbidden_field", "/hypotheses/1/priority")),
    "a status": (_edit(["hypotheses", 0, "status"], "confirmed"),
                 ("forbidden_field", "/hypotheses/0/status")),
    "a confidence": (_edit(["hypotheses", 2, "confidence"], 0.8),
                     ("forbidden_field", "/hypotheses/2/confidence")),
    "a budget": (_edit(["hypotheses", 0, "budget"], 500),
                 ("forbidden_field", "/hypotheses/0/budget")),
    "a patch": (_edit(["hypotheses", 0, "patch"], "diff --git"),
                ("forbidden_field", "/hypotheses/0/patch")),
    "a tool request": (_edit(["hypotheses", 0, "tool_calls"], [{"name": "grep"}]),
                       ("forbidden_field", "/hypotheses/0/tool_calls")),
    "a top-level confidence": (_edit(["confidence"], 0.9), ("forbidden_field", "/confidence")),
    "an unknown field": (_edit(["hypotheses", 0, "notes"], "x"),
                         ("unknown_field", "/hypotheses/0/notes")),
    "a missing field": (_edit(["hypotheses", 1, "distinction"], _DEL),
                        ("missing_field", "/hypotheses/1/distinction")),
    "'S1' for ['S1']": (_edit(["hypotheses", 1, "source_ids"], "S2"),
                        ("wrong_type", "/hypotheses/1/source_ids")),
    "empty sources": (_edit(["hypotheses", 1, "source_ids"], []),
                      ("empty_list", "/hypotheses/1/source_ids")),
    "empty expected evidence": (_edit(["hypotheses", 2, "expected_evidence"], []),
                                ("empty_list", "/hypotheses/2/expected_evidence")),
    "empty falsifying evidence": (_edit(["hypotheses", 2, "falsifying_evidence"], []),
                                  ("empty_list", "/hypotheses/2/falsifying_evidence")),
    "an unknown source": (_edit(["hypotheses", 1, "source_ids", 0], "S44"),
                          ("unknown_source", "/hypotheses/1/source_ids/0")),
    "an unknown statement": (_edit(["hypotheses", 1, "interpretation_ids", 1], "I99"),
                             ("unknown_interpretation_id", "/hypotheses/1/interpretation_ids/1")),
    "a blank mechanism": (_edit(["hypotheses", 0, "mechanism"], " \n "),
                          ("blank_string", "/hypotheses/0/mechanism")),
    "too few": ({"hypotheses": ANSWER["hypotheses"][:2]}, ("count_out_of_range", "/hypotheses")),
    "too many": ({"hypotheses": [{**h, "title": f"{h['title']} {i}",
                                  "mechanism": f"{h['mechanism']} {i}"}
                                 for i, h in enumerate(ANSWER["hypotheses"] * 2)]},
                 ("count_out_of_range", "/hypotheses")),
    "H1 without a human source": (_edit(["hypotheses", 0, "source_ids"], ["S7"]),
                                  ("primary_not_human_grounded", "/hypotheses/0/source_ids")),
    "H1 without the divergence": (_edit(["hypotheses", 0, "interpretation_ids"], ["I3"]),
                                  ("primary_missing_anchor",
                                   "/hypotheses/0/interpretation_ids")),
    "an alternative on assumptions only": (
        _edit(["hypotheses", 2, "interpretation_ids"], ["I10"]),
        ("alternative_ungrounded", "/hypotheses/2/interpretation_ids")),
    "a duplicate title (case, punctuation)": (
        _edit(["hypotheses", 2, "title"], "PARTY cache migration, runs after the first "
                                          "party-event!"),
        ("duplicate_title", "/hypotheses/2/title")),
    "a duplicate title (Unicode form)": (
        _edit(["hypotheses", 2, "title"],
              unicodedata.normalize("NFD", "Ｐarty cache migration runs after the first "
                                           "party event")),
        ("duplicate_title", "/hypotheses/2/title")),
    "a duplicate mechanism (whitespace)": (
        _edit(["hypotheses", 1, "mechanism"],
              "  " + ANSWER["hypotheses"][0]["mechanism"].replace(" ", "\t  ") + "\n"),
        ("duplicate_mechanism", "/hypotheses/1/mechanism")),
    "a title of a zero-width space": (_edit(["hypotheses", 0, "title"], "\u200b"),
                                      ("blank_string", "/hypotheses/0/title")),
    "a rationale of a word joiner and a soft hyphen": (
        _edit(["hypotheses", 1, "rationale"], "\u2060\u00ad"),
        ("blank_string", "/hypotheses/1/rationale")),
    "an evidence item of a byte-order mark": (
        _edit(["hypotheses", 1, "expected_evidence", 0], "\ufeff \u3164"),
        ("blank_string", "/hypotheses/1/expected_evidence/0")),
    "a duplicate title (backquotes)": (
        _edit(["hypotheses", 2, "title"], "`Party` cache migration runs after the `first` "
                                          "party event"),
        ("duplicate_title", "/hypotheses/2/title")),
    "a duplicate title (ASCII symbols)": (
        _edit(["hypotheses", 2, "title"], "Party + cache | migration runs after the first "
                                          "party ~ event"),
        ("duplicate_title", "/hypotheses/2/title")),
    "not an object": (ANSWER["hypotheses"], ("wrong_type", "/")),
    "hypotheses not a list": ({"hypotheses": ANSWER["hypotheses"][0]},
                              ("wrong_type", "/hypotheses")),
}


class TestRules:
    def test_the_fixture_answer_passes(self) -> None:
        assert _problems(ANSWER) == []

    @pytest.mark.parametrize("label", sorted(RULES))
    def test_each_rule_names_itself_and_its_pointer(self, label: str) -> None:
        answer, expected = RULES[label]
        assert expected in _problems(answer), (label, _problems(answer))

    def test_the_anchor_falls_back_to_failure_stage_then_reported_behavior(self) -> None:
        """Without a first-known-divergence statement H1 must cite a failure stage; with
        neither, a reported behaviour."""
        no_div = [s for s in statements_of(INTERPRETATION_ANSWER)
                  if s["kind"] != "first_known_divergence"]
        interp = Interpretation(tuple(no_div))
        cites_stage = _edit(["hypotheses", 0, "interpretation_ids"], ["I8"])
        assert _problems(cites_stage, interp=interp) == []
        assert ("primary_missing_anchor", "/hypotheses/0/interpretation_ids") in _problems(
            _edit(["hypotheses", 0, "interpretation_ids"], ["I3"]), interp=interp)
        neither = Interpretation(tuple(s for s in no_div if s["kind"] != "failure_stage"))
        assert _problems(_edit(["hypotheses", 0, "interpretation_ids"], ["I1"]),
                         interp=neither) == []
        assert ("primary_missing_anchor", "/hypotheses/0/interpretation_ids") in _problems(
            _edit(["hypotheses", 0, "interpretation_ids"], ["I3"]), interp=neither)

    def test_without_any_anchor_h1_still_needs_a_grounded_human_statement(self) -> None:
        """No divergence, stage or reported behaviour: H1 resting only on ungrounded or
        machine-sourced statements is refused (it may not be weaker than an alternative);
        on a grounded statement that cites a person, accepted."""
        unanchored = Interpretation(tuple(
            s for s in statements_of(INTERPRETATION_ANSWER)
            if s["kind"] not in ("first_known_divergence", "failure_stage",
                                 "reported_behavior")))
        grounded = next(s["alias"] for s in unanchored.statements
                        if s["grounded"] and any(CASE.human(x) for x in s["source_ids"]))
        # I10 is ungrounded; I7 is a technical fact citing only a log (S7), not a person.
        for weak in (["I10"], ["I7"], ["I7", "I10"]):
            assert ("primary_missing_anchor", "/hypotheses/0/interpretation_ids") in \
                _problems(_edit(["hypotheses", 0, "interpretation_ids"], weak),
                          interp=unanchored), weak
        assert _problems(_edit(["hypotheses", 0, "interpretation_ids"], [grounded]),
                         interp=unanchored) == []

    def test_the_prompts_worked_example_obeys_every_rule(self) -> None:
        """The example in hypotheses_v1 is an answer the controller accepts under the
        default policy, for the case it describes (S1 the report, I5 the divergence)."""
        from engine import load_prompt

        text = load_prompt("hypotheses_v1").text
        example = json.loads(text[text.index('{"hypotheses"', text.index("EXAMPLE")):])
        case = CaseRecord("c", "i", tuple(
            {"source_id": f"S{i}", "kind": "report" if i == 1 else "diagnostics",
             "human": i == 1} for i in range(1, 6)), {})
        interp = Interpretation(tuple(
            {"alias": f"I{i}", "kind": "first_known_divergence" if i == 5 else "observation",
             "grounded": True, "source_ids": ["S1"]} for i in range(1, 7)))
        assert [(p.rule, p.pointer) for p in validate_hypotheses(example, case, interp, 3, 5)
                ] == []

    def test_every_forbidden_name_is_named_forbidden(self) -> None:
        for name in sorted(FORBIDDEN):
            assert ("forbidden_field", f"/hypotheses/0/{name}") in _problems(
                _edit(["hypotheses", 0, name], 1)), name

    def test_the_counts_follow_the_policy(self) -> None:
        """Five is a policy default, not a format limit."""
        assert _problems(ANSWER, minimum=1, maximum=3) == []
        assert _problems(ANSWER, minimum=4, maximum=9)[0][0] == "count_out_of_range"


@pytest.mark.no_store  # pure: runs once, not per backend
class TestNormalization:
    @given(st.text(max_size=40))
    def test_presentation_differences_vanish(self, text: str) -> None:
        assert normalized(text) == normalized(text.upper()) == normalized(
            f"  {text} !?. ") == normalized(unicodedata.normalize("NFD", text))

    def test_different_words_stay_different(self) -> None:
        assert normalized("cache miss") != normalized("cache hit")

    @pytest.mark.parametrize("unseen", ["\ufe0f", "\ufe00", "\U000e0100", "\u034f",
                                        "\u3164", "\u115f", "\uffa0", "\u2800"])
    def test_what_shows_as_nothing_vanishes_too(self, unseen: str) -> None:
        """A variation selector, a combining grapheme joiner or a letter that renders as
        nothing made a copy of a title distinct; the first release's form (verify's, for
        batches it accepted) keeps them."""
        assert normalized(f"cache{unseen} miss") == normalized("cache miss")
        assert normalized("cache miss".replace(" ", unseen)) == normalized("cache miss")
        assert normalized(f"cache{unseen} miss", legacy=True) != normalized("cache miss")

    def test_marks_that_show_still_count(self) -> None:
        """Only what shows as nothing goes: a Devanagari vowel sign is a different word."""
        assert normalized("\u0915\u0941\u0924\u094d\u0924\u093e") != \
            normalized("\u0915\u0924\u094d\u0924\u093e")


@pytest.mark.no_store  # pure: runs once, not per backend
@pytest.mark.parametrize("second", ["H1's title + U+FE0F", "punctuation alone"])
def test_near_duplicates_are_duplicates_and_verify_keeps_what_it_accepted(
        second: str) -> None:
    """Two titles that differ by what shows as nothing, or that are punctuation alone,
    are duplicate_title. verify judges an accepted batch by the first release's rule
    (legacy), which accepted them: a batch it accepted stays valid."""
    doc = copy.deepcopy(ANSWER)
    hyps = doc["hypotheses"]
    if second == "punctuation alone":
        hyps[0]["title"], hyps[2]["title"] = "!!!", "???"
    else:
        hyps[2]["title"] = hyps[0]["title"].replace(" ", " \ufe0f", 1)
    assert ("duplicate_title", "/hypotheses/2/title") in _problems(doc)
    legacy = validate_hypotheses(doc, CASE, INTERP, 3, 5, legacy=True)
    assert not [p for p in legacy if p.rule.startswith("duplicate_")]


_TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N")), min_size=3,
                max_size=30)
GROUNDED_ALIASES = ["I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9"]


@st.composite
def _answers(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(3, 5))
    titles = draw(st.lists(_TEXT, min_size=n, max_size=n,
                           unique_by=normalized).filter(lambda t: len({normalized(x) for x in t})
                                                        == n))
    mechanisms = draw(st.lists(_TEXT, min_size=n, max_size=n, unique_by=normalized))
    out = []
    for i in range(n):
        sources = draw(st.lists(st.sampled_from([f"S{j}" for j in range(1, 14)]), min_size=1,
                                max_size=4))
        cited = draw(st.lists(st.sampled_from([*GROUNDED_ALIASES, "I10"]), min_size=1,
                              max_size=4))
        if i == 0:
            sources = ["S1", *sources]
            cited = ["I9", *cited]
        elif not set(cited) & set(GROUNDED_ALIASES):
            cited.append("I7")
        out.append({"title": titles[i], "mechanism": mechanisms[i], "rationale": draw(_TEXT),
                    "distinction": draw(_TEXT), "source_ids": sources,
                    "interpretation_ids": cited,
                    "expected_evidence": draw(st.lists(_TEXT, min_size=1, max_size=3)),
                    "falsifying_evidence": draw(st.lists(_TEXT, min_size=1, max_size=3)),
                    "open_questions": draw(st.lists(_TEXT, max_size=2))})
    return {"hypotheses": out}


@pytest.mark.no_store  # pure: runs once, not per backend
class TestProperties:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_answers())
    def test_valid_answers_are_accepted(self, answer: dict[str, Any]) -> None:
        assert _problems(answer) == []

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.filter_too_much])
    @given(_answers(), st.data())
    def test_every_single_mutation_is_rejected(self, answer: dict[str, Any],
                                               data: st.DataObject) -> None:
        doc = copy.deepcopy(answer)
        items = doc["hypotheses"]
        i = data.draw(st.integers(0, len(items) - 1))
        h = items[i]
        mutation = data.draw(st.sampled_from([
            "remove_field", "wrong_type", "unknown_source", "unknown_statement",
            "duplicate_title", "duplicate_mechanism", "forbidden_field", "blank"]))
        if mutation == "remove_field":
            del h[data.draw(st.sampled_from(FIELDS))]
        elif mutation == "wrong_type":
            field = data.draw(st.sampled_from(FIELDS))
            h[field] = 7 if isinstance(h[field], str) else "S1"
        elif mutation == "unknown_source":
            h["source_ids"] = [*h["source_ids"], "S404"]
        elif mutation == "unknown_statement":
            h["interpretation_ids"] = [*h["interpretation_ids"], "I404"]
        elif mutation in ("duplicate_title", "duplicate_mechanism"):
            field = mutation.split("_")[1]
            j = (i + 1) % len(items)
            variant = data.draw(st.sampled_from([str.upper, str.lower, lambda s: f" {s}.",
                                                 lambda s: unicodedata.normalize("NFKD", s)]))
            h[field] = variant(items[j][field])
        elif mutation == "forbidden_field":
            h[data.draw(st.sampled_from(sorted(FORBIDDEN)))] = "x"
        else:
            h[data.draw(st.sampled_from(FIELDS[:4]))] = "   "
        assert _problems(doc), (mutation, i)


class TestRecords:
    def test_the_controller_labels_positions_roles_and_budgets(self) -> None:
        """H1..Hn in returned order; H1 tester_primary, the rest alternatives; status new,
        confidence unassessed; every allocation the same initial budget; text verbatim."""
        records = records_of(ANSWER, 100)
        assert [(r["id"], r["position"], r["role"]) for r in records] == [
            ("H1", 1, "tester_primary"), ("H2", 2, "alternative"), ("H3", 3, "alternative")]
        assert {(r["status"], r["confidence"]) for r in records} == {("new", "unassessed")}
        assert [r["budget_allocation"] for r in records] == [
            {"initial": 100, "unit": "investigation_units"}] * 3
        for r, h in zip(records, ANSWER["hypotheses"], strict=True):
            assert all(r[f] == h[f] for f in FIELDS)


def test_a_models_long_values_are_cut_in_the_problems() -> None:
    """A 5,000-character "source id" (or key) was quoted whole in the problem, and so in
    the result message, the rejection artifact and the terminal; each problem's message
    and pointer are cut to a few hundred characters, saying how long the value was."""
    long_id = "S" + "9" * 5000
    answer = _edit(["hypotheses", 0, "source_ids"], [long_id])
    answer["hypotheses"][1]["k" * 3000] = 1
    problems = validate_hypotheses(answer, CASE, INTERP, 3, 5)
    rules = {p.rule for p in problems}
    assert {"unknown_source", "unknown_field"} <= rules, rules
    for p in problems:
        assert len(p.message) <= 340 and len(p.pointer) <= 240, (p.rule, len(p.message))
    cut = next(p for p in problems if p.rule == "unknown_source")
    assert cut.message.endswith("characters)") and cut.pointer.startswith("/hypotheses/0/")
