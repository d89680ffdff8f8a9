"""Jira issues as the REST API returns them (``GET /rest/api/2|3/issue/KEY``).

``key``, ``fields.summary``, ``fields.description``, ``fields.environment``,
``fields.reporter``, ``fields.comment.comments[]`` (``author.displayName``, ``body``,
``created``) and ``fields.attachment[]``. v2 text is wiki markup and is kept as text; v3
text is an Atlassian Document Format document, converted to plain text by :mod:`._adf`
(the catalogue records ``"conversion": "adf-text/N"``, the conversion of the reader that
read it: reader 1 converted by adf-text/1, reader 2 by adf-text/2). Either may appear in
any text field. Other keys are ignored. A blank description makes the summary the
report's text. An author of ``accountType`` ``app`` is a bot (kept, ``human: false``).
Every listed attachment is recorded in the catalogue as referenced; intake marks it
supplied when a file of that name is attached with ``--attach``.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from .._errors import ReportRejected
from .._strict import LENIENT
from .._text import is_blank
from ._adf import VERSIONS, adf_problem, adf_text, is_adf
from ._github import public_url, valid_id
from ._report import Referenced, Report, TextSource, structure

# The ADF conversion each reader version converts by: a reader decides with it which
# texts are blank (a description the conversion makes blank gives the summary instead), so
# the two are one version. Reader 1 converted by adf-text/1.
ADF_BY_READER = {1: 1, 2: 2}  # a released reader's never changes
_CONVERSIONS = {f"adf-text/{v}": v for v in VERSIONS}


def converted(source: TextSource, conversion: Any) -> str | None:
    """``source``'s text by ``conversion`` as a catalogue recorded it (an older version
    of the ADF conversion, say), or ``None`` if that conversion cannot give it (unknown
    to this version, or not one of this node's)."""
    if conversion == source.conversion:
        return source.text
    version = _CONVERSIONS.get(conversion) if isinstance(conversion, str) else None
    if version is None or source.node is None:
        return None
    return adf_text(source.node, version)


@attrs.frozen
class _Person:
    displayName: str | None = None
    name: str | None = None
    accountType: str | None = None
    accountId: Any = None  # read from reader 2 on


@attrs.frozen
class _Comment:
    body: Any = None
    author: _Person | None = None
    created: str | None = None


@attrs.frozen
class _Comments:
    comments: tuple[_Comment, ...] = ()


@attrs.frozen
class _Attachment:
    filename: str
    size: int | None = None
    mimeType: str | None = None


@attrs.frozen
class _Fields:
    summary: str
    description: Any = None
    reporter: _Person | None = None
    comment: _Comments | None = None
    attachment: tuple[_Attachment, ...] = ()
    created: str | None = None
    environment: Any = None


@attrs.frozen
class _Issue:
    fields: _Fields
    key: str | None = None


def _text(value: Any, where: str, label: str, version: int) -> tuple[str | None, str | None]:
    """(plain text, conversion) of a Jira text field: a string, an ADF document (converted
    by ``adf-text/<version>``) or null. The document itself is what a :class:`TextSource`
    keeps as its ``node``."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if is_adf(value):
        problem = adf_problem(value)
        if problem is not None:
            raise ReportRejected(f"{label}: {where}: not a well-formed Atlassian Document "
                                 f"Format document ({problem})")
        return adf_text(value, version), f"adf-text/{version}"
    raise ReportRejected(f"{label}: {where}: expected a string or an Atlassian Document "
                         f"Format document, got {type(value).__name__}")


def _who(person: _Person | None, reader: int) -> str | None:
    """A person's name; from reader 2 on, their account id where Jira gives no name
    (reader 1 made such an author nobody). Never their email address: it would go to the
    model's provider with the rest of the context."""
    if person is None:
        return None
    later = person.accountId if reader >= 2 else None
    return person.displayName or person.name or (
        later if isinstance(later, str) and not is_blank(later) else None)


def _human(person: _Person | None) -> bool:
    return not (person is not None and person.accountType == "app")


def _key_id(key: str) -> str:
    """PROJ-123 as it is; a key that needs cleaning or cutting keeps its number."""
    project, sep, number = key.rpartition("-")
    if sep and number.isascii() and number.isdigit():
        return valid_id(project, f"-{number}", identity=key)
    return valid_id(key, identity=key)


_CUSTOM = re.compile(r"customfield_[0-9]{1,18}")


def parse_jira(data: Any, label: str, reader: int) -> Report:
    """The issue as reader ``reader`` reads it. Reader 2 converts ADF by adf-text/2, adds
    ``fields.environment`` (the reporter's) and every custom field that holds an ADF
    document (a project's "Steps to reproduce") as sources, names an author by account id
    when Jira gives no name, and refuses a ``fields.comments`` list (Jira's are under
    ``fields.comment``)."""
    issue = structure(LENIENT, data, _Issue, label)
    f = issue.fields
    if is_blank(f.summary):
        raise ReportRejected(f"{label}: fields.summary: must not be blank")
    raw_fields = data["fields"]
    if reader >= 2 and "comments" in raw_fields and "comment" not in raw_fields:
        raise ReportRejected(f"{label}: fields.comments: Jira's comments are under "
                             "fields.comment.comments; these would be lost",
                             hint="Export the issue as Jira's REST API returns it, or rename "
                                  "the key to fields.comment: {\"comments\": [...]}.")

    def who(person: _Person | None) -> str | None:
        return _who(person, reader)

    adf = ADF_BY_READER[reader]
    description, conversion = _text(f.description, "fields.description", label, adf)
    if description is None or is_blank(description):
        first = TextSource("report", "/fields/summary", who(f.reporter), f.summary,
                           human=_human(f.reporter))
    else:
        first = TextSource("report", "/fields/description", who(f.reporter), description,
                           human=_human(f.reporter), conversion=conversion,
                           node=f.description if conversion else None)
    texts = [first]
    # Words beside the description: the reporter's about where it happens (versions,
    # browser, OS), and a project's own text fields (whoever last edited those: no
    # author). A custom field that is a plain string is left out: most are ids, ranks and
    # flags.
    more = [("environment", f.environment, f.reporter)] if reader >= 2 else []
    more += [(k, v, None) for k, v in raw_fields.items()
             if reader >= 2 and _CUSTOM.fullmatch(k) and is_adf(v)]
    for name, value, person in more:
        text, conv = _text(value, f"fields.{name}", label, adf)
        if text is not None and not is_blank(text):
            texts.append(TextSource("report", f"/fields/{name}", who(person), text,
                                    human=_human(person), conversion=conv,
                                    node=value if conv else None))
    for i, c in enumerate(f.comment.comments if f.comment else ()):
        body, conv = _text(c.body, f"fields.comment.comments.{i}.body", label, adf)
        if body is None or is_blank(body):
            continue
        texts.append(TextSource("comment", f"/fields/comment/comments/{i}/body",
                                who(c.author), body, human=_human(c.author),
                                conversion=conv, node=c.body if conv else None))
    referenced = tuple(Referenced(f"/fields/attachment/{i}", a.filename, a.size, a.mimeType)
                       for i, a in enumerate(f.attachment))
    key = issue.key if issue.key and not is_blank(issue.key) else None
    url = public_url(data.get("self")) if isinstance(data.get("self"), str) else None
    return Report(format="jira", title=f.summary, texts=tuple(texts),
                  identity=_key_id(key) if key else None,
                  issue={"format": "jira", "key": key, "url": url},
                  referenced=referenced)
