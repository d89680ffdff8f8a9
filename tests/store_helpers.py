"""Shared pieces of the store tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine import (
    BytesSource,
    Change,
    Outcome,
    PublishRequest,
    Request,
    SqliteStore,
    new_package_id,
)


def create(case: str, payload: bytes = b"x") -> PublishRequest:
    return PublishRequest(new_package_id(), case, None, Change(
        files={"inputs/a.bin": BytesSource.of(payload), "case/c.json": BytesSource.of(b"{}")},
        phase="INTAKE"))


def open_rw(root: Path) -> SqliteStore:
    return SqliteStore.open(root, write=True)


def open_ro(root: Path) -> SqliteStore:
    return SqliteStore.open(root, write=False)


def sql(store: Path, stmt: str, *params: object) -> None:
    """Edit the index behind the store's back (tests of damage and tampering)."""
    conn = sqlite3.connect(store / "store.sqlite3")
    conn.execute(stmt, params)
    conn.commit()
    conn.close()


def fail_first_commit(store: SqliteStore, monkeypatch: pytest.MonkeyPatch,
                      error: Exception) -> None:
    """Make the store's next commit raise ``error``; later ones commit normally."""
    real = store.commit_batch
    calls = {"n": 0}

    def failing(requests: Sequence[Request]) -> list[Outcome]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return real(requests)

    monkeypatch.setattr(store, "commit_batch", failing)
