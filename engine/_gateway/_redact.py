"""Secrets never reach a record, an exception message or a log line.

API keys travel only in headers. Before anything is recorded: secret-bearing headers are
dropped, key-like query parameters and URL credentials are masked, and every occurrence of
a known secret is replaced in any text. Providers echo keys in error bodies, and not only
verbatim, so a secret is matched in every form it has been seen to take:

- verbatim, JSON-escaped (``\\/``, ``\\u00xx`` for any character, upper- or lower-case hex,
  doubled backslashes), URL-encoded (``%xx``, also double-encoded ``%25xx``, ``+``) and as
  HTML character references, in any mix;
- cut off: when text is truncated (an audit body limit, an abandoned oversized body), the
  secret is masked *before* the cut, and a tail of the cut text that is the beginning of a
  secret is masked too.

The secrets are the values of the configured key variables, and also whatever a
``base_url`` carries: the values of its key-like query parameters and its userinfo, also
as the Basic credentials httpx makes of it (a redirect's ``Location``, an echoed path or
an echoed header repeats them).

Log records are cleaned when they are made (a record factory), so a message logged by any
logger — ``httpcore.http11`` included, which a filter on ``httpcore`` never sees — is
masked before any handler formats it, exception text included.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "[REDACTED]"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key",
                            "cookie", "set-cookie", "x-goog-api-key", "openai-organization"})
_KEYLIKE = re.compile(r"(key|token|secret|signature|sig|password|auth|credential)",
                      re.IGNORECASE)
MIN_SECRET = 4      # shorter values would mask ordinary text
MIN_PARTIAL = 6     # a cut tail this long that starts a secret is masked


def _char_pattern(ch: str, *, first: bool = False) -> str:
    """Every encoding of one character seen in echoes, as a regex alternation. ``first``:
    the secret's first character, where the search tries every position of the text, so
    its escaped forms start only where a run of backslashes starts (``(?<!\\)``): tried
    at every backslash of a run, ``\\+u0073`` scanned the rest of the run each time, and
    a body of ``\\u`` and 128 KiB of backslashes took 46 s of the event loop. A match
    starting inside a run is also one starting at its first backslash, so none is lost."""
    code = ord(ch)
    forms = [re.escape(ch)]
    run = r"(?<!\\)\\+" if first else r"\\+"
    if code < 0x10000:
        forms.append(rf"{run}u{code:04x}")               # JSON \u00xx (any backslashes)
    if code < 0x80:
        forms.append(rf"%(?:25)*{code:02x}")             # URL %xx, %25xx (double-encoded)
    forms.append(rf"&#(?:x0*{code:x}|0*{code});")        # HTML character references
    if ch == "/":
        forms.append(rf"{run}/")
    if ch == " ":
        forms.append(r"\+")
    if ch in ('"', "\\"):                                # JSON: \" and \\
        forms.append(rf"{run}{re.escape(ch)}")
    if ch in _C_ESCAPES:                                 # JSON and repr: \n \r \t
        forms.append(rf"{run}{_C_ESCAPES[ch]}")
    if code < 0x20 or 0x7f <= code < 0x100:
        forms.append(rf"{run}x{code:02x}")               # a str's repr: \x0b, \xe9
    if code >= 0x80:
        utf8 = ch.encode("utf-8", "surrogatepass")
        forms.append(run + r"\\+".join(f"x{b:02x}" for b in utf8))  # a bytes repr: \xc3\xa9
        forms.append("".join(rf"%(?:25)*{b:02x}" for b in utf8))  # URL-encoded UTF-8
    return "(?:" + "|".join(forms) + ")"


_C_ESCAPES = {"\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f"}


def _secret_pattern(secret: str) -> str:
    return "".join(_char_pattern(c, first=i == 0) for i, c in enumerate(secret))


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()):
        self._secrets: list[str] = []
        self._pattern: re.Pattern[str] | None = None
        # For the pre-check: the secrets in lower case when every one of them is plain
        # (see _cannot_hold_a_secret), else None; and whether one holds a "/". Set with
        # the pattern, as one tuple (text() reads it once, without the lock).
        self._plain: tuple[tuple[str, ...] | None, bool] = ((), False)
        self._lock = threading.Lock()
        for s in secrets:
            self.add(s)

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(self._secrets)

    def add(self, secret: str) -> None:
        if not secret or len(secret) < MIN_SECRET:
            return
        with self._lock:
            if secret in self._secrets:
                return
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)
            alternatives = "|".join(_secret_pattern(s) for s in self._secrets)
            plain = not any(" " in s or not s.isascii() or not s.isprintable() or '"' in s
                            or "\\" in s for s in self._secrets)
            self._plain = (tuple(s.lower() for s in self._secrets) if plain else None,
                           any("/" in s for s in self._secrets))
            self._pattern = re.compile(alternatives, re.IGNORECASE)

    def add_url_secrets(self, url: str) -> None:
        """Learn the secrets a configured URL carries: key-like query values, userinfo."""
        parts = urlsplit(url)
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if _KEYLIKE.search(key):
                self.add(value)
        if parts.password:
            self.add(unquote(parts.password))
        if "@" in parts.netloc:
            userinfo = parts.netloc.rsplit("@", 1)[0]
            self.add(userinfo)
            self.add(unquote(userinfo))
            # httpx sends URL credentials as Basic auth: their base64 is a secret too.
            self.add(base64.b64encode(unquote(userinfo).encode()).decode())

    def text(self, value: str) -> str:
        pattern = self._pattern
        if pattern is None or not value:
            return value
        if self._cannot_hold_a_secret(value):
            return value
        return pattern.sub(MASK, value)

    def _cannot_hold_a_secret(self, value: str) -> bool:
        """A sound pre-check for the common case, a body with no secret in it (the full
        pattern is a long alternation per character; a context of tens of KB took a
        tenth of a case's CPU). Without ``%``, ``\\u`` and ``&#`` in the text, every form
        the pattern matches is the secret itself, in any case, with only ``/`` written
        ``\\/`` (or ``\\\\/``) and a space ``+``; so once those slashes are undone, a
        secret without spaces (and ASCII) can match only as a plain substring, compared
        in lower case after the four letters that IGNORECASE also takes for ASCII ones
        (İ ı for i, K for k, ſ for s) are folded to them."""
        if "%" in value or "&#" in value or "\\u" in value or "\\U" in value:
            return False
        lowered, slashed = self._plain
        if lowered is None:
            return False  # escaped forms (\n, \xc3, %c3) differ from the secret itself
        low = value.lower()
        if any(ch in value for ch in _IGNORECASE_CHARS):  # rare: translate() is slow
            low = value.translate(_IGNORECASE_ASCII).lower()
        if "\\" in low and slashed:
            low = _ESCAPED_SLASH.sub("/", low)
        return not any(s in low for s in lowered)

    def truncate(self, value: str, limit: int) -> str:
        """``value`` cut to ``limit`` characters, masked first, with a trailing fragment
        that begins a secret masked too (it would otherwise survive the cut in part)."""
        return self.mask_partial_tail(self.text(value)[:limit])

    def mask_partial_tail(self, value: str) -> str:
        lowered = value.lower()
        for secret in self._secrets:
            s = secret.lower()
            for n in range(min(len(s), len(value)), MIN_PARTIAL - 1, -1):
                if lowered.endswith(s[:n]):
                    return value[: len(value) - n] + MASK
        return value

    def url(self, value: str) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError on a netloc it cannot parse
        except ValueError:
            return _USERINFO.sub(f"//{MASK}@", self.text(value))
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        netloc = parts.netloc
        keyed = any(_KEYLIKE.search(k) for k, _ in pairs)
        if "@" not in netloc and not keyed:
            return self.text(value)  # nothing to mask by its shape: kept as written
        # Only what is masked is rewritten: a query with no key-like name is kept as
        # written (a socket path in it was percent-encoded into something unreadable).
        query = urlencode([(k, MASK if _KEYLIKE.search(k) else v) for k, v in pairs],
                          safe="[]") if keyed else parts.query
        if "@" in netloc:  # credentials in the URL
            netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
        cleaned = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
        return self.text(cleaned)

    def headers(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
        items = headers.items() if isinstance(headers, Mapping) else headers
        out = {}
        for k, v in items:
            key = k.lower()
            name = self.text(key)  # a name can carry a secret too (`x-<key>: 1`)
            if key in SECRET_HEADERS:
                out[name] = MASK
            elif key in ("location", "content-location", "referer"):
                out[name] = self.url(v)
            else:
                out[name] = self.text(v)
        return out

    def anything(self, value: str) -> str:
        """Free text that may hold URLs (a log message, an exception)."""
        cleaned = self.text(value)
        if "://" in cleaned:
            cleaned = _URL.sub(self._url_in_text, cleaned)
        return cleaned

    def _url_in_text(self, match: re.Match[str]) -> str:
        """A URL found in prose, without the punctuation that ends its sentence or clause
        (``…/db?host=/tmp/pg: terminating`` took the colon, and what the message said
        after it was then encoded into the URL's query)."""
        found = match.group()
        core = found.rstrip(":;,.!?)")  # not "]": the mask ends with one
        return self.url(core) + found[len(core):]


_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_ESCAPED_SLASH = re.compile(r"(?<!\\)\\+/")  # from a run's start: linear (see above)
# The only non-ASCII characters Python's re.IGNORECASE matches to ASCII letters (checked
# over every code point): U+0130 and U+0131 for i, U+212A for k, U+017F for s.
_IGNORECASE_ASCII = {0x130: "i", 0x131: "i", 0x212A: "k", 0x17F: "s"}
_IGNORECASE_CHARS = tuple(chr(c) for c in _IGNORECASE_ASCII)
_USERINFO = re.compile(r"//[^/@\s]*@")

# -- logging ---------------------------------------------------------------------------

_installed: list[Redactor] = []
_previous_factory: Callable[..., logging.LogRecord] | None = None
_factory_lock = threading.Lock()


def _redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    assert _previous_factory is not None
    record = _previous_factory(*args, **kwargs)
    redactors = list(_installed)
    if not redactors:
        return record
    try:
        message = record.getMessage()
    except Exception:  # a broken format string is the logging module's to report
        return record
    cleaned = message
    for r in redactors:
        cleaned = r.anything(cleaned)
    if cleaned != message:
        record.msg, record.args = cleaned, ()
    if record.exc_info:
        text = logging.Formatter().formatException(record.exc_info)
        for r in redactors:
            text = r.anything(text)
        record.exc_text = text
    if record.stack_info:
        for r in redactors:
            record.stack_info = r.anything(record.stack_info)
    return record


class _Installed(logging.Filter):
    """The handle :func:`install_log_filter` returns (kept as a Filter for its callers)."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor


def install_log_filter(redactor: Redactor) -> logging.Filter:
    """Mask ``redactor``'s secrets in every log record made from now on, by any logger."""
    global _previous_factory
    with _factory_lock:
        if not _installed:
            _previous_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_redacting_factory)
        _installed.append(redactor)
    return _Installed(redactor)


def remove_log_filter(handle: logging.Filter) -> None:
    global _previous_factory
    assert isinstance(handle, _Installed)
    with _factory_lock:
        if handle.redactor in _installed:
            _installed.remove(handle.redactor)
        if not _installed and _previous_factory is not None:
            if logging.getLogRecordFactory() is _redacting_factory:
                logging.setLogRecordFactory(_previous_factory)
            _previous_factory = None
