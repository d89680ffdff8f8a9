"""Strict checking of a model's answer, collecting every problem with its rule and the JSON
pointer of the offending value (no coercion: ``"S1"`` is not ``["S1"]``, ``1`` is not
``"1"``, ``true`` is not a count). Used by every phase's validator; pure."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .._text import is_blank
from ._spec import Problem

MISSING: Any = object()  # what ``get(key, MISSING)`` gives for an absent key (already reported)


MAX_MESSAGE = 300
MAX_POINTER = 200


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class Checker:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, rule: str, pointer: str, message: str) -> None:
        """One problem. Its message and pointer quote the model's own values (an id, a
        key), so they are cut to a few hundred characters: a 5,000-character "source id"
        was echoed whole into the result, the rejection and the terminal."""
        self.problems.append(Problem(rule, _cut(pointer, MAX_POINTER), _cut(message,
                                                                            MAX_MESSAGE)))

    def object(self, value: Any, pointer: str, *, required: Collection[str],
               forbidden: Collection[str] = ()) -> dict[str, Any] | None:
        """``value`` as an object with exactly the ``required`` keys; any other key is
        ``forbidden_field`` if listed, else ``unknown_field``."""
        if not isinstance(value, dict):
            self.add("wrong_type", pointer or "/", f"expected an object, got "
                                                   f"{_type(value)}")
            return None
        for key in value:
            if key not in required:
                rule = "forbidden_field" if key.lower() in forbidden else "unknown_field"
                what = ("is not accepted from the model" if rule == "forbidden_field"
                        else "is not part of the contract")
                self.add(rule, f"{pointer}/{_escape(key)}", f"{key!r} {what}")
        for key in required:
            if key not in value:
                self.add("missing_field", f"{pointer}/{_escape(key)}", f"{key!r} is missing")
        return value

    def text(self, value: Any, pointer: str) -> str | None:
        if value is MISSING:
            return None
        if not isinstance(value, str):
            self.add("wrong_type", pointer, f"expected a string, got {_type(value)}")
            return None
        if is_blank(value):
            self.add("blank_string", pointer, "the string is blank (nothing in it shows: "
                                              "whitespace, invisible or control characters)")
            return None
        return value

    def array(self, value: Any, pointer: str, *, nonempty: bool,
              empty_rule: str = "empty_list") -> list[Any] | None:
        if value is MISSING:
            return None
        if not isinstance(value, list):
            self.add("wrong_type", pointer, f"expected a list, got {_type(value)}")
            return None
        if nonempty and not value:
            self.add(empty_rule, pointer, "the list must not be empty")
        return value

    def strings(self, value: Any, pointer: str, *, nonempty: bool,
                empty_rule: str = "empty_list") -> list[str] | None:
        items = self.array(value, pointer, nonempty=nonempty, empty_rule=empty_rule)
        if items is None:
            return None
        out = []
        for i, item in enumerate(items):
            text = self.text(item, f"{pointer}/{i}")
            if text is not None:
                out.append(text)
        return out


def _type(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
