"""The PostgreSQL store's schema and its version.

The version lives in ``viano_meta.format`` (``viano-pg/N``); an older or newer one than this
code knows is refused (``store_format``) rather than guessed at. Every table is named
``viano_*``, so the store can share a database with nothing else by mistake: a database
whose schema holds other tables is refused (``not_a_store``) when the store would be
created in it.

Version history:

1. ``viano_meta``, ``viano_blobs`` (raw 32-byte sha256 keys; inline ``bytea`` or NULL for a
   file under the blob root), ``viano_generations`` (exact manifest bytes and their hash),
   ``viano_refs`` (the head and durable status of each package: the case index and, by
   ``(status, due_at)``, the work queue every worker shares) and ``viano_leases`` (one row
   per claimed case: its holder and an expiry that the holder renews). Ids are ``COLLATE
   "C"``: listed in byte order, as SQLite lists them, whatever the database's locale.
   ``viano_meta.blob_root_id`` is the token in the blob root's ``blob-root-id`` file (see
   ``_pg_open``).
"""

from __future__ import annotations

from typing import Any

FORMAT_PREFIX = "viano-pg/"
CURRENT_VERSION = 1
TABLES = ("viano_meta", "viano_blobs", "viano_generations", "viano_refs", "viano_leases")

SCHEMA = """
CREATE TABLE viano_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE viano_blobs (sha256 bytea PRIMARY KEY, size bigint NOT NULL, data bytea);
CREATE TABLE viano_generations (
    package_id text COLLATE "C" NOT NULL, generation bigint NOT NULL, parent bigint,
    manifest_sha256 text NOT NULL, manifest bytea NOT NULL,
    phase text NOT NULL, created_at text NOT NULL,
    PRIMARY KEY (package_id, generation));
CREATE TABLE viano_refs (
    package_id text COLLATE "C" PRIMARY KEY, case_id text COLLATE "C" NOT NULL UNIQUE,
    generation bigint NOT NULL, phase text NOT NULL, analysis_revision bigint NOT NULL,
    updated_at text NOT NULL,
    status text, status_phase text, reason text, round bigint, max_rounds bigint,
    due_at double precision, attempt_id text, calls_started bigint NOT NULL DEFAULT 0);
CREATE INDEX viano_refs_due ON viano_refs (status, due_at);
CREATE TABLE viano_leases (
    case_id text COLLATE "C" PRIMARY KEY, holder text NOT NULL,
    expires_at timestamptz NOT NULL)
"""


# What SCHEMA makes, as information_schema.columns reports it (a test holds the two
# together): verify and gc judge the store by these tables, so a table dropped or a column
# changed behind the store's back is a refusal of theirs, not "ok".
COLUMNS: dict[str, dict[str, str]] = {
    "viano_meta": {"key": "text", "value": "text"},
    "viano_blobs": {"sha256": "bytea", "size": "bigint", "data": "bytea"},
    "viano_generations": {"package_id": "text", "generation": "bigint", "parent": "bigint",
                          "manifest_sha256": "text", "manifest": "bytea", "phase": "text",
                          "created_at": "text"},
    "viano_refs": {"package_id": "text", "case_id": "text", "generation": "bigint",
                   "phase": "text", "analysis_revision": "bigint", "updated_at": "text",
                   "status": "text", "status_phase": "text", "reason": "text",
                   "round": "bigint", "max_rounds": "bigint", "due_at": "double precision",
                   "attempt_id": "text", "calls_started": "bigint"},
    "viano_leases": {"case_id": "text", "holder": "text",
                     "expires_at": "timestamp with time zone"},
}
COLUMNS_SQL = ("SELECT table_name, column_name, data_type FROM information_schema.columns "
               "WHERE table_schema = current_schema() AND table_name = ANY(%s)")


def schema_problems(conn: Any) -> list[str]:
    """What of :data:`COLUMNS` the database behind ``conn`` lacks or holds otherwise."""
    have: dict[str, dict[str, str]] = {}
    for table, column, kind in conn.execute(COLUMNS_SQL, (list(COLUMNS),)).fetchall():
        have.setdefault(table, {})[column] = kind
    out = []
    for table, columns in COLUMNS.items():
        if table not in have:
            out.append(f"the table {table} is missing")
            continue
        for column, kind in columns.items():
            got = have[table].get(column)
            if got is None:
                out.append(f"the column {table}.{column} is missing")
            elif got != kind:
                out.append(f"the column {table}.{column} is {got}, not {kind}")
    return out


def parse_version(value: str) -> int | None:
    if not value.startswith(FORMAT_PREFIX):
        return None
    tail = value[len(FORMAT_PREFIX):]
    return int(tail) if tail.isdigit() and len(tail) < 10 else None
