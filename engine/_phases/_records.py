"""Who and when a record says: the names and times Viano writes into the records of a
person's (or a policy's) operations (a confirmation, a reopening, an unblock), one rule
for writing them and for auditing them."""

from __future__ import annotations

import re
import unicodedata

from .._errors import UsageError
from .._store._manifest import is_timestamp
from .._text import is_blank, is_utf8, shows_as_written

_NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")


def person(name: str, what: str = "--by") -> str:
    """A name recorded in an artifact from now on: 1-128 printable characters, not blank
    (nothing in it shows: the rule a model's strings are held to, ``is_blank``), UTF-8
    text, and nothing that shows otherwise than written (a right-to-left override made
    ``\u202elive:ycilop`` read as "policy:evil")."""
    if is_blank(name) or _NAME.fullmatch(name) is None or not is_utf8(name) or \
            not shows_as_written(name):
        raise UsageError(f"{what} must be 1-128 printable characters, not blank, with no "
                         "invisible or direction-changing characters")
    return name


ENGINE_NAMES = frozenset({"policy:auto_confirm"})  # what a policy did, recorded as


def policy_like(name: str) -> bool:
    """Whether ``name`` reads as a ``policy:`` name, the engine's own: compatibility
    forms folded (a fullwidth letter), and what shows as nothing (format characters: a
    zero-width space, an invisible separator) dropped. A rule for what a person gives
    (``--by``), not for records: earlier versions recorded such names."""
    seen = "".join(c for c in unicodedata.normalize("NFKC", name)
                   if unicodedata.category(c) != "Cf")
    return seen.strip().casefold().startswith("policy:")


def recorded_by_ok(name: object) -> bool:
    """Whether a record's "by" (confirmed, reopened or unblocked by) is a name any version
    of Viano could have written: text of 1-128 characters with no control character.
    Looser than :func:`person` on purpose: the rules for new names grew (blank ones,
    ``policy:`` ones, direction-changing characters), and a record written before them
    stays valid."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and is_utf8(name)


def recorded_at_ok(value: object) -> bool:
    """Whether a record's time is one Viano writes: a UTC timestamp (ASCII digits, each
    field in its range), as a manifest's created_at."""
    return isinstance(value, str) and is_timestamp(value)
