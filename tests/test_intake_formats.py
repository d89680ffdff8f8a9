"""Intake of GitHub and Jira issues: each shape read as its tool prints it, the original
kept byte for byte, the catalogue pointing into it, bots marked, Jira attachments recorded,
ADF converted deterministically, the case id taken from the issue, and every refusal of
the native format also refused here (nothing written)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from engine import Attachment, IntakeLimits, prepare_intake
from engine._errors import ReportRejected
from engine._intake._adf import adf_text
from engine._intake._formats import parse_report
from engine._intake._github import _User, is_bot, valid_id
from tests.conftest import run_viano
from tests.phase_helpers import interpretation_context

REPORTS = Path(__file__).parent / "fixtures" / "reports"


def _intake(store: Path, report: Path, *extra: str) -> dict[str, Any]:
    r = run_viano("intake", "--json", "--store", store, "--report", report, *extra)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _sources(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["catalogue"]["sources"])


def _context(store_dir: Path, case_id: str) -> dict[str, Any]:
    return json.loads(interpretation_context(store_dir, case_id))  # type: ignore[no-any-return]


def test_gh_issue_view_json(tmp_path: Path) -> None:
    src = REPORTS / "github_gh.json"
    doc = _intake(tmp_path / "s", src)
    assert doc["case_id"] == "acme-org_doc.tool_1287"
    rows = [(s["kind"], s["human"], s["origin"]["pointer"], s.get("minimized"))
            for s in _sources(doc)]
    assert rows == [
        ("report", True, "/body", None),
        ("comment", False, "/comments/0/body", None),  # app/dependabot
        ("comment", False, "/comments/1/body", None),  # ci-helper[bot]
        ("comment", True, "/comments/2/body", None),  # ghost: a deleted account, a person
        ("comment", True, "/comments/3/body", "spam"),  # minimized, kept
        ("comment", False, "/comments/4/body", None),  # is_bot
        ("comment", True, "/comments/5/body", None),  # author null
    ]
    # The original, byte for byte, and the intake record with the issue's origin.
    cat = run_viano("cat", "--store", tmp_path / "s", doc["case_id"], "inputs/github_gh.json")
    assert cat.stdout.encode("utf-8") == src.read_bytes()
    intake = json.loads(run_viano("cat", "--store", tmp_path / "s", doc["case_id"],
                                  "case/intake.json").stdout)
    assert intake["case_id_from"] == "issue"
    assert intake["inputs"][0]["format"] == "github"
    assert intake["issue"] == {"format": "github", "shape": "gh", "number": 1287,
                               "url": "https://github.com/acme-org/doc.tool/issues/1287",
                               "repository": "acme-org/doc.tool"}
    # The phases read the same texts back from the original, hash-checked: the humans'
    # as human texts (the long traceback whole), the bots' as excerpts.
    ctx = _context(tmp_path / "s", doc["case_id"])["untrusted_case_data"]
    human = {t["source_id"]: t for t in ctx["human_texts"]}
    assert list(human) == ["S1", "S4", "S5", "S7"]
    assert "KeyError: 'überschrift'" in human["S1"]["text"] and len(human["S1"]["text"]) > 30000
    assert human["S1"]["author"] == "maria-dev" and human["S7"]["author"] is None
    assert human["S5"]["minimized"] == "spam"
    excerpts = {e["source_id"]: e["text"] for e in ctx["excerpts"]}
    assert excerpts["S2"].startswith("Dependabot: a newer version")
    assert excerpts["S6"] == "Renovate: pinned dependencies."


def test_github_rest_shapes(tmp_path: Path) -> None:
    combined = _intake(tmp_path / "s", REPORTS / "github_rest_combined.json")
    assert combined["case_id"] == "acme-org_doc.tool_77"
    assert [(s["kind"], s["human"], s["origin"]["pointer"]) for s in _sources(combined)] == [
        ("report", True, "/issue/title"),  # body null: the title is the report's text
        ("comment", False, "/comments/0/body"),  # user.type Bot
        ("comment", True, "/comments/1/body"),  # user null: a deleted account
        ("comment", True, "/comments/2/body")]  # unicode and a traceback in a code block
    ctx = _context(tmp_path / "s", combined["case_id"])["untrusted_case_data"]
    assert "再現しました" in ctx["human_texts"][-1]["text"]
    assert "OSError: [Errno 22] Invalid argument: 'ñ.txt'" in ctx["human_texts"][-1]["text"]
    alone = _intake(tmp_path / "t", REPORTS / "github_rest_issue.json")
    assert [s["origin"]["pointer"] for s in _sources(alone)] == ["/body"]
    ctx = _context(tmp_path / "t", alone["case_id"])["untrusted_case_data"]
    assert ctx["human_texts"][0]["text"] == "Opening an empty file crashes.\r\n\r\nVersion 2.0"
    assert ctx["human_texts"][0]["author"] == "sam"


REST_TEXT = {"issue": {"number": 7, "title": "Export hangs", "body": None,
                       "body_text": "Steps: open a 2 GB file.", "user": {"login": "u"},
                       "html_url": "https://github.com/acme/app/issues/7"},
             "comments": [{"body_html": "<p>Same on <b>4.1</b></p>", "user": {"login": "v"}},
                          {"body": "", "body_text": "and on 4.2", "user": {"login": "w"}}]}


@pytest.mark.parametrize("shape", ["combined", "issue alone"])
def test_github_rest_bodies_as_text_or_html_are_read(tmp_path: Path, shape: str) -> None:
    """An issue fetched with the text+json or html+json media type has its text in
    body_text or body_html, not body: its title was its only source, its comments none."""
    data = REST_TEXT if shape == "combined" else REST_TEXT["issue"]
    report = tmp_path / "gh.json"
    report.write_text(json.dumps(data))
    doc = _intake(tmp_path / "s", report, "--format", "github", "--case-id", "GH-7")
    base = "/issue" if shape == "combined" else ""
    expected = [f"{base}/body_text"] + (["/comments/0/body_html", "/comments/1/body_text"]
                                        if shape == "combined" else [])
    assert [s["origin"]["pointer"] for s in _sources(doc)] == expected
    texts = _context(tmp_path / "s", "GH-7")["untrusted_case_data"]["human_texts"]
    assert [(t["text"], t["author"]) for t in texts] == [
        ("Steps: open a 2 GB file.", "u"), ("<p>Same on <b>4.1</b></p>", "v"),
        ("and on 4.2", "w")][:len(expected)]


GH_OTHER_KEYS = {"number": 8, "title": "Crash on save", "body": "It crashes.",
                 "author": {"login": "ana"}, "url": "https://github.com/acme/app/issues/8",
                 "comments": [{"body": "me too", "user": {"login": "renovate[bot]"}}]}
JIRA_NO_NAMES = {"key": "OPS-9", "fields": {
    "summary": "Export hangs", "description": "It hangs.", "environment": "Firefox 130",
    "reporter": {"emailAddress": "ana@example.com", "accountId": "70121:ana"},
    "customfield_10010": {"type": "doc", "content": [{"type": "paragraph", "content": [
        {"type": "text", "text": "1. open a 2 GB file"}]}]},
    "customfield_10011": "0|i0000f:",
    "comment": {"comments": [{"body": "me too", "author": {"accountId": "5b10ac8d"}}]}}}


@pytest.mark.parametrize("data, reader_1, reader_2", [
    (REST_TEXT, [("report", "/issue/title", "Export hangs", "u")],
     [("report", "/issue/body_text", "Steps: open a 2 GB file.", "u"),
      ("comment", "/comments/0/body_html", "<p>Same on <b>4.1</b></p>", "v"),
      ("comment", "/comments/1/body_text", "and on 4.2", "w")]),
    (GH_OTHER_KEYS, [("report", "/body", "It crashes.", "ana"),
                     ("comment", "/comments/0/body", "me too", None)],
     [("report", "/body", "It crashes.", "ana")]),  # the comment is a bot's: no human text
    (JIRA_NO_NAMES, [("report", "/fields/description", "It hangs.", None),
                     ("comment", "/fields/comment/comments/0/body", "me too", None)],
     [("report", "/fields/description", "It hangs.", "70121:ana"),  # never the email
      ("report", "/fields/environment", "Firefox 130", "70121:ana"),
      ("report", "/fields/customfield_10010", "1. open a 2 GB file", None),
      ("comment", "/fields/comment/comments/0/body", "me too", "5b10ac8d")])],
    ids=["github body_text", "github author keys", "jira names and fields"])
def test_each_package_is_read_by_the_reader_that_took_it_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any],
        reader_1: list[tuple[str, str, str, str | None]],
        reader_2: list[tuple[str, str, str, str | None]]) -> None:
    """Reader 2 of GitHub and Jira reads texts and authors reader 1 missed (a REST body as
    text or HTML; an author under the other shape's key, or known by email or account
    id; Jira's environment and ADF custom fields). A package reader 1 took in records no
    reader, and is read again by reader 1: its texts, authors and pinned contexts are what
    they were, so verify still passes. Today's intake records reader 2."""
    import engine._intake._formats as formats
    from tests.test_store_integrity import _publish

    report = tmp_path / "issue.json"
    report.write_text(json.dumps(data))
    fmt = "jira" if "fields" in data else "github"
    with monkeypatch.context() as m:  # an intake by a version before readers
        m.setitem(formats.READERS, fmt, 1)
        plan = prepare_intake(report, [], case_id="OLD-1", limits=IntakeLimits())
    trio.run(_publish, tmp_path / "s", plan)
    doc = _intake(tmp_path / "s", report, "--case-id", "NEW-1")
    for case, expected, recorded in (("OLD-1", reader_1, None), ("NEW-1", reader_2, 2)):
        intake = json.loads(run_viano("cat", "--store", tmp_path / "s", case,
                                      "case/intake.json").stdout)
        assert intake["inputs"][0].get("reader") == recorded
        ctx = _context(tmp_path / "s", case)["untrusted_case_data"]
        pointers = {s["source_id"]: s["origin"]["pointer"] for s in ctx["catalogue"]}
        got = [(t["kind"], pointers[t["source_id"]], t["text"], t["author"])
               for t in ctx["human_texts"]]
        assert got == expected
    assert doc["case_id"] == "NEW-1"
    assert run_viano("verify", "--store", tmp_path / "s").returncode == 0


@pytest.mark.parametrize("data, where", [
    ({"key": "P-1", "fields": {"summary": "s", "description": "d",
                               "comments": [{"body": "lost"}]}}, "fields.comments"),
    ({"title": "t", "body": "b", "author": {"login": "a"},
      "comments": [{"body": "c", "user": "not an object"}]}, "user")],
    ids=["jira comments misspelt", "other author key not a user"])
def test_what_reader_2_reads_it_checks(tmp_path: Path, data: dict[str, Any],
                                       where: str) -> None:
    """What reader 2 reads is held to its type, and Jira comments under a misspelt key
    are refused rather than dropped; nothing is written."""
    report = tmp_path / "r.json"
    report.write_text(json.dumps(data))
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report)
    assert r.returncode == 2, r.stdout
    error = json.loads(r.stdout)["error"]
    assert error["reason"] == "invalid_report" and where in error["message"], error
    assert not (tmp_path / "s").exists() or run_viano(
        "status", "--json", "--store", tmp_path / "s").stdout.count('"case_id"') == 0


