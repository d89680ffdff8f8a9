"""The human report, whatever its shape: the texts it holds, each with its place in the
original file, and the issue's own identity.

Every format (:mod:`._formats` picks one) turns the original bytes into one :class:`Report`.
Intake catalogues its texts; the phases parse the stored original again with the format
intake recorded and check each text against the catalogue's hash, so the original file
stays the only copy of the human evidence.

The native formats are here:

* ``json`` (``--format viano``): ``{"title", "body", "reporter"?, "case_id"?,
  "comments"?, "observations"?}``, matched exactly: an unknown key, a wrong type, a blank
  string, a duplicate key, a lone surrogate or nesting past the JSON reader's depth is
  refused (a misspelt ``"comment"`` or a second ``"body"`` would otherwise silently drop
  human evidence).
* ``text``: UTF-8 text whose first non-blank line is the title; the whole file is the
  report's one source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs

from .._errors import ReportRejected
from .._ids import validate_case_id
from .._strict import STRICT, structure_errors
from .._text import is_blank

T = TypeVar("T")


@attrs.frozen
class TextSource:
    """One human (or bot) text of a report. ``pointer`` is an RFC 6901 pointer into the
    original JSON (``None``: the whole file); ``marks`` are extra catalogue fields, such as
    ``("minimized", "outdated")``; ``conversion`` names how ``text`` was derived from the
    node the pointer names, when it is not that node's string (``adf-text/3``), and
    ``node`` is then that node, to convert again by the conversion a catalogue recorded."""

    kind: str
    pointer: str | None
    author: str | None
    text: str
    human: bool = True
    marks: tuple[tuple[str, str], ...] = ()
    conversion: str | None = None
    node: Any = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Referenced:
    """An attachment the report names but the user did not supply (Jira's
    ``fields.attachment``)."""

    pointer: str
    name: str
    size: int | None
    media_type: str | None


@attrs.frozen
class Report:
    format: str  # as recorded in case/intake.json: json, text, github, jira
    title: str
    texts: tuple[TextSource, ...]
    case_id: str | None = None  # an id the report asks for explicitly (native only)
    identity: str | None = None  # the issue's own identity, made a valid case id
    issue: Mapping[str, Any] | None = None  # where the issue came from, for intake.json
    referenced: tuple[Referenced, ...] = ()

    def by_pointer(self) -> dict[str | None, TextSource]:
        return {t.pointer: t for t in self.texts}


def _not_blank(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if is_blank(value):
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


NATIVE_KEYS = frozenset(attrs.fields_dict(_JsonReport))


def structure(converter: cattrs.Converter, data: Any, cls: type[T], label: str) -> T:
    """``data`` as ``cls``, or a refusal naming each bad key by its path."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        details = "; ".join(structure_errors(exc)) if isinstance(
            exc, cattrs.BaseValidationError) else str(exc)
        raise ReportRejected(f"{label}: {details}") from exc


def parse_native(data: Any, label: str) -> Report:
    rep = structure(STRICT, data, _JsonReport, label)
    if rep.case_id is not None:
        validate_case_id(rep.case_id)
    texts = [TextSource("report", "/body", rep.reporter, rep.body)]
    texts += [TextSource("comment", f"/comments/{i}/body", c.author, c.body)
              for i, c in enumerate(rep.comments)]
    texts += [TextSource("observation", f"/observations/{i}/body", o.author, o.body)
              for i, o in enumerate(rep.observations)]
    return Report(format="json", title=rep.title, texts=tuple(texts), case_id=rep.case_id)


def parse_text(text: str, label: str) -> Report:
    # Blank as a reader sees it: a line of only a no-break and a zero-width space was the
    # title, which showed as nothing.
    lines = [ln.strip() for ln in text.splitlines() if not is_blank(ln)]
    if not lines:
        raise ReportRejected(f"{label}: the report is empty")
    return Report(format="text", title=lines[0],
                  texts=(TextSource("report", None, None, text),))
