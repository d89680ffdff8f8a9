"""GitHub issues, as ``gh`` prints them and as the REST API returns them.

* ``gh issue view N --json number,title,body,author,comments,labels,url,createdAt``:
  camelCase; ``author`` is ``{"login", "is_bot"?, "name"?}``; comments carry ``author``,
  ``body``, ``createdAt``, ``url`` and, for hidden ones, ``isMinimized`` and
  ``minimizedReason``.
* REST: the issue object of ``GET /repos/O/R/issues/N`` (snake_case, ``user.login``,
  ``user.type``, ``html_url``), alone, or as one combined document
  ``{"issue": <issue>, "comments": <the array of GET /repos/O/R/issues/N/comments>}``.
  A comments file beside the issue is not read: combine them into one document, so that
  the stored original holds every text the catalogue points into.

Keys this reader does not use are ignored (both tools print more than a report needs);
the ones it uses must have their exact types. A blank issue body makes the title the
report's text (its ``title``); blank comments are left out of the catalogue. A deleted
author (``null``, GitHub's ``ghost``) is kept as written. Bots are kept and marked
``human: false``: ``is_bot``, a REST ``user.type`` of ``Bot``, a login ending in ``[bot]``
or starting with ``app/``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import attrs

from .._errors import ReportRejected
from .._strict import LENIENT
from .._text import is_blank
from ._report import Report, TextSource, structure


@attrs.frozen
class _User:
    login: str | None = None
    is_bot: bool | None = None
    type: str | None = None


@attrs.frozen
class _GhComment:
    body: str
    author: _User | None = None
    user: Any = None  # the REST shape's key (hand-combined): read from reader 2 on
    createdAt: str | None = None
    url: str | None = None
    isMinimized: bool | None = None
    minimizedReason: str | None = None


@attrs.frozen
class _GhIssue:
    title: str
    body: str | None = None
    author: _User | None = None
    number: int | None = None
    url: str | None = None
    createdAt: str | None = None
    comments: tuple[_GhComment, ...] = ()


@attrs.frozen
class _RestComment:
    body: str | None = None
    body_text: Any = None  # read from reader 2 on, as body_html
    body_html: Any = None
    user: _User | None = None
    author: Any = None  # gh's key (hand-combined): read from reader 2 on
    created_at: str | None = None
    html_url: str | None = None


@attrs.frozen
class _RestIssue:
    title: str
    body: str | None = None
    body_text: Any = None  # read from reader 2 on, as body_html
    body_html: Any = None
    user: _User | None = None
    number: int | None = None
    html_url: str | None = None
    repository_url: str | None = None
    created_at: str | None = None


@attrs.frozen
class _Combined:
    issue: _RestIssue
    comments: tuple[_RestComment, ...] = ()


def is_bot(user: _User | None) -> bool:
    if user is None:
        return False
    login = user.login or ""
    return (user.is_bot is True or user.type == "Bot" or login.endswith("[bot]")
            or login.startswith("app/"))


_WEB = re.compile(r"(?i)https?://([^/\s]+)/([^/\s]+)/([^/\s]+)/(?:issues|pull)/"
                  r"([0-9]{1,18})(?:[/?#]|$)")
_API = re.compile(r"(?i)https?://([^/\s]+)/repos/([^/\s]+)/([^/\s]+?)/?$")
_GITHUB_HOSTS = ("github.com", "api.github.com")


def _identity(web_url: str | None, repository_url: str | None, number: int | None
              ) -> tuple[str | None, dict[str, Any]]:
    host = owner = repo = None
    if number is not None and not 0 < number < 10**18:
        number = None
    if web_url and (m := _WEB.match(web_url)):
        host, owner, repo, number = m.group(1), m.group(2), m.group(3), int(m.group(4))
    elif repository_url and (m := _API.match(repository_url)):
        host, owner, repo = m.group(1), m.group(2), m.group(3)
    issue: dict[str, Any] = {"number": number, "url": public_url(web_url)}
    if host is None or owner is None or repo is None or number is None:
        return None, issue
    host = host.rsplit("@", 1)[-1].lower()
    issue["repository"] = f"{owner}/{repo}"
    # On github.com owners have no "_", so owner_repo_N names one issue; another host, or
    # an owner with a "_", gets the identity's hash (host included), so neither
    # ghe.example/acme/app#1 nor acme_web/app#1 can take github.com's ids.
    exact = host in _GITHUB_HOSTS and "_" not in owner
    return valid_id(f"{owner}_{repo}", f"_{number}", identity=f"{host}/{owner}/{repo}#{number}",
                    exact=exact), issue


def public_url(url: str | None) -> str | None:
    """``url`` without user information (``https://user:token@host/…``, any scheme, any
    case, a password with ``@`` in it): a credential pasted into an issue's URL is not
    copied into the case's records."""
    if not url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rsplit('@', 1)[-1]}{slash}{path}"


_INVALID = re.compile(r"[^A-Za-z0-9._-]+")


