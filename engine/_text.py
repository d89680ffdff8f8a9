"""Text that came from outside, made safe to show.

:func:`terminal_safe` is applied to everything the CLI prints that a user, a report or a
model wrote (titles, names, paths, messages): C0 and C1 control characters, DEL and the
Unicode bidirectional overrides are shown as visible escapes, so a title cannot move the
cursor, recolour the terminal or reorder what follows it.

:func:`markdown_inert` and :func:`markdown_inert_block` escape model and reporter text for
what people read and post (``summary.md``, ``hypotheses.md``, ``viano report``): no link,
image, HTML, heading, list, table, emphasis, Jira macro or mention survives as markup, on
GitHub or in Jira. :func:`markdown_inline` and :func:`markdown_block` are the weaker
escaping of the first packages (a ``@`` of an e-mail address still autolinked, a list
could nest): kept so that those packages' artifacts still audit as what they were.
"""

from __future__ import annotations

import re
import unicodedata

# C0 (except the caller's choice of \n and \t), DEL, C1, and the bidi controls
# (LRM/RLM/ALM, embeddings and overrides LRE..RLO, isolates LRI..PDI).
# ... and lone surrogates (what a non-UTF-8 file name decodes to), which no terminal can show;
# and what shows as nothing or breaks a line where the terminal does not: Unicode's format
# characters (zero-width space, soft hyphen, word joiner, invisible operators, the
# deprecated format controls, BOM, interlinear annotations, tags) and the line and
# paragraph separators. (ZWNJ and ZWJ stay: scripts and emoji need them.)
_SHOWS_NOTHING = ("\u00ad\u180e\u200b\u2028\u2029\u2060-\u2064\u206a-\u206f\ufeff"
                  "\ufff9-\ufffb\U000e0001\U000e0020-\U000e007f")
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     f"\u2066-\u2069\ud800-\udfff{_SHOWS_NOTHING}]")
_UNSAFE_ALL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                         f"\u2066-\u2069\ud800-\udfff{_SHOWS_NOTHING}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shows_as_written(text: str) -> bool:
    """Whether ``text`` holds nothing :func:`terminal_safe` would escape: no control,
    bidirectional or invisible character (a name reversed by a right-to-left override
    reads as another)."""
    return _UNSAFE_ALL.search(text) is None


def terminal_safe(text: str, *, multiline: bool = False) -> str:
    """``text`` with every control character escaped (newlines and tabs kept if
    ``multiline``)."""
    pattern = _UNSAFE if multiline else _UNSAFE_ALL
    return pattern.sub(_escape, text)


# Characters that start markup anywhere in a line: code, emphasis, strike, links and
# images, HTML and entities, tables, headings and issue references, mentions.
_MD_SPECIAL = re.compile(r"([\\`*_~\[\]<>&|#@])")
# What starts markup only at the beginning of a line: lists, quotes, setext headings.
_MD_LINE_START = re.compile(r"^(\s*)(\d+)([.)])|^(\s*)([-+=>])")
# Bare URLs that GitHub and Jira link on their own.
_MD_AUTOLINK = re.compile(r"(?i)(://|www\.)")


def _md_line(line: str, *, starts_line: bool) -> str:
    line = _MD_SPECIAL.sub(r"\\\1", line)
    line = _MD_AUTOLINK.sub(lambda m: m.group().replace(":", "\\:").replace(".", "\\."),
                            line)
    if not starts_line:
        return line
    return _MD_LINE_START.sub(lambda m: (f"{m.group(1)}{m.group(2)}\\{m.group(3)}"
                                         if m.group(2) else f"{m.group(4)}\\{m.group(5)}"),
                              line)


def markdown_inline(text: str) -> str:
    """One line of model text as inert Markdown, for use after a prefix on a line (a list
    marker, a label): every markup character backslash-escaped, line breaks and control
    characters folded to visible escapes, ``@``/``#`` escaped so that no mention or issue
    reference is created when posted to GitHub or Jira, and bare URLs broken so that they
    are not linked."""
    return _md_line(" ".join(terminal_safe(text, multiline=True).split()), starts_line=False)


def markdown_block(text: str) -> str:
    """A paragraph of model text, escaped like :func:`markdown_inline` line by line; blank
    lines are kept as paragraph breaks."""
    lines = terminal_safe(text, multiline=True).replace("\t", " ").splitlines()
    return "\n".join(_md_line(" ".join(line.split()), starts_line=True)
                     for line in lines).strip("\n")


