"""Reading JSON that Viano did not write: reports, export indexes and manifests, model answers.

``json.loads`` alone accepts things a user never meant and crashes on others:

- duplicate keys are resolved silently (the last one wins), so ``{"body": "a", "body": "b"}``
  would drop human evidence;
- ``NaN``/``Infinity`` are accepted although they are not JSON;
- ``"\\ud800"`` decodes to a lone surrogate, which later fails to encode as UTF-8;
- deep nesting raises ``RecursionError`` (an internal error) or, just under the limit,
  builds values that later recursive code cannot walk;
- a 5,000-digit integer raises ``ValueError`` (Python's digit limit), and ``1e400`` parses
  to ``inf``: numbers no contract means.

:func:`loads_untrusted` refuses each of those with an :class:`UntrustedJson` carrying a
stable ``detail`` code, so every caller turns it into its own refusal (``invalid_report``,
``invalid_export``, an invalid model answer) instead of an internal error.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64
MAX_DIGITS = 40  # larger than any count, size or time Viano reads; smaller than any DoS
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Where a parsed string can get a lone surrogate from: a raw one in text given as str
# (UTF-8 bytes cannot hold one), or a \uD800-\uDFFF escape. A match here (an escaped
# backslash before "ud8" included) only means the full check runs.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class UntrustedJson(ValueError):
    """The text is not acceptable JSON; ``detail`` is a stable snake_case code."""

    def __init__(self, detail: str, message: str):
        super().__init__(message)
        self.detail = detail


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise UntrustedJson("duplicate_key", f"duplicate key {key!r}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise UntrustedJson("invalid_constant", f"{name} is not a JSON value")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise UntrustedJson("number_too_large", f"an integer of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or len(text) > 4 * MAX_DIGITS:
        raise UntrustedJson("number_too_large", f"the number {text[:20]}… is not finite")
    return value


# One decoder for every call (json.loads builds a new one per call when given hooks: 0.8%
# of the engine's CPU under py-spy). Its only state between calls is the C scanner's key
# memo, which interns keys and is cleared after each document.
_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant,
                            parse_int=_int, parse_float=_float)


def loads_untrusted(data: bytes | bytearray | memoryview | str, *,
                    max_depth: int = MAX_DEPTH) -> Any:
    """Parse one JSON document strictly (see the module docstring)."""
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UntrustedJson("not_utf8", f"not UTF-8 (byte {exc.start})") from exc
    else:
        text = data
    try:
        if text.startswith("\ufeff"):  # what json.loads says before it decodes
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)",
                                       text, 0)
        value = _DECODER.decode(text)
    except UntrustedJson:
        raise
    except RecursionError as exc:
        raise UntrustedJson("too_deep", f"nested deeper than {max_depth} levels") from exc
    except json.JSONDecodeError as exc:
        raise UntrustedJson("not_json", f"not valid JSON ({exc.msg} at line {exc.lineno} "
                                        f"column {exc.colno})") from exc
    except ValueError as exc:  # anything else the decoder refuses to build
        raise UntrustedJson("not_json", f"not acceptable JSON ({exc})") from exc
    if (text is data and _SURROGATE.search(text)) or _ESCAPED_SURROGATE.search(text):
        check_tree(value, max_depth=max_depth)
    elif text.count("[") + text.count("{") > max_depth:  # fewer cannot nest deeper
        _check_depth(value, max_depth)
    return value


def _check_depth(value: Any, max_depth: int) -> None:
    """check_tree's depth rule alone, over the containers json.loads built (no string
    can hold a surrogate: the caller looked at the text)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    containers = (dict, list)
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise UntrustedJson("too_deep", f"nested deeper than {max_depth} levels")
        depth += 1
        for child in item.values() if type(item) is dict else item:
            if type(child) in containers:
                stack.append((child, depth))


def check_tree(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings holding lone surrogates.

    Iterative, so that a value built elsewhere cannot overflow the stack here either."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise UntrustedJson("lone_surrogate", "a string holds a lone UTF-16 "
                                                      "surrogate, which is not text")
            continue
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise UntrustedJson("too_deep", f"nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    stack.append((key, depth))
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
