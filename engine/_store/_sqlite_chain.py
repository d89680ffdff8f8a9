"""Generations as chains (store format 4): how the SQLite store finds a generation.

``generations`` has no index on (package_id, generation), so a publication only appends:
its row goes at the end of the table and dirties no page in the middle of an index (the
index it replaced dirtied one 16 KiB page per publication once it outgrew a group
commit). ``refs.head_row`` names the row of a package's head, and each row's
``parent_row`` the row of its parent (``NO_PARENT`` for a generation 1: the column is
NOT NULL, so a writer of an older format, still running when the store was migrated,
cannot add a row off the chain). The only index left is a partial one on the
generation-1 rows (one entry per package, written once): a package's history cannot be
written twice, and whether a package has rows is one lookup.

The head is one lookup by id; an older generation is a walk down the chain (ids and
generations only; the manifest is read for the row wanted). A walk trusts nothing it
reads: each row must belong to the package and hold exactly the generation one below the
row before it, and the walk stops at the first row that does not, so a forged
``parent_row`` ends a chain early, never loops or serves another package's row. A chain
that does not reach generation 1 is ``store_corrupt`` for whoever needs the whole history
(``log``, ``export``); ``verify`` reports it, and also compares each chain with every row
the table holds for the package (:func:`counts`), which shows rows a broken link hides.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .._errors import StorageError
from ._common import REF_COLUMNS, generation_row
from ._plan import BatchRows, GenerationRow

NO_PARENT = 0
ROW_COLUMNS = "package_id, generation, parent, manifest_sha256, manifest, phase, created_at"
_HINT = "Run 'viano verify' to see what is damaged."


def _corrupt(message: str) -> StorageError:
    return StorageError(message, reason="store_corrupt", hint=_HINT)


def _ref(conn: sqlite3.Connection, package_id: str) -> tuple[Any, Any] | None:
    """The ref's (head_row, generation), read in one statement."""
    row = conn.execute("SELECT head_row, generation FROM refs WHERE package_id=?",
                       (package_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def links(conn: sqlite3.Connection, package_id: str, head_row: Any, down_to: int = 1
          ) -> list[tuple[int, int]]:
    """(row id, generation) from ``head_row`` down to generation ``down_to``, or to where
    the chain breaks. The head row's generation is taken as it is (``verify`` compares it
    with the ref's); each step below must be exactly one generation down."""
    out: list[tuple[int, int]] = []
    row_id, expected = head_row, None
    while type(row_id) is int and row_id > 0:
        row = conn.execute("SELECT package_id, generation, parent_row FROM generations "
                           "WHERE id=?", (row_id,)).fetchone()
        if row is None or row[0] != package_id or type(row[1]) is not int or \
                row[1] < down_to or (expected is not None and row[1] != expected):
            break
        out.append((row_id, row[1]))
        if row[1] == down_to:
            break
        row_id, expected = row[2], row[1] - 1
    return out


def fetch(conn: sqlite3.Connection, row_id: int) -> GenerationRow:
    row = conn.execute(f"SELECT {ROW_COLUMNS} FROM generations WHERE id=?",
                       (row_id,)).fetchone()
    if row is None:  # the walk read it a moment ago, and rows are never deleted
        raise _corrupt(f"generation row {row_id} disappeared")
    return generation_row(row)


def find(conn: sqlite3.Connection, package_id: str, generation: int
         ) -> GenerationRow | None:
    """The package's generation ``generation``; None if the package has no such generation.
    A generation the ref says exists but the chain does not reach is ``store_corrupt``."""
    ref = _ref(conn, package_id)
    if ref is None:
        return None
    head_row, ref_generation = ref
    chain = links(conn, package_id, head_row, down_to=generation)
    if chain and chain[-1][1] == generation:
        return fetch(conn, chain[-1][0])
    if (type(ref_generation) is int and ref_generation >= generation) or \
            (chain and chain[0][1] > generation):
        raise _corrupt(f"package {package_id}: generation {generation} cannot be reached "
                       "from its head (its chain of generations is broken)")
    return None


def history(conn: sqlite3.Connection, package_id: str) -> list[GenerationRow]:
    """Every generation of the package in order. A package whose ref the index has lost
    (only damage does that) is read by a scan of the table, for ``verify``."""
    ref = _ref(conn, package_id)
    if ref is None:
        return [generation_row(r) for r in conn.execute(
            f"SELECT {ROW_COLUMNS} FROM generations WHERE package_id=? ORDER BY generation, "
            "id", (package_id,))]
    return [fetch(conn, row_id) for row_id in _whole(conn, package_id, ref[0])]


def stored(conn: sqlite3.Connection, package_id: str) -> list[GenerationRow]:
    """Every row the table holds for the package, on its chain or not, in the order they
    were written (a scan of the table: only verify asks, for a damaged package)."""
    return [generation_row(r) for r in conn.execute(
        f"SELECT {ROW_COLUMNS} FROM generations WHERE package_id=? ORDER BY id",
        (package_id,))]


def history_hashes(conn: sqlite3.Connection, package_id: str) -> list[str]:
    """The manifest hashes of the package's generations in order (an import's plan)."""
    ref = _ref(conn, package_id)
    if ref is None:
        return []
    return [conn.execute("SELECT manifest_sha256 FROM generations WHERE id=?",
                         (row_id,)).fetchone()[0] for row_id in _whole(conn, package_id, ref[0])]


def _whole(conn: sqlite3.Connection, package_id: str, head_row: Any) -> list[int]:
    """The row ids of generations 1 to the head row, in order; a chain that does not reach
    generation 1 is ``store_corrupt``."""
    chain = links(conn, package_id, head_row)
    if not chain or chain[-1][1] != 1:
        where = f"below generation {chain[-1][1]}" if chain else "at its head"
        raise _corrupt(f"package {package_id}: its chain of generations is broken {where}")
    return [row_id for row_id, _ in reversed(chain)]


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """How many rows the table holds for each package (one pass over the table)."""
    return dict(conn.execute("SELECT package_id, COUNT(*) FROM generations "
                             "GROUP BY package_id").fetchall())


_REFS = ", ".join(f"r.{c.strip()}" for c in REF_COLUMNS.split(","))


def heads(conn: sqlite3.Connection, packages: Sequence[str]
          ) -> tuple[dict[str, Sequence[Any]], dict[str, tuple[int, int]], set[str], set[str]]:
    """For a batch's packages, in its write transaction, in one read of the case index:
    each package's row of ``REF_COLUMNS``; the head's (generation, row id) of each package
    whose ref names a row holding its head; the packages whose ref does not (damaged: a
    write on top is refused); and the packages with no ref that have rows all the same
    (their generation 1 exists: the index lost the ref, and a new history must not be
    written beside the old one)."""
    refs: dict[str, Sequence[Any]] = {}
    good: dict[str, tuple[int, int]] = {}
    damaged: set[str] = set()
    lost: set[str] = set()
    width = REF_COLUMNS.count(",") + 1
    for i in range(0, len(packages), 500):
        part = packages[i:i + 500]
        marks = ",".join("?" * len(part))
        for row in conn.execute(
                f"SELECT {_REFS}, r.head_row, g.package_id, g.generation "
                f"FROM refs r LEFT JOIN generations g ON g.id = r.head_row "
                f"WHERE r.package_id IN ({marks})", part):
            pkg, gen = row[1], row[2]
            refs[pkg] = row[:width]
            row_id, row_pkg, row_gen = row[width:]
            if row_pkg == pkg and row_gen == gen and type(row_id) is int:
                good[pkg] = (gen, row_id)
            else:
                damaged.add(pkg)
        rest = [p for p in part if p not in refs]
        if rest:
            lost.update(r[0] for r in conn.execute(
                f"SELECT package_id FROM generations WHERE generation = 1 AND package_id IN "
                f"({','.join('?' * len(rest))})", rest))
    return refs, good, damaged, lost


def head_row(head_rows: dict[str, tuple[int, int]], package_id: str, generation: int
             ) -> int | None:
    head = head_rows.get(package_id)
    return head[1] if head is not None and head[0] == generation else None


def append(conn: sqlite3.Connection, rows: BatchRows, head_rows: dict[str, tuple[int, int]]
           ) -> dict[tuple[str, int], int]:
    """Inside the write transaction: insert the batch's generation rows, each linked to
    its parent's row (a row of this batch or the package's head); returns the row id of
    each (package, generation) written. SQLite allocates the ids (it copes with any id a damaged
    table holds)."""
    placed: dict[tuple[str, int], int] = {}
    for row in rows.generations:
        if row.parent is None:
            parent_row = NO_PARENT
        else:
            found = placed.get((row.package_id, row.parent))
            if found is None:
                found = head_row(head_rows, row.package_id, row.parent)
            if found is None:  # heads() refused every request on a damaged head
                raise _corrupt(f"package {row.package_id}: no row for generation "
                               f"{row.parent}")
            parent_row = found
        row_id = conn.execute(
            "INSERT INTO generations (package_id, generation, parent, manifest_sha256, "
            "manifest, phase, created_at, parent_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (*row, parent_row)).lastrowid
        assert row_id is not None
        placed[(row.package_id, row.generation)] = row_id
    return placed