def test_a_reader_this_version_does_not_have_is_a_history_problem() -> None:
    raw = json.dumps(GH_OTHER_KEYS).encode()
    assert parse_report(raw, "x.json", "github", reader=1).texts[1].author is None
    assert parse_report(raw, "x.json", "github", reader=2).texts[1].author == "renovate[bot]"
    for reader in (3, 0, "2", True, 2.0):
        with pytest.raises(ReportRejected, match="does not have"):
            parse_report(raw, "x.json", "github", reader=reader)


def test_jira_v2_wiki_text_and_attachments_not_supplied(tmp_path: Path) -> None:
    src = REPORTS / "jira_v2.json"
    doc = _intake(tmp_path / "s", src)
    assert doc["case_id"] == "PAY-314"
    sources = _sources(doc)
    assert [(s["kind"], s["human"]) for s in sources] == [
        ("report", True), ("comment", False), ("comment", True), ("comment", True),
        ("comment", True), ("attachment", False), ("attachment", False)]
    assert sources[5] | {"source_id": "x"} == {
        "source_id": "x", "kind": "attachment", "human": False,
        "origin": {"input": "inputs/jira_v2.json", "pointer": "/fields/attachment/0"},
        "sha256": None, "size": 2048, "media_type": "text/plain", "name": "refund.log",
        "supplied": False}
    ctx = _context(tmp_path / "s", "PAY-314")
    texts = ctx["untrusted_case_data"]["human_texts"]
    wiki = json.loads(src.read_text())["fields"]["description"]
    assert texts[0]["text"] == wiki and texts[0]["author"] == "Kenji Sato"
    assert texts[2]["author"] is None  # an anonymous comment
    skipped = {s["source_id"]: s["reason"] for s in ctx["excerpting"]["not_excerpted"]}
    assert skipped["S6"] == skipped["S7"] == "not_supplied"
    assert "Rounding necessary — ¥ 1 001" in texts[0]["text"] and len(texts[0]["text"]) > 20000
    assert texts[3]["author"] == "Łukasz Żółć" and "{code}Caused by" in texts[3]["text"]


