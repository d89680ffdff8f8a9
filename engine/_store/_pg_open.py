"""Opening a PostgreSQL store: the URL (and keeping its password out of every message), the
driver, the schema and its version, the blob root, and translating driver errors.

**The blob root belongs to one store, and every worker must see the same one.** It holds
``store-id`` (the store's id, as the database's ``viano_meta.store_id``) and
``blob-root-id``, a random token made by the first worker that writes to the store and
recorded in ``viano_meta.blob_root_id``. A worker whose blob root lacks that token (the
shared folder is not mounted on its host: an empty local folder stands in its place) or
holds another one is refused before it writes anything (``store_unavailable``); a blob
root of another store is ``store_corrupt``.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._errors import NotAStore, NotFound, StorageError, VianoError
from ._blobs import fsync_dir
from ._pg_schema import (
    CURRENT_VERSION,
    FORMAT_PREFIX,
    SCHEMA,
    TABLES,
    parse_version,
    schema_problems,
)
from ._sources import read_text_file

log = logging.getLogger("viano.store")

SCHEMES = ("postgresql://", "postgres://")
ID_NAME = "store-id"
TOKEN_NAME = "blob-root-id"
CREATE_LOCK = 0x5649414E4F02  # pg_advisory_xact_lock key of schema creators
_SECRET_PARAMS = frozenset({"password", "sslpassword"})
_URL_HINT = ("Use postgresql://user@host:5432/db or postgresql://user@/db?host=/socket/dir, "
             "with reserved characters in the user or password percent-encoded (@ is %40); "
             "better, leave the password out and use PGPASSWORD or ~/.pgpass.")


NO_DATABASE = re.compile(r'database "[^"]*" does not exist')
_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
_SCHEME_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")
_CONNINFO_LIKE = re.compile(r"(?:^|\s)(?:host|hostaddr|dbname|user|password|port|service)\s*=")


def is_postgres_url(location: str) -> bool:
    return location[:14].lower().startswith(SCHEMES)


def looks_like_a_url(location: str) -> bool:
    """A location that is meant as a database, not a folder: any ``scheme:/…`` (a
    misspelt ``postgresl://``, ``postgresql+psycopg://``, ``postgresql:/db``) or a libpq
    ``key=value`` string. Never taken as a folder name (it would become a SQLite store)."""
    return bool(_SCHEME_LIKE.match(location) or _CONNINFO_LIKE.search(location))


def display_url(url: str) -> str:
    """The URL as it may be printed: what libpq itself reads from it (user, hosts, ports,
    database, parameters), without any password (the userinfo's, ``password=``,
    ``sslpassword=``). A URL libpq cannot read (or without the driver) is shown only
    from its last ``@`` on, so no part of a password can survive whatever characters
    it holds."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "postgresql://(unparseable URL)"
    # Unreadable: none of its userinfo and none of its parameters, whatever they hold (a
    # ``?password=`` was printed whole when the rest of the URL did not parse).
    tail = rest.rpartition("@")[2] if "@" in rest else rest
    where = re.split(r"[?#]", tail, maxsplit=1)
    redacted = (f"{scheme.lower()}://" + ("…@" if "@" in rest else "") + where[0] +
                ("?…" if len(where) > 1 else ""))
    head = rest.split("?", 1)[0]
    if head.count("@") > 1 or ("@" in head and any(c in head.rsplit("@", 1)[0]
                                                    for c in "/#")):
        return redacted  # libpq would misread the user part: show none of it
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(scheme.lower() + "://" + rest)
    except Exception:  # not readable by libpq, or no driver
        return redacted
    user = params.pop("user", None)
    hosts = str(params.pop("host", "") or "")
    ports = str(params.pop("port", "") or "")
    dbname = params.pop("dbname", None)
    netloc = ""
    if hosts and not hosts.startswith("/"):
        port_list = ports.split(",") if ports else []
        netloc = ",".join(h + (f":{port_list[i]}" if i < len(port_list) and port_list[i]
                                 else "") for i, h in enumerate(hosts.split(",")))
        ports = ""
    elif hosts:
        params["host"] = hosts
    if ports:
        params["port"] = ports
    query = "&".join(f"{k}={quote(str(v), safe='/,:')}" for k, v in params.items()
                     if k.lower() not in _SECRET_PARAMS)
    return (f"{scheme.lower()}://" + (f"{quote(str(user), safe='')}@" if user else "") +
            netloc + "/" + quote(str(dbname or ""), safe="") + (f"?{query}" if query else ""))


def display_location(location: str) -> str:
    """A store location as it may be printed or logged (a URL loses its password)."""
    return display_url(location) if is_postgres_url(location) else location


def driver() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise StorageError("the PostgreSQL store needs psycopg 3 and psycopg_pool, which are "
                           "not installed", reason="store_unavailable",
                           hint="pip install 'viano[postgres]' (or use a folder path for "
                                "--store: the embedded SQLite store).") from exc
    return psycopg, psycopg_pool


def conninfo(psycopg: Any, url: str, write: bool) -> str:
    """The URL as libpq conninfo: a connect timeout unless it sets one, READ COMMITTED
    whatever the server's default (the write lock and the claims are built on it), and
    read-only transactions enforced by the server for a read-only open. A URL libpq would
    misread (a raw ``@`` in the password) is refused before libpq sees it, so its message
    cannot carry the password."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    shown = display_url(url)
    rest = url.partition("://")[2]
    head = rest.split("?", 1)[0]  # before the parameters
    if head.count("@") > 1 or ("@" in head and any(c in head.rsplit("@", 1)[0]
                                                    for c in "/#")):
        raise NotAStore(f"the store location {shown}: the user or password holds a raw "
                        "'@', '/', '?' or '#'", hint=_URL_HINT)
    url = url[:len(url) - len(rest) - 3].lower() + "://" + rest  # the scheme, any case
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise NotAStore(f"the store location {shown} is not a valid PostgreSQL URL",
                        hint=_URL_HINT) from None  # libpq's message may quote the password
    if not params.get("dbname"):
        raise NotAStore(f"the store location {shown} names no database",
                        hint="Name a database of Viano's own: postgresql://user@host/viano "
                             "(never the server's maintenance database).")
    extra: dict[str, Any] = {"application_name": params.get("application_name") or "viano"}
    if "connect_timeout" not in params:
        extra["connect_timeout"] = 10
    options = str(params.get("options") or "") + \
        r" -c default_transaction_isolation=read\ committed"
    if not write and "target_session_attrs" not in params:
        # The server refuses writes too (Viano refuses them first); a URL that asks for a
        # read-write session (target_session_attrs) would then find none.
        options += " -c default_transaction_read_only=on"
    extra["options"] = options.strip()
    return str(make_conninfo(url, **extra))


def _has_schema(conn: Any) -> bool:
    # A scan of the catalog (a fresh snapshot per statement), not to_regclass: its cache can
    # miss a table that another creator committed while this one waited for the lock.
    return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE "
                             "schemaname = current_schema() AND tablename = 'viano_meta')"
                             ).fetchone()[0])


def _foreign_tables(conn: Any) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
        "AND tablename <> ALL(%s) ORDER BY 1 LIMIT 3", (list(TABLES),))]


def open_schema(conn: Any, shown: str, *, write: bool, create: bool,
                blob_root: Path | None = None) -> dict[str, str]:
    """The store's ``viano_meta``, creating the schema if asked and absent (never in a
    database holding other tables, nor with a blob root that is another store's)."""
    if not _has_schema(conn):
        foreign = _foreign_tables(conn)
        if foreign:
            raise NotAStore(f"{shown} holds tables that are not a Viano store's "
                            f"({', '.join(foreign)})", hint="Give Viano a database of its own.")
        if not (write and create):
            raise NotFound(f"no store at {shown}", reason="no_store",
                           hint="Create one with 'viano intake --store URL'.")
        if blob_root is not None and _read(blob_root / ID_NAME) is not None:
            raise StorageError(f"the blob root {blob_root} belongs to another store; a new "
                               "store needs a blob folder of its own", reason="store_corrupt",
                               hint="Point [store] blob_root at a new, empty folder.")
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CREATE_LOCK,))
            if not _has_schema(conn):
                foreign = _foreign_tables(conn)
                if foreign:
                    raise NotAStore(f"{shown} holds tables that are not a Viano store's "
                                    f"({', '.join(foreign)})",
                                    hint="Give Viano a database of its own.")
                for stmt in SCHEMA.strip().split(";"):
                    conn.execute(stmt)
                conn.execute("INSERT INTO viano_meta VALUES ('format', %s), ('store_id', %s)",
                             (f"{FORMAT_PREFIX}{CURRENT_VERSION}", str(uuid.uuid4())))
                log.info("created the store schema in %s", shown)
    meta = dict(conn.execute("SELECT key, value FROM viano_meta").fetchall())
    version = parse_version(str(meta.get("format", "")))
    if version is None or "store_id" not in meta:
        raise StorageError(f"{shown} has no Viano store format", reason="store_corrupt",
                           hint="Restore the database from a backup.")
    if version != CURRENT_VERSION:
        newer = version > CURRENT_VERSION
        raise StorageError(f"{shown} has store format {FORMAT_PREFIX}{version}; this Viano "
                           f"reads {FORMAT_PREFIX}{CURRENT_VERSION}", reason="store_format",
                           hint="Upgrade Viano to open this store." if newer else
                           "This store predates the PostgreSQL backend's first release; "
                           "export it with the Viano that wrote it and import it here.")
    damaged = schema_problems(conn)
    if damaged:
        # Every command says what is wrong with the schema: with a column retyped, show
        # and reopen said "there is no generation '7'" (exit 2), verify listed every ref.
        raise StorageError(f"{shown}: {'; '.join(damaged)}", reason="store_corrupt",
                           hint="The schema was changed behind the store: restore the "
                                "database from a backup.")
    return {str(k): str(v) for k, v in meta.items()}


