"""The human report: JSON ``{"title", "body", "reporter"?, "case_id"?, "comments"?,
"observations"?}`` or UTF-8 text whose first non-blank line is the title.

A file whose first non-blank character is ``{``, or whose name ends in ``.json``, is JSON
and must match that shape exactly: an unknown key, a wrong type, a blank string, a
duplicate key, a lone surrogate or nesting past the JSON reader's depth is refused (a
misspelt ``"comment"`` or a second ``"body"`` would otherwise silently drop human
evidence). A UTF-8 byte-order mark is allowed and ignored (the original is stored with it,
byte for byte). Anything else must be UTF-8 text.
"""

from __future__ import annotations

from typing import Literal

import attrs
import cattrs

from .._errors import ReportRejected
from .._ids import validate_case_id
from .._json import UntrustedJson, loads_untrusted
from .._strict import STRICT, structure_errors


def _not_blank(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value.strip():
        raise ValueError(f"{attribute.name} must not be blank")


@attrs.frozen
class Entry:
    author: str = attrs.field(validator=_not_blank)
    body: str = attrs.field(validator=_not_blank)


@attrs.frozen
class _JsonReport:
    title: str = attrs.field(validator=_not_blank)
    body: str = attrs.field(validator=_not_blank)
    reporter: str | None = None
    case_id: str | None = None
    comments: tuple[Entry, ...] = ()
    observations: tuple[Entry, ...] = ()


@attrs.frozen
class Report:
    format: Literal["json", "text"]
    title: str
    body: str
    reporter: str | None
    case_id: str | None
    comments: tuple[Entry, ...]
    observations: tuple[Entry, ...]


def parse_report(raw: bytes, label: str) -> Report:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportRejected(f"{label}: not UTF-8 (byte {exc.start})") from exc
    text = text.removeprefix("\ufeff")
    if "\x00" in text:
        raise ReportRejected(f"{label}: contains NUL characters; is it a binary file?")
    if text.lstrip().startswith("{") or label.lower().endswith(".json"):
        return _parse_json(text, label)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ReportRejected(f"{label}: the report is empty")
    return Report(format="text", title=lines[0], body=text, reporter=None, case_id=None,
                  comments=(), observations=())


def _parse_json(text: str, label: str) -> Report:
    try:
        data = loads_untrusted(text)
    except UntrustedJson as exc:
        raise ReportRejected(f"{label}: {exc}") from exc
    if not isinstance(data, dict):
        raise ReportRejected(f"{label}: a JSON report must be an object, not a "
                             f"{type(data).__name__}")
    try:
        rep = STRICT.structure(data, _JsonReport)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        details = "; ".join(structure_errors(exc)) if isinstance(
            exc, cattrs.BaseValidationError) else str(exc)
        raise ReportRejected(f"{label}: {details}") from exc
    if rep.case_id is not None:
        validate_case_id(rep.case_id)
    return Report(format="json", title=rep.title, body=rep.body, reporter=rep.reporter,
                  case_id=rep.case_id, comments=rep.comments, observations=rep.observations)
