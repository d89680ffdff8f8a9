"""Shared pieces of the store tests."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import engine._store._open as _open
from engine import (
    BytesSource,
    Change,
    Outcome,
    PublishRequest,
    Request,
    SqliteStore,
    new_package_id,
)
from tests.pgmap.mapping import pg_url_for


def create(case: str, payload: bytes = b"x") -> PublishRequest:
    return PublishRequest(new_package_id(), case, None, Change(
        files={"inputs/a.bin": BytesSource.of(payload), "case/c.json": BytesSource.of(b"{}")},
        phase="INTAKE"))


def open_rw(root: Path, **kw: Any) -> Any:
    """The store at ``root``, through open_backend (so a test run on the PostgreSQL backend
    opens its database; see ``backend`` in conftest)."""
    return _open.open_backend(root, write=True, **kw)


def open_ro(root: Path, **kw: Any) -> Any:
    return _open.open_backend(root, write=False, **kw)


def sql(store: Path, stmt: str, *params: object) -> None:
    """Edit the index behind the store's back (tests of damage and tampering): SQLite's
    file, or under the PostgreSQL backend the folder's database (``pg_dialect``)."""
    _run(store, stmt, params, fetch=False)


def forge_generation(store: Path, package_id: str, generation: int, manifest: bytes,
                     phase: str, created_at: str) -> None:
    """Append a generation behind the store's back and make it the head, as a tamperer
    with the index would: a row on the package's chain (SQLite's format 4 links it from
    its parent's row and from the ref), with the manifest's true hash."""
    sha = hashlib.sha256(manifest).hexdigest()
    chained = not os.environ.get("VIANO_TEST_PG_ADMIN") and query(
        store, "SELECT 1 FROM pragma_table_info('generations') WHERE name='parent_row'")
    if chained:
        sql(store, "INSERT INTO generations (package_id, generation, parent, manifest_sha256, "
                   "manifest, phase, created_at, parent_row) VALUES (?, ?, ?, ?, ?, ?, ?, "
                   "(SELECT id FROM generations WHERE package_id=? AND generation=?))",
            package_id, generation, generation - 1, sha, manifest, phase, created_at,
            package_id, generation - 1)
        sql(store, "UPDATE refs SET generation=?, head_row=(SELECT MAX(id) FROM generations) "
                   "WHERE package_id=?", generation, package_id)
        return
    sql(store, "INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?)", package_id,
        generation, generation - 1, sha, manifest, phase, created_at)
    sql(store, "UPDATE refs SET generation=? WHERE package_id=?", generation, package_id)


def query(store: Path, stmt: str, *params: object) -> list[tuple[Any, ...]]:
    """Read the index behind the store's back (see :func:`sql`)."""
    return _run(store, stmt, params, fetch=True)


def _run(store: Path, stmt: str, params: Sequence[object], *, fetch: bool
         ) -> list[tuple[Any, ...]]:
    admin = os.environ.get("VIANO_TEST_PG_ADMIN")
    if admin:
        import psycopg

        with psycopg.connect(pg_url_for(admin, str(store)), autocommit=True) as pg:
            cur = pg.execute(pg_dialect(stmt), params)
            return [tuple(r) for r in cur.fetchall()] if fetch else []
    conn = sqlite3.connect(store / "store.sqlite3")
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='blob_rows'").fetchone():
            stmt = re.sub(r"\bblobs\b", "blob_rows", stmt)  # format 3 appends blobs there
        rows = [tuple(r) for r in conn.execute(stmt, params).fetchall()]
        conn.commit()
    finally:
        conn.close()
    return rows if fetch else []


def pg_dialect(stmt: str) -> str:
    """The few SQLite spellings the tampering tests use, in PostgreSQL's: the ``viano_``
    table names, ``%s`` placeholders, text to bytes and back."""
    stmt = re.sub(r"\b(blobs|generations|refs|meta)\b", r"viano_\1", stmt)
    stmt = re.sub(r"CAST\(manifest AS TEXT\)", "convert_from(manifest, 'UTF8')", stmt)
    stmt = re.sub(r"CAST\((.*) AS BLOB\)", r"convert_to(\1, 'UTF8')", stmt, flags=re.S)
    return stmt.replace("?", "%s")


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


def import_refused_then_placed(zip_path: Path, root: Path, run: Any) -> None:
    """A tampered export: ``viano import`` (``run``: the CLI runner) refuses it
    (invalid_export, the phase checks), and it is then put in the store by the store's own
    rules alone, as a hand edit or an older Viano would have, to test the checks that
    follow."""
    from engine import IntakeLimits, Published
    from engine._portable import read_export_structure

    r = run("import", "--store", root, zip_path)
    assert r.returncode == 2 and "invalid_export" in r.stderr + r.stdout, r.stdout + r.stderr
    request = read_export_structure(zip_path, IntakeLimits())
    store = open_rw(root)
    try:
        [out] = store.commit_batch([request])
    finally:
        store.close()
    assert isinstance(out, Published), out