_WJ = "\u2060"
# Jira wiki markup (!image!, {macro}, ^sup^, +under+, -strike-, ??cite??), GitHub's math
# ($x$) and what GitHub starts blocks with.
_JIRA = re.compile(r"([!{}^+=$?-])")
# Jira's emoticons, (x) (y) (on) (*r) (!) … and :) ;) :D :P, by the character that starts
# them (all brackets escaped would make every "(I4)" read "\(I4\)").
_EMOTICON = re.compile(r"(?i)\((?=(?:y|n|i|x|on|off|flag|flagoff|\*[rgby]?|\\?[/!+?*-])\))"
                       r"|[:;](?=[()DPp])")
_LINE_START = re.compile(r"^(\d+|h[1-6]|bq)([.)])", re.IGNORECASE)  # 1. / 1) / h1. / bq.
# ASCII boundaries, not \b: "éabcdef1" is a commit id to a matcher that knows only ASCII.
_LINKED = re.compile(r"(?i)(?<![0-9a-z])(?:gh-[0-9]+|[0-9a-f]{7,40})(?![0-9a-z])")


def _inert(segment: str) -> str:
    out = _JIRA.sub(r"\\\1", _md_line(segment, starts_line=False))
    out = _EMOTICON.sub(lambda m: "\\" + m.group(), out)
    return out.replace("\\@", f"\\@{_WJ}").replace("\\#", f"\\#{_WJ}")


def markdown_inert(text: str) -> str:
    """One line of untrusted text as Markdown that stays inert where it is posted, on
    GitHub or in Jira: :func:`markdown_inline`'s escapes, plus Jira wiki markup's
    characters (``!image!``, ``{macro}``, ``-strike-``, ``+under+``, ``^sup^``, the start of
    an emoticon such as ``(x)`` or ``:)``) and a
    line-starting ``1.``/``h1.``, a word joiner after ``@`` and ``#`` (GitHub mentions and
    references are made after escapes are undone), and what GitHub links by itself
    (``GH-123``, 7 to 40 hex digits of a commit) as inline code, which it never links."""
    flat = " ".join(terminal_safe(text, multiline=True).split())
    return flat if _already_inert(flat) else _escaped(flat)


# Any character an escape below acts on, and the two autolink openings.
_TRIGGER = re.compile(r"[\\`*_~\[\]<>&|#@!{}^+=$?-]|://|(?i:www\.)")


def _already_inert(flat: str) -> bool:
    """Would :func:`_escaped` give ``flat`` back unchanged? Exactly when nothing of what it
    escapes is there: four scans instead of its eight substitutions, for the model's
    plain sentences (2.4x faster on the bench's answers, 1.04-1.11x on real reports' lines;
    tested equal to the full escape on real and random text)."""
    return (_TRIGGER.search(flat) is None and _EMOTICON.search(flat) is None
            and _LINKED.search(flat) is None and _LINE_START.match(flat) is None)


def _escaped(flat: str) -> str:
    parts, last = [], 0
    for m in _LINKED.finditer(flat):  # GitHub links these in plain text: code spans
        parts += [_inert(flat[last:m.start()]), f"`{m.group()}`"]
        last = m.end()
    parts.append(_inert(flat[last:]))
    return _LINE_START.sub(r"\1\\\2", "".join(parts))




def markdown_code(text: str) -> str:
    """An id of ours (a case id: letters, digits, ``.``, ``_``, ``-``) as inline code: inert
    everywhere, a hex run in it included."""
    return f"`{text.replace('`', '')}`"


def markdown_inert_block(text: str) -> str:
    """A paragraph of untrusted text, line by line as :func:`markdown_inert`; blank lines
    are kept as paragraph breaks."""
    lines = terminal_safe(text, multiline=True).replace("\t", " ").splitlines()
    return "\n".join(markdown_inert(line) for line in lines).strip("\n")


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: not so when it holds lone surrogates, as
    an argument that was not UTF-8 bytes does (Python decodes those as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Letters and symbols that render as nothing (Hangul fillers, the blank braille pattern).
INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")  # render as nothing


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: only whitespace, separators, control and format
    characters (zero-width spaces and joiners, soft hyphens, byte-order marks), combining
    marks with no character to combine with, or the few letters that render as nothing.
    Unassigned code points are not blank: they may be characters newer than this
    Python's Unicode tables."""
    return all(ch.isspace() or ch in INVISIBLE_LETTERS
               or unicodedata.category(ch) in _BLANK_CATEGORIES for ch in text)


# Controls, formats, separators, and the combining marks (which show only on a character
# before them: a string of marks alone shows nothing, or a dotted circle).
_BLANK_CATEGORIES = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me"))
