"""markdown_inert's fast path: text with nothing to escape is returned as it is, and that
is decided exactly: on any text the fast answer equals the full escape's."""

from __future__ import annotations

import random

import pytest

from engine import _text
from engine._text import markdown_inert

# Every character an escape acts on, the pieces of autolinks, emoticons, commit ids, issue
# references and line starts, and characters terminal_safe folds.
_ALPHABET = ("aAbcdefghxyonfgrbpDP0123456789 .,;:()!?-+=*_~`[]<>&|#@{}^$/\\'\"wW"
             "\u202e\u200b\u0130\u017f\u00e9\n\t")
_PIECES = ["www.", "WWW.", "://", "(x)", "(on)", "(*r)", "(!)", ":)", ";P", "GH-12", "gh-1",
           "deadbeef", "DEADBEEF1", "1. ", "1) ", "h1. ", "bq. ", "@me", "#12", "a-b", "?"]


def _flat(text: str) -> str:
    return " ".join(_text.terminal_safe(text, multiline=True).split())


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(_PIECES) if rng.random() < 0.2 else rng.choice(_ALPHABET)
                 for _ in range(rng.randint(0, 30))]
        out.append("".join(parts))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_path_equals_the_full_escape(seed: int) -> None:
    texts = _random_texts(20_000, seed)
    fast = [t for t in texts if _text._already_inert(_flat(t))]
    assert 0 < len(fast) < len(texts)  # both paths are exercised
    for text in texts:
        assert markdown_inert(text) == _text._escaped(_flat(text)), repr(text)


def test_plain_sentences_take_it_and_markup_does_not() -> None:
    assert _text._already_inert("The editor crashes when saving a file of 2 GB (S1, S3).")
    for text in ("see www.example.org", "1. first", "h1. Title", "fix (x) now", "a :) b",
                 "commit deadbeef1", "GH-12", "a-b", "why?", "@someone", "x://y"):
        assert not _text._already_inert(_flat(text)), text
        assert markdown_inert(text) != text
