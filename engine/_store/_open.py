"""Choosing a backend from a store location: a folder path is the embedded SQLite store;
``postgresql://…`` (or ``postgres://…``) is the multi-host PostgreSQL store, whose large
blobs live under ``blob_root`` (``[store] blob_root``)."""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import NotAStore
from ._common import INLINE_THRESHOLD
from ._pg_open import display_url, is_postgres_url, looks_like_a_url
from ._postgres import LEASE_S, PostgresStore
from ._protocol import Store
from ._sqlite import SqliteStore


def open_backend(location: str | os.PathLike[str], *, write: bool, create: bool = True,
                 inline_threshold: int = INLINE_THRESHOLD, blob_root: str | None = None,
                 lease_s: float = LEASE_S) -> Store:
    text = os.fspath(location)
    if not is_postgres_url(text) and looks_like_a_url(text):
        # Never a folder by accident: 'postgresl://…' would become a new SQLite store.
        shown = display_url(text) if "://" in text else \
            "(a libpq key=value string)" if "=" in text else text
        raise NotAStore(f"the store location {shown} is neither a folder nor a "
                        "postgresql:// URL", hint="Use a folder path, or "
                        "postgresql://user@host:5432/db (postgres:// also works).")
    if is_postgres_url(text):
        return PostgresStore.open(text, write=write, create=create,
                                  inline_threshold=inline_threshold, blob_root=blob_root,
                                  lease_s=lease_s)
    return SqliteStore.open(Path(text), write=write, create=create,
                            inline_threshold=inline_threshold)
