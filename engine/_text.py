"""Text that came from outside, made safe to show.

:func:`terminal_safe` is applied to everything the CLI prints that a user, a report or a
model wrote (titles, names, paths, messages): C0 and C1 control characters, DEL and the
Unicode bidirectional overrides are shown as visible escapes, so a title cannot move the
cursor, recolour the terminal or reorder what follows it.

:func:`markdown_inline` and :func:`markdown_block` escape model and reporter text for the
Markdown artifacts (``summary.md``, ``hypotheses.md``, ``viano report``): no link, image,
HTML, heading, list, table, emphasis or mention survives as markup.
"""

from __future__ import annotations

import re

# C0 (except the caller's choice of \n and \t), DEL, C1, and the bidi controls
# (LRM/RLM/ALM, embeddings and overrides LRE..RLO, isolates LRI..PDI).
# ... and lone surrogates (what a non-UTF-8 file name decodes to), which no terminal can show.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")
_UNSAFE_ALL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                         "\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character escaped (newlines and tabs kept if
    ``multiline``)."""
    pattern = _UNSAFE if multiline else _UNSAFE_ALL
    return pattern.sub(_escape, text)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~>=\"'&:@$%^])")


def markdown_inline(text: str) -> str:
    """One line of model text as inert Markdown: every markup character backslash-escaped,
    line breaks and control characters folded to visible escapes, ``@``/``#`` escaped so
    that no mention or issue reference is created when posted to GitHub or Jira."""
    flat = " ".join(terminal_safe(text, multiline=True).split())
    return _MD_SPECIAL.sub(r"\\\1", flat)


def markdown_block(text: str) -> str:
    """A paragraph of model text, escaped like :func:`markdown_inline` line by line; blank
    lines are kept as paragraph breaks."""
    lines = terminal_safe(text, multiline=True).replace("\t", " ").splitlines()
    out = [_MD_SPECIAL.sub(r"\\\1", " ".join(line.split())) for line in lines]
    return "\n".join(out).strip("\n")
