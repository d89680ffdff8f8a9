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


def parse_version(value: str) -> int | None:
    if not value.startswith(FORMAT_PREFIX):
        return None
    tail = value[len(FORMAT_PREFIX):]
    return int(tail) if tail.isdigit() and len(tail) < 10 else None