def _read(path: Path) -> str | None:
    try:
        return read_text_file(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"{path} cannot be read ({exc})", reason="store_unavailable",
                           hint="Check that [store] blob_root is mounted and readable.") \
            from exc


def _place(path: Path, text: str) -> None:
    """Write ``path`` durably unless it exists (never over another worker's)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with tmp.open("w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def blob_root_problem(root: Path, meta: dict[str, str]) -> StorageError | None:
    """Why ``root`` is not this store's blob root, if it is not (see the module doc)."""
    store_id = meta["store_id"]
    on_disk = _read(root / ID_NAME)
    if on_disk is not None and on_disk != store_id:
        return StorageError(f"the blob root {root} belongs to another store (store-id "
                            f"{on_disk[:8]}…, this store is {store_id[:8]}…)",
                            reason="store_corrupt",
                            hint="Point [store] blob_root at this store's own blob folder.")
    token = meta.get("blob_root_id")
    if token is not None and _read(root / TOKEN_NAME) != token:
        return StorageError(f"the blob root {root} is not the folder this store's blobs are "
                            "in (its blob-root-id is missing or another): is the shared "
                            "folder mounted here?", reason="store_unavailable",
                            hint="Mount the store's shared blob folder at [store] blob_root "
                                 "on this host (the same folder on every worker).")
    return None