EXPECTED_ADF = """## Steps

1. Open settings
2. Toggle dark mode

   - nested détail

```python
def f():
    raise ValueError('ß')
```

| browser | result |
| Firefox 130 | crash |

See the docs (https://docs.example.com/dark)
@Lena please look 🔥

> quoted log line

panel text

kept words of an unknown node

[media: crash.png]"""


def test_jira_v3_adf_converted_and_a_supplied_attachment(tmp_path: Path) -> None:
    src = REPORTS / "jira_v3.json"
    doc = _intake(tmp_path / "s", src, "--attach", REPORTS / "console.txt")
    sources = _sources(doc)
    assert sources[0]["origin"] == {"input": "inputs/jira_v3.json",
                                    "pointer": "/fields/description",
                                    "conversion": "adf-text/2"}
    assert [s["kind"] for s in sources] == ["report", "comment", "comment", "attachment",
                                            "attachment"]  # the empty ADF comment: none
    assert sources[2]["human"] is False  # accountType app
    assert sources[4]["supplied"] is True and sources[4]["supplied_as"] == "inputs/console.txt"
    ctx = _context(tmp_path / "s", "UI-88")["untrusted_case_data"]
    assert ctx["human_texts"][0]["text"] == EXPECTED_ADF
    assert ctx["human_texts"][1]["text"] == ("Reproduced on 4.1; "
                                             "https://acme.atlassian.net/browse/UI-80")