def valid_id(stem: str, suffix: str = "", *, identity: str | None = None,
             exact: bool = True) -> str:
    """``stem + suffix`` made a valid case id: other characters become ``-``, it starts
    with a letter or digit, and a stem too long is cut so that the suffix (the number,
    which tells issues apart) survives. Whenever that changed anything (or ``exact`` is
    false), ``-`` and 8 hex of the sha256 of ``identity`` (the issue's full identity, host
    included) go after the number: an exact id ends in its number, a changed one never
    does, so no exact id can look like a changed one, and two issues never share an id
    because their names were cut or cleaned. A suffix too long to keep (a number of dozens
    of digits) gives ``issue-`` and a longer hash."""
    clean = _INVALID.sub("-", stem).lstrip("._-") or "issue"
    suffix = _INVALID.sub("-", suffix)
    digest = hashlib.sha256((identity or stem + suffix).encode("utf-8")).hexdigest()
    if len(suffix) > 24:
        return f"issue-{digest[:24]}"
    changed = not exact or clean != stem or len(clean) + len(suffix) > 64
    if not changed:
        return clean + suffix
    tag = "-" + digest[:8]
    return clean[: 64 - len(tag) - len(suffix)].rstrip("._-") + suffix + tag


Bodies = Sequence[tuple[str, str | None]]  # (pointer, text): the first not blank is read


def _first(bodies: Bodies) -> tuple[str, str] | None:
    return next(((p, t) for p, t in bodies if t is not None and not is_blank(t)), None)


def _texts(title: str, bodies: Bodies, base: str, author: _User | None,
           comments: Sequence[tuple[Bodies, _User | None, tuple[tuple[str, str], ...]]],
           ) -> tuple[TextSource, ...]:
    login = author.login if author else None
    human = not is_bot(author)
    body = _first(bodies)
    if body is None:
        first = TextSource("report", f"{base}/title", login, title, human=human)
    else:
        first = TextSource("report", body[0], login, body[1], human=human)
    out = [first]
    for texts, user, marks in comments:
        found = _first(texts)
        if found is None:
            continue
        out.append(TextSource("comment", found[0], user.login if user else None, found[1],
                              human=not is_bot(user), marks=marks))
    return tuple(out)


def _rest_bodies(base: str, x: _RestIssue | _RestComment, reader: int) -> Bodies:
    """Where a REST issue's or comment's text is, in order. From reader 2 on, an issue
    fetched as ``text+json`` or ``html+json`` is read from ``body_text`` or ``body_html``
    when ``body`` is missing or blank (reader 1 took the title, and no comment)."""
    bodies: list[tuple[str, str | None]] = [(f"{base}/body", x.body)]
    if reader >= 2:  # a value that is not a string holds no text: passed over, as null
        bodies += [(f"{base}/{key}", v) for key in ("body_text", "body_html")
                   if isinstance(v := getattr(x, key), str)]
    return bodies


def _minimized(c: _GhComment) -> tuple[tuple[str, str], ...]:
    if c.isMinimized:
        return (("minimized", (c.minimizedReason or "yes").lower()),)
    return ()


def _require_body(data: Any, label: str) -> None:
    """An issue whose text is a ``description``, with no ``body``, is not GitHub's (a
    GitLab issue): read as one, its description was silently dropped."""
    if isinstance(data, dict) and "body" not in data and "description" in data:
        raise ReportRejected(f"{label}: an issue whose text is a 'description' and which has "
                             "no 'body' is not a GitHub issue (a GitLab one?); its text "
                             "would be lost", reason="unknown_format",
                             hint="Give it as a Viano report {\"title\", \"body\"} or as "
                                  "text.")


def _either(first: _User | None, other: Any, reader: int, where: str) -> _User | None:
    """A comment's author under its shape's key, or (reader 2 on) under the other
    shape's: reader 1 read only its shape's, so such a comment had no author, and a bot
    there was taken for a person. Reader 1 never looked at the other key, so what it
    holds is checked only from reader 2 on (a stored report it read stays readable)."""
    if first is not None or reader < 2 or other is None:
        return first
    return structure(LENIENT, other, _User, where)


def parse_gh(data: Any, label: str, reader: int) -> Report:
    _require_body(data, label)
    issue = structure(LENIENT, data, _GhIssue, label)
    _check_title(issue.title, label)
    identity, origin = _identity(issue.url, None, issue.number)
    comments = [([(f"/comments/{i}/body", c.body)],
                 _either(c.author, c.user, reader, f"{label}: comments.{i}.user"),
                 _minimized(c)) for i, c in enumerate(issue.comments)]
    return Report(format="github", title=issue.title,
                  texts=_texts(issue.title, [("/body", issue.body)], "", issue.author,
                               comments),
                  identity=identity, issue={"format": "github", "shape": "gh", **origin})


def parse_rest(data: Any, label: str, reader: int) -> Report:
    combined = isinstance(data, dict) and "issue" in data
    _require_body(data["issue"] if combined else data, label)
    if combined:
        doc = structure(LENIENT, data, _Combined, label)
        issue, rest_comments, base = doc.issue, doc.comments, "/issue"
    else:
        issue, rest_comments, base = structure(LENIENT, data, _RestIssue, label), (), ""
    _check_title(issue.title, label)
    identity, origin = _identity(issue.html_url, issue.repository_url, issue.number)
    comments = [(_rest_bodies(f"/comments/{i}", c, reader),
                 _either(c.user, c.author, reader, f"{label}: comments.{i}.author"), ())
                for i, c in enumerate(rest_comments)]
    return Report(format="github", title=issue.title,
                  texts=_texts(issue.title, _rest_bodies(base, issue, reader), base,
                               issue.user, comments),
                  identity=identity,
                  issue={"format": "github", "shape": "rest-combined" if combined else "rest",
                         **origin})


def _check_title(title: str, label: str) -> None:
    if is_blank(title):
        raise ReportRejected(f"{label}: title: must not be blank")
