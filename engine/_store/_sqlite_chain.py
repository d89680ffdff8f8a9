"""Generations as chains (store format 4): how the SQLite store finds a generation.

``generations`` has no index but its integer id, so a publication only appends: its row
goes at the end of the table and dirties no page in the middle of an index (the
(package_id, generation) index it replaced dirtied one 16 KiB page per publication once it
outgrew a group commit). ``refs.head_row`` names the row of a package's head, and each
row's ``parent_row`` the row of its parent. The head is one lookup by id; an older
generation is a walk down the chain, one lookup per step.

A walk trusts nothing it reads: each row must belong to the package and hold exactly the
generation one below the row before it, and the walk stops at the first row that does
not. Generations are numbered down, so a forged ``parent_row`` can make a chain end early,
never loop. What a broken chain hides, ``verify`` reports: it compares what the walk found
with every row the table holds for the package (:func:`counts`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .._errors import StorageError
from ._plan import BatchRows, GenerationRow

ROW_COLUMNS = ("package_id, generation, parent, manifest_sha256, manifest, phase, "
               "created_at, parent_row")


def walk(conn: sqlite3.Connection, package_id: str, down_to: int = 1
         ) -> list[GenerationRow]:
    """The package's generations from its head down to ``down_to`` (or to where its chain
    breaks), head first. Empty if the package has no ref."""
    head = conn.execute("SELECT head_row, generation FROM refs WHERE package_id=?",
                        (package_id,)).fetchone()
    if head is None:
        return []
    row_id, expected = head
    out: list[GenerationRow] = []
    while row_id is not None and type(expected) is int and expected >= down_to:
        row = conn.execute(f"SELECT {ROW_COLUMNS} FROM generations WHERE id=?",
                           (row_id,)).fetchone()
        if row is None or row[0] != package_id or row[1] != expected:
            break
        out.append(GenerationRow(row[0], row[1], row[2], row[3], bytes(row[4]), row[5],
                                 row[6]))
        row_id, expected = row[7], expected - 1
    return out


def find(conn: sqlite3.Connection, package_id: str, generation: int
         ) -> GenerationRow | None:
    """The package's generation ``generation``; None if the package has no such
    generation. A chain that breaks above it is ``store_corrupt``: the index says the
    generation exists, and it cannot be reached."""
    rows = walk(conn, package_id, down_to=generation)
    if rows and rows[-1].generation == generation:
        return rows[-1]
    if rows or conn.execute("SELECT 1 FROM refs WHERE package_id=? AND generation>=?",
                            (package_id, generation)).fetchone():
        raise StorageError(f"package {package_id}: generation {generation} cannot be "
                           "reached from its head (the chain of generations is broken)",
                           reason="store_corrupt",
                           hint="Run 'viano verify' to see what is damaged.")
    return None


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """How many rows the table holds for each package (one pass over the table)."""
    return dict(conn.execute("SELECT package_id, COUNT(*) FROM generations "
                             "GROUP BY package_id").fetchall())


def head_rows(conn: sqlite3.Connection, packages: Sequence[str]) -> dict[str, tuple[int, int]]:
    """For each package that has a ref: its head's (generation, row id)."""
    out: dict[str, tuple[int, int]] = {}
    for i in range(0, len(packages), 500):
        part = packages[i:i + 500]
        for pkg, gen, row_id in conn.execute(
                f"SELECT package_id, generation, head_row FROM refs WHERE package_id IN "
                f"({','.join('?' * len(part))})", part):
            out[pkg] = (gen, row_id)
    return out


class Placer:
    """Inside the write transaction: gives a batch's generation rows their ids and parent
    rows, and names each ref's head row. ``heads`` are the batch's packages' heads as read
    in this transaction (:func:`head_rows`)."""

    def __init__(self, conn: sqlite3.Connection, heads: dict[str, tuple[int, int]]):
        self._top: int = conn.execute("SELECT MAX(id) FROM generations").fetchone()[0] or 0
        self._heads = heads
        self._placed: dict[tuple[str, int], int] = {}

    def rows(self, rows: BatchRows) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for row in rows.generations:
            parent_row = None if row.parent is None else self.row_of(row.package_id,
                                                                     row.parent)
            self._top += 1
            self._placed[(row.package_id, row.generation)] = self._top
            out.append((self._top, *row, parent_row))
        return out

    def row_of(self, package_id: str, generation: int) -> int:
        """The row of a generation written in this batch, or of the package's head."""
        placed = self._placed.get((package_id, generation))
        if placed is not None:
            return placed
        head = self._heads.get(package_id)
        if head is None or head[0] != generation or type(head[1]) is not int:
            raise StorageError(f"package {package_id}: the index names no row for its "
                               f"generation {generation}", reason="store_corrupt",
                               hint="Run 'viano verify' to see what is damaged.")
        return head[1]