@pytest.mark.parametrize("sizes, supplied", [((10, 3), [False, True]), ((3, 3), [True, False]),
                                             ((None, 99), [True, False])])
def test_one_file_is_one_listed_attachment(tmp_path: Path, sizes: tuple[int | None, int],
                                           supplied: list[bool]) -> None:
    """Two listed attachments of one name and one file of that name: the file is the one
    whose listed size is its own (3 bytes here), else the first; both were marked
    supplied, so the model was told a 99,999-byte shot was in hand."""
    report = tmp_path / "jira.json"
    report.write_text(json.dumps({"key": "P-2", "fields": {
        "summary": "s", "description": "d",
        "attachment": [{"filename": "shot.png", "size": n} for n in sizes]}}))
    shot = tmp_path / "shot.png"
    shot.write_bytes(b"png")
    doc = _intake(tmp_path / "s", report, "--attach", shot)
    listed = [s for s in _sources(doc) if s["origin"].get("pointer", "").startswith(
        "/fields/attachment/")]
    assert [s["supplied"] for s in listed] == supplied
    assert [s.get("supplied_as") for s in listed if s["supplied"]] == ["inputs/shot.png"]


def test_adf_conversion_is_deterministic_and_keeps_content() -> None:
    doc = json.loads((REPORTS / "jira_v3.json").read_text())["fields"]["description"]
    assert adf_text(doc) == adf_text(json.loads(json.dumps(doc))) == EXPECTED_ADF
    nested = {"type": "doc", "content": [{"type": "bulletList", "content": [
        {"type": "listItem", "content": [
            {"type": "paragraph", "content": [{"type": "text", "text": "a"}]},
            {"type": "orderedList", "attrs": {"order": 3}, "content": [
                {"type": "listItem", "content": [
                    {"type": "codeBlock", "content": [{"type": "text",
                                                       "text": "x = 1\n```y```"}]}]}]}]}]}]}
    assert adf_text(nested) == "- a\n\n  3. ````\n     x = 1\n     ```y```\n     ````"


# What adf-text/1 dropped: a task list nested in a task list (ADF's indentation of task
# items) lost its done marks, and a block macro without a body (an `extension`) lost its
# text and parameters; an inline one its parameters.
DROPPED_BY_1 = {"type": "doc", "content": [
    {"type": "taskList", "content": [
        {"type": "taskItem", "attrs": {"state": "DONE"},
         "content": [{"type": "text", "text": "repro on 4.1"}]},
        {"type": "taskList", "content": [
            {"type": "taskItem", "attrs": {"state": "DONE"},
             "content": [{"type": "text", "text": "with cache"}]},
            {"type": "taskItem", "attrs": {"state": "TODO"},
             "content": [{"type": "text", "text": "without cache"}]}]}]},
    {"type": "extension", "attrs": {
        "extensionKey": "jira-chart", "text": "Burndown",
        "parameters": {"macroParams": {"title": {"value": "Crash rate by build"}}}}},
    {"type": "paragraph", "content": [{"type": "inlineExtension", "attrs": {
        "extensionKey": "status-macro", "parameters": {"colour": "red", "label": "BLOCKER"}}}]}]}
AS_BY_1 = "- [x] repro on 4.1\n- with cache\n\n  without cache\n\nstatus-macro"
AS_BY_2 = ("- [x] repro on 4.1\n  - [x] with cache\n  - [ ] without cache\n\n"
           "Burndown Crash rate by build\n\nstatus-macro red BLOCKER")


# More of what adf-text/1 dropped: a card given by its JSON-LD data instead of a URL, an
# external media's URL, a bodied macro's parameters (its title it kept; the editor's
# macroMetadata is no one's words).
DROPPED_BY_2 = {"type": "doc", "content": [
    {"type": "paragraph", "content": [
        {"type": "text", "text": "see "},
        {"type": "inlineCard", "attrs": {"data": {"@type": "Document", "name": "Runbook 12",
                                                  "url": "https://wiki.example/rb12"}}}]},
    {"type": "blockCard", "attrs": {"data": {"name": "Crash dashboard"}}},
    {"type": "mediaSingle", "content": [{"type": "media", "attrs": {
        "type": "external", "url": "https://img.example/trace.png"}}]},
    {"type": "bodiedExtension", "attrs": {
        "extensionKey": "expand-macro", "parameters": {"macroParams": {
            "title": {"value": "Full stack trace"}, "lines": {"value": 40}},
        "macroMetadata": {"macroId": {"value": "6a1e-uuid"}}}, "title": "Trace"},
     "content": [{"type": "paragraph", "content": [{"type": "text", "text": "at main()"}]}]}]}