def claim_blob_root(conn: Any, root: Path, meta: dict[str, str], *, write: bool
                    ) -> dict[str, str]:
    """Check ``root`` against the store; the first worker that writes makes it the
    store's (the token recorded in the database). Returns the meta as it now is."""
    problem = blob_root_problem(root, meta)
    if problem is not None and (write or problem.reason != "store_unavailable"):
        raise problem  # read-only, an unmounted root still lets the index be read
    if not write or "blob_root_id" in meta:
        return meta
    has_files = bool(conn.execute("SELECT EXISTS (SELECT 1 FROM viano_blobs WHERE data IS "
                                  "NULL)").fetchone()[0])
    if has_files and _read(root / ID_NAME) is None:
        raise StorageError(f"the store has blob files, and the blob root {root} is not "
                           "where they are (no store-id): is the shared folder mounted here?",
                           reason="store_unavailable",
                           hint="Mount the store's shared blob folder at [store] blob_root.")
    try:
        if _read(root / ID_NAME) is None and (root / "blobs").exists():
            raise StorageError(f"the blob root {root} holds blobs but no store-id: it cannot "
                               "be shown to belong to this store", reason="store_corrupt",
                               hint="Point [store] blob_root at this store's own blob "
                                    "folder.")
        root.mkdir(parents=True, exist_ok=True)
        _place(root / ID_NAME, meta["store_id"])
        _place(root / TOKEN_NAME, uuid.uuid4().hex)
    except OSError as exc:
        raise StorageError(f"cannot prepare the blob root {root}: {exc.strerror or exc}",
                           reason="store_unavailable",
                           hint="Check that [store] blob_root exists and is writable.") from exc
    token = _read(root / TOKEN_NAME)
    conn.execute("INSERT INTO viano_meta VALUES ('blob_root_id', %s) ON CONFLICT (key) DO "
                 "NOTHING", (token,))
    meta = dict(meta, blob_root_id=str(conn.execute(
        "SELECT value FROM viano_meta WHERE key = 'blob_root_id'").fetchone()[0]))
    problem = blob_root_problem(root, meta)  # another worker's folder was recorded first
    if problem is not None:
        raise problem
    return meta


