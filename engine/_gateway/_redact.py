"""Secrets never reach a record, an exception message or a log line.

API keys travel only in headers. Before anything is recorded: secret-bearing headers are
dropped, key-like query parameters are masked, and every occurrence of a known secret value
is replaced in any text (providers echo keys in error bodies). The ``httpx``/``httpcore``
loggers get a filter that applies the same masking to their messages (httpx logs full URLs).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "[REDACTED]"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key",
                            "cookie", "set-cookie", "x-goog-api-key", "openai-organization"})
_KEYLIKE = re.compile(r"(key|token|secret|signature|sig|password|auth)", re.IGNORECASE)


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()):
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str) -> None:
        if secret and len(secret) >= 4 and secret not in self._secrets:
            self._secrets.append(secret)
            self._secrets.sort(key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def url(self, value: str) -> str:
        parts = urlsplit(value)
        query = [(k, MASK if _KEYLIKE.search(k) else v)
                 for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        netloc = parts.netloc
        if "@" in netloc:  # credentials in the URL
            netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
        cleaned = urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="[]"),
                              parts.fragment))
        return self.text(cleaned)

    def headers(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
        items = headers.items() if isinstance(headers, Mapping) else headers
        return {k.lower(): (MASK if k.lower() in SECRET_HEADERS else self.text(v))
                for k, v in items}


class _LogFilter(logging.Filter):
    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = self.redactor.url(message) if "://" in message else message
        cleaned = self.redactor.text(cleaned)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


def install_log_filter(redactor: Redactor) -> logging.Filter:
    """Mask secrets in what httpx and httpcore log; returns the filter for removal."""
    flt = _LogFilter(redactor)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).addFilter(flt)
    return flt


def remove_log_filter(flt: logging.Filter) -> None:
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).removeFilter(flt)
