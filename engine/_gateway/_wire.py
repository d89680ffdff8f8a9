"""Wire formats (CONTRACT.md section 4). Secrets go only into headers.

``openai``: ``POST {base_url}/chat/completions`` with ``model``, ``messages`` (system: the
versioned prompt; user: the context JSON) and ``response_format`` json_schema named after the
prompt id; the answer is ``choices[0].message.content``.
``anthropic``: ``POST {base_url}/v1/messages`` with ``anthropic-version``; the answer is the
concatenated text blocks of ``content``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs

from .._config import ProviderConfig
from .._json import UntrustedJson, loads_untrusted

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_MAX_TOKENS = 8192


@attrs.frozen
class Prompt:
    """One model request: the versioned prompt, the context, the answer's schema."""

    prompt_id: str
    system: str
    user: str
    schema: Mapping[str, Any]
    case_id: str = ""


@attrs.frozen
class HttpCall:
    url: str
    headers: Mapping[str, str]   # includes the secret header; never recorded as is
    body: bytes


class EnvelopeError(ValueError):
    """A 2xx whose envelope does not carry an answer where the wire format puts it (on a
    200 an invalid answer; on another 2xx the endpoint is not the API: configuration)."""


def endpoint(base_url: str, path: str) -> str:
    """``base_url`` with ``path`` appended to its path; its query string is kept."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, parts.query,
                       ""))


def build_call(provider: ProviderConfig, secret: str | None, prompt: Prompt) -> HttpCall:
    headers = {"content-type": "application/json", "accept": "application/json",
               "user-agent": "viano/0.1"}
    if provider.kind == "openai":
        body: dict[str, Any] = {
            "model": provider.model,
            "messages": [{"role": "system", "content": prompt.system},
                         {"role": "user", "content": prompt.user}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": prompt.prompt_id, "strict": True, "schema": dict(prompt.schema)}},
        }
        if secret:
            headers["authorization"] = f"Bearer {secret}"
        url = endpoint(provider.base_url, "/chat/completions")
    elif provider.kind == "anthropic":
        body = {"model": provider.model, "max_tokens": ANTHROPIC_MAX_TOKENS,
                "system": prompt.system,
                "messages": [{"role": "user", "content": prompt.user}]}
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if secret:
            headers["x-api-key"] = secret
        url = endpoint(provider.base_url, "/v1/messages")
    else:
        raise ValueError(f"provider kind {provider.kind!r} does not speak HTTP")
    return HttpCall(url=url, headers=headers,
                    body=json.dumps(body, ensure_ascii=False).encode("utf-8"))


def extract_content(kind: str, raw: bytes) -> str:
    """The answer text inside a provider's response body, read as strictly as any JSON
    Viano did not write: deep nesting, duplicate keys (two ``choices``, of which one would
    win silently) and ``NaN`` are a bad envelope, never an internal error."""
    try:
        doc = loads_untrusted(raw)
    except UntrustedJson as exc:
        raise EnvelopeError(f"the response body is not acceptable JSON ({exc})") from exc
    try:
        if kind == "openai":
            content = doc["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise EnvelopeError("choices[0].message.content is not a string")
            return content
        blocks = doc["content"]
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        if not all(isinstance(t, str) for t in texts):
            raise EnvelopeError("a text block is not a string")
        return "".join(texts)
    except (KeyError, IndexError, TypeError) as exc:
        raise EnvelopeError(f"the response has no answer where {kind} puts it") from exc
