"""Which format a report is in, and reading it as that format.

``--format`` names it (``viano``, ``github``, ``jira``, ``text``); without it the content
decides. A file whose first non-blank character is ``{``, or whose name ends in
``.json``, is JSON; anything else is text. A JSON object is:

* ``jira`` if it has a ``fields`` object;
* ``github`` if it has a top-level ``issue`` object (the combined REST document), or any
  of the keys only GitHub's shapes have (``author``, ``user``, ``number``, ``url``,
  ``html_url``, ``createdAt``, ``created_at``, ``labels``, ``state``), or comments whose
  authors are objects;
* ``viano`` if every key is one of the native report's, or if it is neither of the others
  and has a ``title`` or ``body`` (a misspelt key is then refused by name).

Exactly one must match: none is refused as an unknown shape, more than one as
ambiguous, each naming the formats so that the user can say which with ``--format``.
"""

from __future__ import annotations

from typing import Any

from .._errors import ReportRejected
from .._json import UntrustedJson, loads_untrusted
from ._github import parse_gh, parse_rest
from ._jira import parse_jira
from ._report import NATIVE_KEYS, Report, parse_native, parse_text

FORMATS = ("viano", "github", "jira", "text")
# The version of each format's reader that intake uses now, recorded with the input
# (``"reader"`` in case/intake.json; none recorded is version 1). The phases read a stored
# report again by the version that read it at intake: the audit derives each pinned
# context again, so a reader that now reads an author or a text differently would
# otherwise break every older package. A released version never changes.
READERS = {"github": 2, "jira": 2}
# What case/intake.json records for each (the native JSON report was "json" before
# formats existed; old packages keep reading the same).
RECORDED = {"viano": "json", "github": "github", "jira": "jira", "text": "text"}
_GITHUB_ONLY = frozenset({"author", "user", "number", "url", "html_url", "createdAt",
                          "created_at", "labels", "state", "node_id"})


def _hint() -> str:
    return ("Name the format with --format " + "|".join(FORMATS) + ": viano is "
            '{"title", "body", "comments"?, ...}; github is what `gh issue view --json` '
            "or the REST API prints; jira is the REST issue JSON (v2 or v3).")


def detect_json(data: dict[str, Any]) -> list[str]:
    found = []
    if isinstance(data.get("fields"), dict):
        found.append("jira")
    comments = data.get("comments")
    object_authors = isinstance(comments, list) and any(
        isinstance(c, dict) and isinstance(c.get("author"), dict) for c in comments)
    if isinstance(data.get("issue"), dict) or _GITHUB_ONLY & data.keys() or object_authors:
        found.append("github")
    # Keys only a native report has (its human observations, its case id) make it one
    # too: with a GitHub-like key beside them it is ambiguous, not a GitHub issue whose
    # reader drops them (an observation and the case id were lost with exit 0).
    native_only = data.keys() & (NATIVE_KEYS - {"title", "body", "comments"})
    if not object_authors and (data.keys() <= NATIVE_KEYS or native_only or (
            not found and data.keys() & {"title", "body"})):
        # A native report with a misspelt key is still native: its reader names the key.
        found.append("viano")
    return found


def decode(raw: bytes, label: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportRejected(f"{label}: not UTF-8 (byte {exc.start})") from exc
    text = text.removeprefix("\ufeff")
    if "\x00" in text:
        raise ReportRejected(f"{label}: contains NUL characters; is it a binary file?")
    return text


def parse_report(raw: bytes, label: str, fmt: str | None = None, *,
                 json_only: bool = False, reader: Any = None) -> Report:
    """The report in ``raw``, read as ``fmt`` (one of :data:`FORMATS`, or a recorded
    name) or as the content says. ``json_only``: never text (a line of a JSON Lines file).
    ``reader``: the version of the format's reader (:data:`READERS`), as recorded at
    intake; ``None`` is today's for a new report, and an unknown one is refused.
    Refuses (``ReportRejected``) anything else."""
    fmt = {"json": "viano"}.get(fmt or "", fmt)
    if fmt is not None and fmt not in FORMATS:
        raise ReportRejected(f"{label}: unknown report format {fmt!r}", hint=_hint())
    text = decode(raw, label)
    if fmt == "text" and json_only:
        raise ReportRejected(f"{label}: a line of a JSON Lines file is JSON, not text",
                             hint="Give text reports as files of a folder.")
    if fmt == "text":
        return parse_text(text, label)
    looks_json = json_only or text.lstrip().startswith("{") or label.lower().endswith(
        (".json", ".jsonl"))
    # A gh issue list's output saved without an extension was taken as a text report
    # titled with its line of JSON (as .json it is refused: not an object). It is JSON
    # only if it parses: "[Bug] it crashes" is a text report's title.
    maybe_json = fmt is None and not looks_json and text.lstrip().startswith("[")
    if fmt is None and not looks_json and not maybe_json:
        return parse_text(text, label)
    try:
        data = loads_untrusted(text)
    except UntrustedJson as exc:
        if maybe_json:
            return parse_text(text, label)
        raise ReportRejected(f"{label}: {exc}", hint=_hint()) from exc
    if not isinstance(data, dict):
        raise ReportRejected(f"{label}: a JSON report must be an object, not a "
                             f"{type(data).__name__}", hint=_hint())
    if fmt is None:
        found = detect_json(data)
        if not found:
            keys = ", ".join(sorted(data)[:8]) or "none"
            raise ReportRejected(f"{label}: not a report in any known format "
                                 f"({', '.join(FORMATS)}); its keys: {keys}",
                                 reason="unknown_format", hint=_hint())
        if len(found) > 1:
            raise ReportRejected(f"{label}: the shape fits more than one format "
                                 f"({', '.join(found)})", reason="ambiguous_format",
                                 hint=_hint())
        fmt = found[0]
    version = _reader(fmt, reader, label)
    try:
        if fmt == "jira":
            return parse_jira(data, label, version)
        if fmt == "github":
            gh = "author" in data or "createdAt" in data or (
                "issue" not in data and "user" not in data and "html_url" not in data)
            return parse_gh(data, label, version) if gh else parse_rest(data, label, version)
        return parse_native(data, label)
    except ReportRejected as exc:
        if fmt == "viano" or exc.hint != ReportRejected.default_hint:
            raise
        raise ReportRejected(exc.message, reason=exc.reason, hint=_hint()) from exc
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        # A shape no reader foresaw is that report's refusal, never a crash of the intake
        # (or of a whole --batch); the readers refuse what they know by name.
        raise ReportRejected(f"{label}: cannot be read as a {fmt} report "
                             f"({type(exc).__name__}: {str(exc)[:200]})", hint=_hint()) from exc


def _reader(fmt: str, reader: Any, label: str) -> int:
    latest = READERS.get(fmt, 1)
    if reader is None:
        return latest
    if type(reader) is not int or not 1 <= reader <= latest:
        raise ReportRejected(f"{label}: read at intake by {fmt} reader {reader!r}, which "
                             "this version of Viano does not have",
                             hint="Use the Viano version that took the case in, or a newer "
                                  "one.")
    return reader
