"""``viano report``: the interpretation and hypotheses, traceable to the package, and inert
when posted: no model or reporter text becomes a link, an image, HTML or a mention."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options

from engine import report_markdown
from engine._text import markdown_inert as md_text
from tests.conftest import make_readonly, make_writable, run_viano
from tests.phase_helpers import FIXTURES, completed_sample_store

pytestmark = pytest.mark.usefixtures("backend")

HOSTILE = [
    "see [click](https://evil.example/x) and ![img](https://evil.example/i.png)",
    "<img src=x onerror=alert(1)> <script>alert(1)</script> <a href='y'>z</a>",
    "ping @octocat and @acme/team, fixes #123 and acme/rocket#9, GH-4",
    "bare https://evil.example/path and www.evil.example and mail me@evil.example",
    "# heading\n- list\n> quote\n| a | b |\n|---|---|\n1. one\n===",
    "**bold** _em_ ~~strike~~ `code` <https://evil.example> &amp; &#x3C;",
    "[ref]: https://evil.example\n[ref]",
    "\x1b[31mred\x1b[0m \u202eevil\u202c",
    "1. numbered at the start",
    "- a nested list",
    "see GH-42, commit deadbeefcafe1234 and 1a2b3c4",
    "!image.png! {panel}x{panel} h1. head -strike- +under+ ^sup^ [text|http://x] ??cite??",
    "h1. a Jira heading",
    "Jira emoticons (x) (y) (on) (!) :) ;) :D and math $x^2$ and a note (I4)",
]


def _html(md: str) -> str:
    return cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE)


_CODE = re.compile(r"<code>(.*?)</code>")


def _assert_inert(md: str, case_id: str = "C-1") -> None:
    html = _html(md)
    assert "<a " not in html and "<img" not in html and "<script" not in html, html
    tags = set(re.findall(r"<(/?[a-z0-9]+)", html))
    assert tags <= {"p", "/p", "ul", "/ul", "li", "/li", "h2", "/h2", "h3", "/h3", "h4",
                    "/h4", "hr", "table", "/table", "thead", "/thead", "tbody", "/tbody",
                    "tr", "/tr", "th", "/th", "td", "/td", "code", "/code"}, tags
    # Only what GitHub would link by itself is made code, and nothing else.
    assert all(re.fullmatch(r"(?i)gh-[0-9]+|[0-9a-f-]{7,64}", c) or c == case_id
               for c in _CODE.findall(html)), _CODE.findall(html)
    text = re.sub(r"<[^>]+>", "", _CODE.sub("", html))
    assert re.search(r"@[A-Za-z0-9]", text) is None, text  # no mention
    assert re.search(r"#\d", text) is None, text  # no issue reference
    assert re.search(r"(?i)\bgh-\d|\b[0-9a-f]{7,40}\b", text) is None, text  # no auto-link
    assert "\x1b" not in md and "\u202e" not in md
    # Jira wiki markup: every markup character is escaped (outside code spans).
    source = re.sub(r"`[^`]*`", "", md)
    assert re.search(r"(?<!\\)[!{}^+$]", source) is None, source
    assert re.search(r"(?i)(?<!\\)\((?:y|n|i|x|on|off)\)|(?<!\\)[:;][()DP]", source) is None, \
        source
    assert re.search(r"(?im)^\s*(?:[-*]\s+)?h[1-6]\.", source) is None, source


@pytest.mark.parametrize("text", HOSTILE)
def test_one_hostile_text_is_inert(text: str) -> None:
    item = _html(f"- {md_text(text)}")
    assert item.count("<ul>") == 1 and item.count("<li>") == 1 and "<ol" not in item, item
    _assert_inert(f"- {md_text(text)}")
    paragraph = _html(md_text(text))
    assert paragraph.startswith("<p>") and paragraph.count("<p>") == 1, paragraph
    _assert_inert(md_text(text))


def test_a_whole_report_of_hostile_text_is_inert() -> None:
    bad = " / ".join(HOSTILE)
    hyp = {k: bad for k in ("id", "title", "mechanism", "distinction")}
    hyp |= {k: [bad, bad] for k in ("expected_evidence", "falsifying_evidence",
                                      "open_questions", "source_ids", "interpretation_ids")}
    doc: dict[str, Any] = {
        "case_id": "C-1", "title": bad, "analysis_revision": 1,
        "interpretation": {"summary": bad, "confirmed_by": bad, "missing_observations": [bad],
                           "statements": [{"alias": "I1", "kind": bad, "text": bad,
                                           "source_ids": [bad]}]},
        "sources": [{"source_id": "S1", "kind": bad, "author": bad, "quote": bad}],
        "hypotheses": [hyp], "allocation": [{"id": bad, "initial": bad, "unit": bad}],
        "trace": {"package_id": "0b6c2f9e-1d2a-4c3b-9e8f-7a6b5c4d3e2f",
                  "package_generation": 3, "interpretation_sha256": "a" * 64,
                  "hypotheses_sha256": "b" * 64, "registry_sha256": "c" * 64}}
    md = report_markdown(doc)
    _assert_inert(md)
    # The text is still all there for a person to read.
    assert "octocat" in md and "onerror" in md and "strike" in md and "deadbeefcafe1234" in md


@pytest.fixture
def completed_store(backend: str, tmp_path: Path) -> Path:
    return completed_sample_store(tmp_path / "store")


def test_the_report_of_a_completed_case(completed_store: Path) -> None:
    r = run_viano("report", "--store", completed_store, "BUG-20")
    assert r.returncode == 0, r.stderr
    md = r.stdout
    _assert_inert(md, "BUG-20")
    show = json.loads(run_viano("show", "--json", "--store", completed_store,
                                "BUG-20").stdout)
    hyp_path = show["pointers"]["hypotheses"]
    hyps = json.loads(run_viano("cat", "--store", completed_store, "BUG-20",
                                hyp_path).stdout)["hypotheses"]
    for h in hyps:
        assert f"#### {h['id']}: " in md
    assert md.count("- Mechanism: ") == md.count("- Falsifying evidence:") == len(hyps) == 3
    assert "- Open questions:" in md and "- Distinction: " in md
    assert "| H1 | 100 | investigation\\_units |" in md
    assert "- S1 (report, mira.tanaka): “Since updating QuestLedger" in md
    footer = md.strip().splitlines()[-1]
    assert f"`{show['package_id']}`" in footer
    assert f"generation {show['package_generation']}" in footer
    assert show["files"][hyp_path]["sha256"] in footer
    assert show["files"][show["pointers"]["interpretation"]]["sha256"] in footer

    as_json = run_viano("report", "--store", completed_store, "BUG-20", "--format", "json")
    doc = json.loads(as_json.stdout)
    assert doc == json.loads(run_viano("report", "--json", "--store", completed_store,
                                       "BUG-20").stdout)
    assert [h["id"] for h in doc["hypotheses"]] == ["H1", "H2", "H3"]
    assert doc["allocation"] == [{"id": f"H{i}", "initial": 100,
                                  "unit": "investigation_units"} for i in (1, 2, 3)]
    assert doc["trace"]["hypotheses_sha256"] == show["files"][hyp_path]["sha256"]
    assert report_markdown(doc) == md  # the Markdown is a rendering of that document


def test_a_reference_cited_many_times_is_reported_once(backend: str, tmp_path: Path) -> None:
    """The phases accept an answer that cites S1 fifty thousand times (no released prompt
    forbids it); its report printed the reference each time, 25 times the answer's size.
    Now each reference shows once where it is cited, in the Markdown and the JSON alike."""
    answers = tmp_path / "answers"
    shutil.copytree(FIXTURES, answers)
    many = 2_000
    path = answers / "interpretation_v1" / "BUG-20.json"
    interp = json.loads(path.read_text())
    for st in interp["statements"]:
        st["source_ids"] = st["source_ids"] * many
    path.write_text(json.dumps(interp))
    path = answers / "hypotheses_v1" / "BUG-20.json"
    hyps = json.loads(path.read_text())
    for h in hyps["hypotheses"]:
        h["source_ids"] = h["source_ids"] * many
        h["interpretation_ids"] = h["interpretation_ids"] * many
    path.write_text(json.dumps(hyps))
    store = completed_sample_store(tmp_path / "store", answers)
    plain = completed_sample_store(tmp_path / "plain")

    md = run_viano("report", "--store", store, "BUG-20")
    assert md.returncode == 0, md.stderr
    same = run_viano("report", "--store", plain, "BUG-20").stdout
    assert md.stdout.splitlines()[:-1] == same.splitlines()[:-1]  # the footer's hashes differ
    doc = json.loads(run_viano("report", "--json", "--store", store, "BUG-20").stdout)
    assert [s["source_ids"] for s in doc["interpretation"]["statements"]] == \
        [list(dict.fromkeys(s["source_ids"])) for s in interp["statements"]]
    assert [(h["source_ids"], h["interpretation_ids"]) for h in doc["hypotheses"]] == \
        [(list(dict.fromkeys(h["source_ids"])), list(dict.fromkeys(h["interpretation_ids"])))
         for h in hyps["hypotheses"]]
    assert len({s["source_id"] for s in doc["sources"]}) == len(doc["sources"])
    # What is stored is what the model answered: only the rendering shows each once.
    stored = json.loads(run_viano("cat", "--store", store, "BUG-20",
                                  "analysis/hypotheses/0001/hypotheses.json").stdout)
    assert len(stored["hypotheses"][0]["source_ids"]) == \
        many * len(set(stored["hypotheses"][0]["source_ids"]))


def test_report_refusals_and_a_read_only_store(completed_store: Path, tmp_path: Path) -> None:
    r = run_viano("report", "--json", "--store", completed_store, "BUG-20", "--revision", "2")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "unknown_revision"
    r = run_viano("report", "--json", "--store", completed_store, "NOPE")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "unknown_case"
    fresh = tmp_path / "s"
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"title": "t", "body": "b", "case_id": "NEW-1"}))
    assert run_viano("intake", "--store", fresh, "--report", report).returncode == 0
    r = run_viano("report", "--json", "--store", fresh, "NEW-1")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == "no_interpretation"
    make_readonly(completed_store)
    try:
        assert run_viano("report", "--store", completed_store, "BUG-20").returncode == 0
    finally:
        make_writable(completed_store)


def test_an_entry_that_is_not_an_object_is_named_as_such() -> None:
    """A comment given as a number said "argument of type 'int' is not iterable"."""
    from engine import ReportRejected
    from engine._intake._report import parse_native

    with pytest.raises(ReportRejected) as info:
        parse_native({"title": "t", "body": "b", "comments": [1]}, "r.json")
    assert "comments[0]: expected a table (object), got an integer" in info.value.message