AS_BY_1_OF_2 = "see \n\n[media: media]\n\nTrace\n\nat main()"  # the cards were empty
AS_BY_2_OF_2 = ("see Runbook 12 https://wiki.example/rb12\n\nCrash dashboard\n\n"
                "[media: https://img.example/trace.png]\n\nTrace\n\nFull stack trace 40"
                "\n\nat main()")


def test_adf_conversion_2_keeps_what_1_dropped_and_1_stays_as_released() -> None:
    assert adf_text(DROPPED_BY_1, 1) == AS_BY_1
    assert adf_text(DROPPED_BY_1) == adf_text(DROPPED_BY_1, 2) == AS_BY_2
    assert adf_text(DROPPED_BY_2, 1) == AS_BY_1_OF_2
    assert adf_text(DROPPED_BY_2) == adf_text(DROPPED_BY_2, 2) == AS_BY_2_OF_2
    # Version 1 of what both convert alike is what it always was.
    doc = json.loads((REPORTS / "jira_v3.json").read_text())["fields"]["description"]
    assert adf_text(doc, 1) == adf_text(doc, 2) == EXPECTED_ADF
    with pytest.raises(ValueError, match="unknown ADF conversion"):
        adf_text(doc, 3)


def _jira_v3(path: Path, description: Any, environment: Any = None) -> Path:
    fields = {"summary": "Export hangs", "description": description,
              "reporter": {"displayName": "Ana"}}
    if environment is not None:
        fields["environment"] = environment
    path.write_text(json.dumps({"key": "OPS-7", "fields": fields}))
    return path


def test_a_recorded_conversion_unknown_here_is_refused_not_replaced() -> None:
    from engine._intake import converted

    report = parse_report(json.dumps({"key": "OPS-7", "fields": {
        "summary": "s", "description": DROPPED_BY_1}}).encode(), "x.json")
    text = report.by_pointer()["/fields/description"]
    assert converted(text, "adf-text/2") == AS_BY_2
    assert converted(text, "adf-text/1") == AS_BY_1
    for unknown in ("adf-text/9", None, 1, ["adf-text/1"]):  # a newer Viano's, or damage
        assert converted(text, unknown) is None


@pytest.mark.parametrize("environment", [
    "Firefox 130 on Windows 11, build 4.1.2",
    {"type": "doc", "content": [{"type": "paragraph", "content": [
        {"type": "text", "text": "Firefox 130 on Windows 11, build 4.1.2"}]}]}],
    ids=["v2-text", "v3-adf"])
def test_jira_environment_is_a_source(tmp_path: Path, environment: Any) -> None:
    """fields.environment is the reporter's own words (versions, browser, OS): it was
    not catalogued, so the model never saw it."""
    doc = _intake(tmp_path / "s", _jira_v3(tmp_path / "ops.json", "It hangs.", environment))
    sources = _sources(doc)
    assert [(s["kind"], s["origin"]["pointer"]) for s in sources] == [
        ("report", "/fields/description"), ("report", "/fields/environment")]
    texts = _context(tmp_path / "s", "OPS-7")["untrusted_case_data"]["human_texts"]
    assert [(t["text"], t["author"]) for t in texts] == [
        ("It hangs.", "Ana"), ("Firefox 130 on Windows 11, build 4.1.2", "Ana")]


@pytest.mark.parametrize("name", ["github_gh.json", "github_rest_combined.json",
                                  "github_rest_issue.json", "jira_v2.json", "jira_v3.json"])
def test_detected_and_named_formats_agree(name: str) -> None:
    raw = (REPORTS / name).read_bytes()
    fmt = "jira" if name.startswith("jira") else "github"
    detected = parse_report(raw, name)
    assert detected.format == fmt
    assert parse_report(raw, name, fmt) == detected
    other = "github" if fmt == "jira" else "jira"
    with pytest.raises(ReportRejected):
        parse_report(raw, name, other)
    assert parse_report(raw, name, "text").texts[0].text == raw.decode("utf-8")


def test_bots_in_every_form_github_shows_them() -> None:
    assert is_bot(_User(login="x", is_bot=True))
    assert is_bot(_User(login="x", type="Bot"))
    assert is_bot(_User(login="renovate[bot]"))
    assert is_bot(_User(login="app/github-actions"))
    assert not is_bot(_User(login="robotics-fan")) and not is_bot(None)
    assert not is_bot(_User(login="x", type="User", is_bot=False))


def test_case_ids_from_issue_identity() -> None:
    assert valid_id("acme_rocket", "_42") == "acme_rocket_42"
    long = valid_id("o" * 50 + "_" + "r" * 50, "_123456")
    assert re.fullmatch(r"o+_123456-[0-9a-f]{8}", long) and len(long) == 64
    cleaned = valid_id("-weird/owner name_repo", "_1")  # cleaned: so the identity's hash
    assert re.fullmatch(r"weird-owner-name_repo_1-[0-9a-f]{8}", cleaned)
    assert valid_id("PAY-314") == "PAY-314"


