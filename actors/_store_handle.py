"""``open_store``: the store with its publisher actor running, as one handle.

    async with open_store("viano-store") as store:
        published = await store.intake(plan)

Reads go straight to SQLite on a worker thread; every write goes through the publisher.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from engine import (
    CaseRef,
    ImportRequest,
    IntakePlan,
    NotFound,
    Published,
    PublishRequest,
    Request,
    SqliteStore,
    StorageError,
    VianoError,
    case_lock,
    new_package_id,
)

from ._publisher import PublisherStats, PublishMsg, mailbox, run_publisher
from ._serving import serving


class StoreHandle:
    def __init__(self, store: SqliteStore, send: trio.MemorySendChannel[PublishMsg],
                 stats: PublisherStats):
        self.store = store
        self.stats = stats
        self._send = send

    @property
    def root(self) -> Path:
        return self.store.root

    async def submit(self, request: Request) -> Published:
        """Send one request to the publisher and wait for its durable acknowledgement."""
        msg = PublishMsg(request)
        try:
            await self._send.send(msg)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StorageError("the store's publisher is not running",
                               reason="store_unavailable",
                               hint="Use the handle only inside its 'async with open_store()'."
                               ) from exc
        await msg.done.wait()
        outcome = msg.outcome
        if isinstance(outcome, VianoError):
            raise outcome
        assert outcome is not None
        return outcome

    async def publish(self, request: PublishRequest) -> Published:
        return await self.submit(request)

    async def intake(self, plan: IntakePlan) -> Published:
        """Create a case from a prepared intake, holding the case lock while publishing."""
        with case_lock(self.root, plan.case_id):
            return await self.publish(PublishRequest(
                package_id=new_package_id(), case_id=plan.case_id, expected_generation=None,
                change=plan.change))

    async def import_package(self, request: ImportRequest) -> Published:
        with case_lock(self.root, request.case_id):
            return await self.submit(request)

    async def case(self, case_id: str) -> CaseRef:
        return await trio.to_thread.run_sync(self.store.case, case_id)

    async def list_cases(self) -> list[CaseRef]:
        return await trio.to_thread.run_sync(self.store.list_cases)

    async def manifest(self, case_id: str, generation: int | None = None) -> dict[str, Any]:
        return await trio.to_thread.run_sync(self.store.manifest, case_id, generation)

    async def read_file(self, case_id: str, path: str, generation: int | None = None) -> bytes:
        manifest = await self.manifest(case_id, generation)
        entry = manifest["files"].get(path)
        if entry is None:
            raise NotFound(f"case {case_id!r} has no file {path!r}", reason="unknown_path",
                           hint=f"Run 'viano show {case_id}' to list its files.")
        return await trio.to_thread.run_sync(self.store.read_blob, entry["sha256"])


@asynccontextmanager
async def open_store(root: str | Path, *, group_commit: bool = True, max_batch: int = 1024,
                     inline_threshold: int | None = None) -> AsyncIterator[StoreHandle]:
    """Open (creating if needed) the store at ``root`` and run its publisher.

    On exit the mailbox is closed and the publisher drains what is already queued before
    the store closes; on cancellation a commit in progress still finishes (shielded).
    """
    kw = {} if inline_threshold is None else {"inline_threshold": inline_threshold}
    store = await trio.to_thread.run_sync(lambda: SqliteStore.open(root, create=True, **kw))
    stats = PublisherStats()
    send, recv = mailbox()
    try:
        async with serving(lambda **ts: run_publisher(
                recv, store, max_batch=max_batch, group_commit=group_commit, stats=stats, **ts),
                send):
            yield StoreHandle(store, send, stats)
    finally:
        store.close()
