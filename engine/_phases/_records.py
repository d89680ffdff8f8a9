"""Who and when a record says: the names and times Viano writes into the records of a
person's (or a policy's) operations (a confirmation, a reopening, an unblock), one rule
for writing them and for auditing them."""

from __future__ import annotations

import re
import unicodedata

from .._errors import UsageError
from .._store._manifest import TIMESTAMP
from .._text import is_blank, is_utf8

_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")


def person(name: str, what: str = "--by") -> str:
    """A name recorded in an artifact: 1-128 printable characters, not blank (nothing in
    it shows: the rule a model's strings are held to, ``is_blank``), UTF-8 text."""
    if is_blank(name) or _NAME.fullmatch(name) is None or not is_utf8(name):
        raise UsageError(f"{what} must be 1-128 printable characters, not blank")
    return name


ENGINE_NAMES = frozenset({"policy:auto_confirm"})  # what a policy did, recorded as


def policy_like(name: str) -> bool:
    """Whether ``name`` reads as a ``policy:`` name, the engine's own: compatibility
    forms folded (a fullwidth letter), and what shows as nothing (format characters: a
    zero-width space, an invisible separator) dropped."""
    seen = "".join(c for c in unicodedata.normalize("NFKC", name)
                   if unicodedata.category(c) != "Cf")
    return seen.strip().casefold().startswith("policy:")


def recorded_by_ok(name: object) -> bool:
    """Whether a record's "by" (confirmed, reopened or unblocked by) is one Viano writes:
    a person's name as ``person`` takes it, or exactly one of the engine's own names. An
    import carried "policy:evil" with a right-to-left override, which the report then
    showed as a policy's."""
    if not isinstance(name, str):
        return False
    if name in ENGINE_NAMES:
        return True
    try:
        person(name)
    except UsageError:
        return False
    return not policy_like(name)


def recorded_at_ok(value: object) -> bool:
    """Whether a record's time is one Viano writes (a manifest's created_at rule)."""
    return isinstance(value, str) and TIMESTAMP.fullmatch(value) is not None