@pytest.mark.parametrize(("label", "doc", "reason", "needle"), [
    ("gh title not a string", {"title": 5, "author": {"login": "a"}}, "invalid_report",
     "title"),
    ("gh title blank", {"title": "  ", "author": {"login": "a"}}, "invalid_report", "title"),
    ("gh no title", {"author": {"login": "a"}, "body": "x"}, "invalid_report", "title"),
    ("gh comments not a list", {"title": "t", "author": {"login": "a"}, "comments": "c"},
     "invalid_report", "comments"),
    ("gh comment author login int", {"title": "t", "comments": [
        {"author": {"login": 7}, "body": "b"}]}, "invalid_report", "login"),
    ("gh is_bot not a bool", {"title": "t", "author": {"login": "a", "is_bot": "yes"}},
     "invalid_report", "is_bot"),
    ("rest body not a string", {"issue": {"title": "t", "body": ["b"]}}, "invalid_report",
     "body"),
    ("jira no summary", {"key": "A-1", "fields": {"description": "d"}}, "invalid_report",
     "summary"),
    ("jira summary blank", {"key": "A-1", "fields": {"summary": "\u200b"}}, "invalid_report",
     "summary"),
    ("jira description a number", {"key": "A-1", "fields": {"summary": "s",
                                                            "description": 3}},
     "invalid_report", "description"),
    ("jira attachment size text", {"fields": {"summary": "s", "attachment": [
        {"filename": "a", "size": "big"}]}}, "invalid_report", "size"),
    ("unknown shape", {"name": "x", "value": 1}, "unknown_format", "viano, github, jira"),
    ("two shapes", {"fields": {"summary": "s"}, "author": {"login": "a"}, "title": "t"},
     "ambiguous_format", "(jira, github)"),
    # A native report with one GitHub-like key: read as GitHub, its observation, case id
    # and reporter were dropped with exit 0.
    ("native with a github key", {"title": "t", "body": "b", "case_id": "BUG-77",
                                  "observations": [{"author": "qa", "body": "5/5"}],
                                  "labels": ["bug"]}, "ambiguous_format", "github, viano"),
    ("native reporter with a url", {"title": "t", "body": "b", "reporter": "qa",
                                    "url": "https://x.example/1"}, "ambiguous_format",
     "github, viano"),
    # A GitLab issue (its text is in "description", it has no "body"): read as GitHub,
    # the description was dropped with exit 0.
    ("gitlab issue", {"id": 84, "iid": 14, "title": "Crash", "description": "Steps: …",
                      "state": "opened", "author": {"id": 1, "username": "jdoe"}},
     "unknown_format", "description"),
    ("gitlab-like rest combined", {"issue": {"title": "Crash", "description": "d"},
                                   "comments": []}, "unknown_format", "description"),
])
def test_refusals_write_nothing(tmp_path: Path, label: str, doc: dict[str, Any], reason: str,
                                needle: str) -> None:
    report = tmp_path / "issue.json"
    report.write_text(json.dumps(doc))
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report)
    assert r.returncode == 2, (label, r.stdout, r.stderr)
    error = json.loads(r.stdout)["error"]
    assert error["reason"] == reason, (label, error)
    assert needle in error["message"] + error["hint"], (label, error)
    assert not (tmp_path / "s").exists()


def test_a_json_list_without_an_extension_is_json(tmp_path: Path) -> None:
    """``gh issue list --json …`` saved as ``issues``: taken in as a text report titled
    with its line of JSON. It is JSON, and refused as a list (as issues.json is)."""
    report = tmp_path / "issues"
    report.write_text('[{"number":5,"title":"Crash on save","body":"It crashes."}]\n')
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report)
    assert r.returncode == 2, r.stdout
    assert json.loads(r.stdout)["error"]["reason"] == "invalid_report", r.stdout
    assert not (tmp_path / "s").exists()
    # A text report whose title starts with "[" is still text.
    report.write_text("[Bug] it crashes on start\n\nSteps: open it.\n")
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("fmt", ["github", "jira"])
def test_deep_nesting_duplicate_keys_and_bytes_refused(tmp_path: Path, fmt: str) -> None:
    deep = '{"title": "t", "fields": {"summary": "s", "x": ' + "[" * 200 + "]" * 200 + "}}"
    dup = ('{"title": "t", "title": "u", "author": {"login": "a"}}' if fmt == "github" else
           '{"key": "A-1", "fields": {"summary": "s", "summary": "t"}}')
    for i, text in enumerate([deep, dup]):
        report = tmp_path / f"r{i}.json"
        report.write_text(text)
        r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report,
                      "--format", fmt)
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["reason"] == \
            "invalid_report", r.stdout
    report = tmp_path / "latin1.json"
    report.write_bytes('{"title": "caf\xe9"}'.encode("latin-1"))
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report,
                  "--format", fmt)
    assert r.returncode == 2 and "UTF-8" in json.loads(r.stdout)["error"]["message"]
    assert not (tmp_path / "s").exists()


