"""Versioned prompts. A prompt never changes once released; a new one gets a new version.
Its sha256 is recorded in every round record and bound into the attempt hash, so a round
always names exactly the text that was sent (tests pin the released hashes)."""

from __future__ import annotations

import functools
from importlib import resources

import attrs

from .._canonical import sha256_hex


@attrs.frozen
class PromptText:
    prompt_id: str
    text: str
    sha256: str


@functools.cache
def load_prompt(prompt_id: str) -> PromptText:
    data = (resources.files("prompts") / f"{prompt_id}.txt").read_bytes()
    return PromptText(prompt_id, data.decode("utf-8"), sha256_hex(data))
