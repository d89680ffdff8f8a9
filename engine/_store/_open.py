"""Choosing a backend from a store location: a folder path is the embedded SQLite store.
``postgresql://…`` names the multi-host backend, which is not part of this build yet."""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import NotAStore
from ._protocol import Store
from ._sqlite import INLINE_THRESHOLD, SqliteStore


def open_backend(location: str | os.PathLike[str], *, write: bool, create: bool = True,
                 inline_threshold: int = INLINE_THRESHOLD) -> Store:
    text = os.fspath(location)
    if text.startswith(("postgresql://", "postgres://")):
        raise NotAStore("the PostgreSQL store backend is not available in this build",
                        reason="store_unavailable",
                        hint="Use a folder path for --store (the embedded SQLite store).")
    return SqliteStore.open(Path(text), write=write, create=create,
                            inline_threshold=inline_threshold)