def test_a_catalogue_that_no_longer_matches_its_original_is_a_history_problem() -> None:
    """The phases parse the stored original again with the recorded format: a text that
    differs from the catalogue's hash does not pass (what an edited import would show)."""
    raw = (REPORTS / "jira_v3.json").read_bytes()
    plan = prepare_intake(REPORTS / "jira_v3.json", [Attachment("attachment",
                                                                REPORTS / "console.txt")],
                          case_id=None, limits=IntakeLimits())
    first = plan.catalogue["sources"][0]
    edited = raw.replace(b"Toggle dark mode", b"Toggle dark mode!")
    again = parse_report(edited, "x", "jira").by_pointer()[first["origin"]["pointer"]]
    import hashlib
    assert hashlib.sha256(again.text.encode()).hexdigest() != first["sha256"]
    assert hashlib.sha256(parse_report(raw, "x", "jira").texts[0].text.encode()
                          ).hexdigest() == first["sha256"]


def _refused(tmp_path: Path, doc: Any, *extra: str) -> dict[str, Any]:
    report = tmp_path / "hostile.json"
    report.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    r = run_viano("intake", "--json", "--store", tmp_path / "s", "--report", report, *extra)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert not (tmp_path / "s").exists()
    return dict(json.loads(r.stdout)["error"])


def _jira_with(description: Any) -> dict[str, Any]:
    return {"key": "X-1", "fields": {"summary": "s", "description": description}}


@pytest.mark.parametrize(("label", "adf"), [
    ("marks not a list", {"type": "doc", "content": [
        {"type": "paragraph", "content": [{"type": "text", "text": "a", "marks": 5}]}]}),
    ("content an object", {"type": "doc", "content": [
        {"type": "paragraph", "content": {"type": "text", "text": "lost"}}]}),
    ("text not a string", {"type": "doc", "content": [
        {"type": "paragraph", "content": [{"type": "text", "text": 7}]}]}),
    ("attrs not an object", {"type": "doc", "content": [
        {"type": "heading", "attrs": [1], "content": []}]}),
    ("a node without a type", {"type": "doc", "content": [{"content": []}]}),
])
def test_malformed_adf_is_refused_not_half_converted(tmp_path: Path, label: str,
                                                     adf: dict[str, Any]) -> None:
    error = _refused(tmp_path, _jira_with(adf))
    assert error["reason"] == "invalid_report", (label, error)
    assert "Atlassian Document Format" in error["message"], (label, error)


def test_hostile_numbers_in_adf_and_urls_are_no_crash(tmp_path: Path) -> None:
    """Values a reader turns into numbers (a heading level, a list start, an issue number
    in a URL) are bounded: a superscript digit or 5,000 digits is no crash."""
    adf = {"type": "doc", "content": [
        {"type": "heading", "attrs": {"level": "²"}, "content": [{"type": "text",
                                                                   "text": "H"}]},
        {"type": "heading", "attrs": {"level": "9" * 5000}, "content": []},
        {"type": "orderedList", "attrs": {"order": 10**30}, "content": [
            {"type": "listItem", "content": [{"type": "paragraph", "content": [
                {"type": "text", "text": "item"}]}]}]}]}
    doc = _intake(tmp_path / "a", _write(tmp_path, "j.json", _jira_with(adf)))
    assert doc["case_id"] == "X-1"
    gh = {"title": "t", "author": {"login": "a"},
          "url": "https://github.com/a/b/issues/" + "9" * 5000}
    doc = _intake(tmp_path / "b", _write(tmp_path, "g.json", gh))
    assert doc["case_id"].startswith("case-")  # no issue identity in that URL


