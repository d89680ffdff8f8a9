"""The contracted answer: exactly one JSON object, optionally inside a single ``` or
```json fence with only whitespace around it. Anything else — prose around it, two
objects, a top-level list, an empty string — is an invalid answer."""

from __future__ import annotations

import re
from typing import Any

from .._json import UntrustedJson, loads_untrusted

_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?```\s*\Z", re.DOTALL)


class InvalidAnswer(ValueError):
    """The content is not the contracted JSON; ``detail`` is a stable snake_case code."""

    def __init__(self, detail: str, message: str):
        super().__init__(message)
        self.detail = detail


def parse_contracted_json(content: str) -> dict[str, Any]:
    if not content.strip():
        raise InvalidAnswer("empty_content", "the answer is empty")
    fenced = _FENCE.match(content)
    body = fenced.group("body") if fenced else content
    try:
        value = loads_untrusted(body)
    except UntrustedJson as exc:
        detail = "not_json" if exc.detail == "not_json" else f"json_{exc.detail}"
        raise InvalidAnswer(detail, f"the answer is not one acceptable JSON document "
                                    f"({exc})") from exc
    if not isinstance(value, dict):
        raise InvalidAnswer("not_an_object",
                            f"the answer is a JSON {type(value).__name__}, not an object")
    return value
