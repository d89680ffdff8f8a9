"""The store as an interface: what the publisher, the phases, verify, gc, export/import and
the CLI may rely on, whatever the backend (SQLite + files today; PostgreSQL + a shared blob
root is the planned multi-host one).

Everything here is blocking; the actors call it on worker threads. A backend keeps its own
upkeep (SQLite's WAL checkpoints, a pool's connections) to itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Protocol

import attrs

from .._errors import StorageError
from .._ids import Shard
from ._manifest import Manifest
from ._plan import GenerationRow
from ._requests import CaseStatus, Outcome, Request
from ._sources import BlobSource


@attrs.frozen
class CaseRef:
    """One case in the store's index: its head generation and durable status."""

    case_id: str
    package_id: str
    generation: int
    phase: str
    analysis_revision: int
    updated_at: str
    status: CaseStatus | None = None


@attrs.frozen
class BlobInfo:
    size: int
    inline: bool


@attrs.frozen
class StoreStats:
    transactions: int
    requests: int
    bytes_committed: int


class BlobStorage(Protocol):
    """Where large blobs live: a folder (``BlobFiles``, the SQLite store's or the shared
    blob root of a PostgreSQL store); an object store could be another. Everything the
    backends, verify and gc do with large blobs goes through this."""

    def write(self, source: BlobSource) -> None:
        """Put the blob in place durably (before the transaction that references it),
        unless exactly its bytes are there; the bytes are hashed as they are written."""
        ...
    def exists(self, sha256: str, size: int) -> bool: ...
    def open_regular(self, sha256: str) -> BinaryIO: ...
    def iter_files(self) -> Iterator[tuple[str, Path]]: ...
    def iter_tmp(self) -> Iterator[Path]: ...
    def remove_abandoned(self, path: Path) -> bool: ...
    def has_any(self) -> bool: ...


class Exclusive(Protocol):
    """The store held against every commit (gc's view)."""

    def referenced_hashes(self) -> set[str]: ...


class Store(Protocol):
    @property
    def location(self) -> str: ...
    @property
    def writable(self) -> bool: ...
    @property
    def blob_files(self) -> BlobStorage: ...
    # Whether taking or giving back a lease waits on the network (run it on a thread).
    leases_block: bool
    # How many worker threads may read at once. Reads that are mostly Python under the GIL
    # gain nothing from more threads and lose to their contention for it (SQLite: 2);
    # reads that wait on the network overlap (PostgreSQL).
    reader_threads: int
    # Whether a read waits on the network (PostgreSQL) rather than on local pages
    # (SQLite). A case step's plan runs on the event loop's thread where it does not.
    reads_block: bool
    # What to do when index_problems() names something (verify's and gc's hint).
    repair_hint: str

    # -- writing (the publisher's worker thread; read-only stores refuse) -------------
    def commit_batch(self, requests: Sequence[Request]) -> list[Outcome]: ...
    def lease(self, case_id: str) -> AbstractContextManager[None]: ...
    def check_lease(self, case_id: str) -> None:
        """Before a step of a case this handle holds: raise ``StaleGeneration``
        (``lease_lost``) if its lease was taken over (a stall past its expiry). A no-op
        where a held lease cannot be lost (SQLite's is this process's own lock)."""
        ...
    def exclusive(self) -> AbstractContextManager[Exclusive]: ...

    # -- reading ---------------------------------------------------------------------
    def read_transaction(self) -> AbstractContextManager[None]: ...
    def list_cases(self) -> list[CaseRef]: ...
    def case(self, case_id: str) -> CaseRef: ...
    def head(self, case_id: str) -> tuple[CaseRef, Manifest]: ...
    def next_due(self, shard: Shard | None = None) -> float | None: ...
    def generation_counts(self) -> dict[str, int]:
        """Every package that has a generation, with how many generation rows it has."""
        ...
    def generations(self, package_id: str) -> list[GenerationRow]: ...
    def stored_generations(self, package_id: str) -> list[GenerationRow]:
        """Every generation row the store holds for the package, on its history or not
        (what a damaged package's rows reference: verify's count of orphan blobs)."""
        ...
    def manifest(self, package_id: str, generation: int) -> Manifest: ...
    def blob_info(self, sha256: str) -> BlobInfo | None: ...
    def read_blob(self, sha256: str) -> bytes: ...
    def open_blob(self, sha256: str) -> BinaryIO: ...
    def due_cases(self, now: float, limit: int, *, awaiting_confirmation: bool = False,
                  shard: Shard | None = None) -> list[CaseRef]: ...
    def claim_due(self, now: float, limit: int, *, skip: Collection[str] = (),
                  awaiting_confirmation: bool = False, shard: Shard | None = None
                  ) -> list[CaseRef]:
        """Up to ``limit`` due cases (not in ``skip``; of ``shard`` only, when given) for
        this worker to dispatch. A backend shared by many workers hands each due case to
        one of them (a lease taken here, which the case actor's :meth:`lease` then holds);
        one whose leases are process-local returns :meth:`due_cases`."""
        ...
    def status_counts(self) -> dict[tuple[str, str], int]: ...
    def index_problems(self) -> list[str]: ...
    def stats(self) -> StoreStats: ...
    def close(self) -> None: ...


def whole_history(store: Store, case_id: str) -> tuple[CaseRef, list[GenerationRow]]:
    """A case's index row and its generations 1 to the head, read as of one committed
    state (a publication between two reads is not half seen). A history that does not run
    from 1 to the row's generation is ``store_corrupt``: ``log`` and ``export`` never show
    or archive part of one as if it were all."""
    with store.read_transaction():
        ref = store.case(case_id)
        rows = store.generations(ref.package_id)
    if [r.generation for r in rows] != list(range(1, ref.generation + 1)):
        raise StorageError(f"case {case_id!r}: the store does not hold its whole history "
                           f"(generations 1 to {ref.generation})", reason="store_corrupt",
                           hint="Run 'viano verify' to see what is damaged.")
    return ref, rows