def _write(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return path


def test_adf_keeps_cards_captions_placeholders_and_escapes_table_cells() -> None:
    doc = {"type": "doc", "content": [
        {"type": "blockCard", "attrs": {"url": "https://x.example/card"}},
        {"type": "mediaSingle", "content": [
            {"type": "media", "attrs": {"alt": "shot.png"}},
            {"type": "caption", "content": [{"type": "text", "text": "the crash dialog"}]}]},
        {"type": "paragraph", "content": [{"type": "placeholder", "attrs": {"text": "fill"}},
                                          {"type": "text", "text": " done"}]},
        {"type": "table", "content": [{"type": "tableRow", "content": [
            {"type": "tableCell", "content": [{"type": "paragraph", "content": [
                {"type": "text", "text": "a|b"}]}]},
            {"type": "tableCell", "content": [{"type": "codeBlock", "content": [
                {"type": "text", "text": "x\ny"}]}]}]}]}]}
    assert adf_text(doc) == ("https://x.example/card\n\n[media: shot.png] the crash dialog"
                             "\n\nfill done\n\n| a\\|b | ``` ⏎ x ⏎ y ⏎ ``` |")
    code = {"type": "doc", "content": [
        {"type": "codeBlock", "attrs": {"language": "py\n```\nEVIL"}, "content": [
            {"type": "text", "text": "line1"}, {"type": "hardBreak"},
            {"type": "text", "text": "x = '```'"}]},
        {"type": "table", "content": [{"type": "tableRow", "content": [
            {"type": "tableCell", "content": [{"type": "paragraph", "content": [
                {"type": "text", "text": "c\\|d"}]}]}]}]}]}
    assert adf_text(code) == ("````pyEVIL\nline1\nx = '```'\n````\n\n| c\\\\\\|d |")


def test_issue_ids_never_collide_because_names_were_cut_or_cleaned() -> None:
    def gh_id(url: str) -> str | None:
        return parse_report(json.dumps({"title": "t", "url": url}).encode(), "x.json",
                            "github").identity

    a = gh_id("https://github.com/acme/web_app/issues/1")
    b = gh_id("https://ghe.example/acme_web/app/issues/1")
    assert a == "acme_web_app_1" and b is not None and b != a
    # Another host never takes github.com's id, and a changed id never looks exact: it
    # ends in its hash, an exact one in its number.
    other_host = gh_id("https://ghe.corp.example/acme/web_app/issues/1")
    assert other_host not in (a, None) and re.fullmatch(r".*_1-[0-9a-f]{8}", other_host)
    crafted = gh_id(f"https://github.com/a/b_c-{str(b)[-8:]}/issues/1")
    assert crafted != b
    long_a = gh_id(f"https://github.com/org/{'x' * 70}-alpha/issues/2")
    long_b = gh_id(f"https://github.com/org/{'x' * 70}-beta/issues/2")
    assert long_a != long_b and long_a and long_b and "_2-" in long_a
    assert len(long_a) == 64
    assert gh_id("https://github.com/a/b/issues/\u0663") is None  # not an ASCII number

    def jira_id(key: str) -> str | None:
        return parse_report(json.dumps({"key": key, "fields": {"summary": "s"}}).encode(),
                            "x.json", "jira").identity

    assert jira_id("PAY-314") == "PAY-314"
    one, two = jira_id("P" * 70 + "-1"), jira_id("P" * 70 + "-2")
    assert one != two and one and two and "-1-" in one and "-2-" in two
    huge = jira_id("PROJ-" + "1" * 60)  # a number too long to keep: still a valid id
    assert huge and re.fullmatch(r"issue-[0-9a-f]{24}", huge)

    def rest_id(number: int) -> str | None:
        return parse_report(json.dumps({"title": "t", "number": number, "user": {"login": "u"},
                                        "repository_url": "https://api.github.com/repos/a/b"}
                                       ).encode(),
                            "x.json", "github").identity

    assert rest_id(5) == "a_b_5" and rest_id(-5) is None and rest_id(0) is None


def test_credentials_in_issue_urls_are_not_recorded(tmp_path: Path) -> None:
    from engine._intake._github import public_url

    assert public_url("HTTPS://bob:s3cr3t@jira.example/rest/api/2/issue/1") == \
        "HTTPS://jira.example/rest/api/2/issue/1"
    assert public_url("https://u:p@ss@github.com/a/b/issues/1") == \
        "https://github.com/a/b/issues/1"
    assert public_url("https://github.com/a/b/issues/1?x=a@b") == \
        "https://github.com/a/b/issues/1?x=a@b"
    gh = {"title": "t", "author": {"login": "a"},
          "url": "https://bob:ghp_SECRET@github.com/acme/rocket/issues/9"}
    doc = _intake(tmp_path / "s", _write(tmp_path, "g.json", gh))
    intake = run_viano("cat", "--store", tmp_path / "s", doc["case_id"], "case/intake.json")
    assert "ghp_SECRET" not in intake.stdout
    assert json.loads(intake.stdout)["issue"]["url"] == \
        "https://github.com/acme/rocket/issues/9"


def test_the_model_sees_what_a_jira_attachment_is(tmp_path: Path) -> None:
    doc = _intake(tmp_path / "s", REPORTS / "jira_v2.json")
    catalogue = _context(tmp_path / "s", doc["case_id"])["untrusted_case_data"]["catalogue"]
    assert catalogue[5]["name"] == "refund.log" and catalogue[5]["supplied"] is False
    assert "name" not in catalogue[0]  # added only where a catalogue has it


def test_a_title_cannot_print_lines_of_its_own(tmp_path: Path) -> None:
    report = _write(tmp_path, "r.json", {"title": "t\ncase ADMIN-1: spoofed", "body": "b"})
    r = run_viano("intake", "--store", tmp_path / "s", "--report", report)
    assert r.returncode == 0
    assert not any(line.startswith("case ADMIN-1") for line in r.stdout.splitlines())
    assert "t\\x0acase ADMIN-1: spoofed" in r.stdout