@contextmanager
def translate(shown: str, doing: str) -> Iterator[None]:
    """Translate psycopg/pool/OS errors at the storage boundary (never with the URL's
    password: ``shown`` has none, and libpq's messages carry none)."""
    try:
        yield
    except VianoError:
        raise
    except OSError as exc:
        raise StorageError(f"could not {doing}: {exc}", reason="store_unavailable",
                           hint="Check the blob root's permissions and free space.") from exc
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("psycopg", "psycopg_pool"):
            raise
        raise driver_error(exc, shown, doing) from exc


def driver_error(exc: Exception, shown: str, doing: str) -> VianoError:
    import psycopg
    import psycopg_pool

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if NO_DATABASE.search(str(exc)):  # at any step: a name mistyped, or dropped since
        return NotFound(f"no store at {shown}: the database does not exist", reason="no_store",
                        hint="Check the database's name in the URL, or create it (CREATE "
                             "DATABASE …) and take cases in with 'viano intake'.")
    if isinstance(exc, psycopg.ProgrammingError) and doing.startswith("connect"):
        # A connection option libpq refuses; the value it quotes may be a password.
        return NotAStore(f"the store location {shown} has an option PostgreSQL refuses: "
                         f"{re.sub(_QUOTED, '…', first)}",
                         hint=_URL_HINT)
    if isinstance(exc, (psycopg.errors.InsufficientPrivilege,
                        psycopg.errors.ReadOnlySqlTransaction)):
        return StorageError(f"could not {doing} at {shown}: {first}", reason="store_read_only",
                            hint="This database role may only read the store; read commands "
                                 "still work.")
    unavailable = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError,
                                   psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed))
    return StorageError(f"could not {doing} at {shown}: {first}",
                        reason="store_unavailable" if unavailable else "store_corrupt",
                        hint="Check that PostgreSQL is running and reachable, and the URL's "
                             "user, database and password." if unavailable else
                             "Run 'viano verify'; the store's schema may be damaged.")
