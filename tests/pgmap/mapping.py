"""Tests only: run the same test code on the PostgreSQL backend. A store location that is a
folder path is opened as a PostgreSQL store in a database named after the folder's path
(created on first use), with the folder as its blob root. Installed by the ``backend``
fixture in the test process, and by ``sitecustomize`` in the children it starts."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

_MADE: set[tuple[str, str]] = set()


def pg_database(admin_url: str, name: str) -> str:
    """The URL of database ``name`` on the admin URL's server, created if absent."""
    if (admin_url, name) not in _MADE:
        import psycopg
        from psycopg import errors

        with psycopg.connect(admin_url, autocommit=True) as conn, \
                contextlib.suppress(errors.DuplicateDatabase, errors.UniqueViolation):
            conn.execute(f'CREATE DATABASE "{name}"')  # or another process made it first
        _MADE.add((admin_url, name))
    return admin_url.replace("/postgres?", f"/{name}?", 1)


def pg_url_for(admin_url: str, location: str) -> str:
    key = os.fsencode(Path(location).resolve())
    return pg_database(admin_url, "s_" + hashlib.sha256(key).hexdigest()[:24])


def install_mapping(admin_url: str, setattr_: Callable[[Any, str, Any], None]) -> None:
    import actors._store_handle
    import engine
    import engine._store
    import engine._store._open as opener
    import viano_bug_analysis.cli._context
    import viano_bug_analysis.cli._demo

    real = opener.open_backend

    def open_backend(location: str | os.PathLike[str], **kw: Any) -> Any:
        text = os.fspath(location)
        if text.startswith(("postgresql://", "postgres://")):
            return real(text, **kw)
        kw["blob_root"] = kw.get("blob_root") or text
        return real(pg_url_for(admin_url, text), **kw)

    for module in (opener, engine._store, engine, actors._store_handle,
                   viano_bug_analysis.cli._context, viano_bug_analysis.cli._demo):
        setattr_(module, "open_backend", open_backend)
