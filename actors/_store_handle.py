"""``open_store``: the store with its publisher actor running, as one handle.

    async with open_store("viano-store") as store:
        published = await store.intake(plan)
        snap = await store.snapshot("BUG-20")
        data = await snap.read("case/catalogue.json")
        snap = await snap.publish(change)        # on top of exactly that generation

Reads go to the backend on one of ``Store.reader_threads`` worker threads
(``StoreHandle.run_sync``), except a case step's head and plan on a backend whose reads
wait on no network (``run_local``); every write goes through the publisher. A
:class:`Snapshot` is one generation as read: its manifest, reads from that generation
only (by the hashes it lists, so two reads can never see two generations), and
``publish`` bound to it as the expected parent.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from engine import (
    CaseRef,
    CaseStatus,
    Change,
    ImportRequest,
    IntakePlan,
    InterruptedAfterCommit,
    Manifest,
    NotFound,
    Published,
    PublishRequest,
    Request,
    StatusRequest,
    StorageError,
    Store,
    StoreConfig,
    VianoError,
    loads_untrusted,
    new_package_id,
    open_backend,
)

from ._publisher import PublisherStats, PublishMsg, mailbox, run_publisher
from ._serving import serving
from ._workers import Workers, open_workers

T = TypeVar("T")


@trio.lowlevel.enable_ki_protection
def _uninterrupted(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """``fn(*args)`` with Ctrl-C held back: trio delivers it at the next checkpoint, as it
    does to a job on a worker thread (a KeyboardInterrupt inside a plan would drop what it
    was making, a paid model answer included)."""
    return fn(*args)


class StoreHandle:
    def __init__(self, store: Store, send: trio.MemorySendChannel[PublishMsg],
                 stats: PublisherStats, threads: Workers):
        self.store = store
        self.stats = stats
        self._send = send
        self.workers = threads
        # The last publication this handle's callers saw committed: set with no
        # checkpoint between the outcome and it, so an interrupted command can tell
        # whether its change landed, wherever the interruption reached it.
        self.last_committed: Published | None = None

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the backend's ``reader_threads`` worker threads: the
        store's reads and the engine's work on what they read. The publisher's commits
        share the same threads (``open_store``): a commit that waits for one gathers more
        publications. Never abandoned once started (``_workers``)."""
        return await self.workers.run(fn, *args)

    async def run_local(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` for work that is mostly Python over a few local reads (a case
        step's plan: its head and its documents, each within the intake limits): on this
        thread when the backend's reads wait on no network (SQLite), else as
        :meth:`run_sync`. A hop to a worker thread costs more than such a job saves the
        event loop: every hop hands the GIL to the worker and back, and with two threads
        running Python the interpreter forces switches between them (strace of 2,000 cases
        at 0 ms: ~490 futex calls per case). Measured in ``bench/throughput.py`` (see the
        README). The same rules as a hop: cancelled before it starts, it never runs;
        started, it is never abandoned — neither a cancellation nor a Ctrl-C cuts it short
        (a plan that holds a model's paid answer must reach the caller's commit), and
        either comes at the caller's next checkpoint; and every call, also one whose job
        raises, lets the other tasks run first. Inline, a job holds the loop while it runs:
        a few hundred µs for a plan, tens of ms for one that reads a report of many MiB."""
        if self.store.reads_block:
            return await self.workers.run(fn, *args)
        await trio.lowlevel.checkpoint()  # the cancel point and the schedule point
        return _uninterrupted(fn, args)

    @property
    def location(self) -> str:
        return self.store.location

    def enqueue(self, request: Request) -> PublishMsg:
        """Put one request in the publisher's mailbox without waiting; its ``done`` event
        is set with its outcome once it is committed (or refused)."""
        msg = PublishMsg(request)
        try:
            self._send.send_nowait(msg)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StorageError("the store's publisher is not running",
                               reason="store_unavailable",
                               hint="Use the handle only inside its 'async with open_store()'."
                               ) from exc
        return msg

    async def submit(self, request: Request) -> Published:
        """Send one request to the publisher and wait for its durable acknowledgement."""
        msg = self.enqueue(request)
        try:
            await msg.done.wait()
        except KeyboardInterrupt as interrupt:
            # Sent: it commits, or not, on its merits whatever comes now, and the publisher
            # answers it promptly. Which it was is what the interrupted command must say.
            with trio.CancelScope(shield=True):
                await msg.done.wait()
            if isinstance(msg.outcome, Published):
                self.last_committed = msg.outcome
                raise InterruptedAfterCommit(msg.outcome) from interrupt
            raise
        outcome = msg.outcome
        if isinstance(outcome, VianoError):
            raise outcome
        assert outcome is not None
        self.last_committed = outcome
        return outcome

    async def publish(self, request: PublishRequest) -> Published:
        return await self.submit(request)

    @asynccontextmanager
    async def lease(self, case_id: str) -> AsyncIterator[None]:
        """Hold the case's lease for the ``async with`` block (non-blocking: busy raises
        ``CaseLocked`` at once). A case actor holds it for a whole dispatch. A backend
        whose leases are network round trips takes and gives them back on a worker
        thread (the release shielded: a cancelled dispatch still gives its lease back);
        a local ``flock`` is taken here, without a thread hop."""
        held = self.store.lease(case_id)
        if not self.store.leases_block:
            with held:
                yield
            return
        await self.run_sync(held.__enter__)
        try:
            yield
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                swallowed = await self.run_sync(
                    held.__exit__, type(exc), exc, exc.__traceback__)
            if not swallowed:
                raise
        else:
            with trio.CancelScope(shield=True):
                await self.run_sync(held.__exit__, None, None, None)

    async def intake(self, plan: IntakePlan) -> Published:
        """Create a case from a prepared intake, holding its lease while publishing."""
        async with self.lease(plan.case_id):
            return await self.publish(PublishRequest(
                package_id=new_package_id(), case_id=plan.case_id, expected_generation=None,
                change=plan.change, status=CaseStatus(status="READY", phase=plan.change.phase
                                                      or "INTAKE", reason="intake")))

    async def import_package(self, request: ImportRequest) -> Published:
        async with self.lease(request.case_id):
            return await self.submit(request)

    async def case(self, case_id: str) -> CaseRef:
        return await self.run_sync(self.store.case, case_id)

    async def list_cases(self) -> list[CaseRef]:
        return await self.run_sync(self.store.list_cases)

    async def snapshot(self, case_id: str, generation: int | None = None) -> Snapshot:
        """The head generation of ``case_id`` (or the given one), as one snapshot."""
        def read() -> Manifest:
            ref = self.store.case(case_id)
            return self.store.manifest(ref.package_id,
                                       ref.generation if generation is None else generation)

        return Snapshot(self, await self.run_sync(read))

    async def head(self, case_id: str) -> tuple[CaseRef, Snapshot]:
        """The case's index row (with its durable status) and its head, read together."""
        ref, manifest = await self.run_local(self.store.head, case_id)
        return ref, Snapshot(self, manifest)

    async def head_with(self, case_id: str, work: Callable[[Snapshot], T]
                        ) -> tuple[CaseRef, Snapshot, T]:
        """The head and ``work`` done on it, in one job (:meth:`run_local`)."""
        def run() -> tuple[CaseRef, Snapshot, T]:
            ref, manifest = self.store.head(case_id)
            snap = Snapshot(self, manifest)
            return ref, snap, work(snap)

        return await self.run_local(run)

    def snapshot_of(self, published: Published) -> Snapshot:
        return Snapshot(self, published.manifest)

    async def manifest(self, case_id: str, generation: int | None = None) -> Manifest:
        return (await self.snapshot(case_id, generation)).manifest

    async def read_file(self, case_id: str, path: str, generation: int | None = None) -> bytes:
        return await (await self.snapshot(case_id, generation)).read(path)

    async def read_blob(self, sha256: str) -> bytes:
        return await self.run_sync(self.store.read_blob, sha256)


@attrs.frozen
class Snapshot:
    """One generation of one package, as read."""

    handle: StoreHandle
    manifest: Manifest

    @property
    def generation(self) -> int:
        return self.manifest.package_generation

    def has(self, path: str) -> bool:
        return path in self.manifest.files

    async def read(self, path: str) -> bytes:
        entry = self.manifest.files.get(path)
        if entry is None:
            raise NotFound(f"case {self.manifest.case_id!r} has no file {path!r} in generation "
                           f"{self.generation}", reason="unknown_path",
                           hint=f"Run 'viano show {self.manifest.case_id}' to list its files.")
        return await self.handle.read_blob(entry.sha256)

    async def read_json(self, path: str) -> Any:
        """A JSON artifact of this generation, read strictly (it could have been imported)."""
        return loads_untrusted(await self.read(path))

    async def publish(self, change: Change, status: CaseStatus | None = None) -> Snapshot:
        """The next generation on top of exactly this one (``StaleGeneration`` if another
        writer moved the package meanwhile)."""
        published = await self.handle.publish(PublishRequest(
            self.manifest.package_id, self.manifest.case_id, self.generation, change, status))
        return Snapshot(self.handle, published.manifest)

    async def set_status(self, status: CaseStatus) -> None:
        """The case's durable status, fenced by this generation."""
        await self.handle.submit(StatusRequest(self.manifest.package_id, self.manifest.case_id,
                                               self.generation, status))


@asynccontextmanager
async def open_store(location: str | os.PathLike[str], *, create: bool = True,
                     group_commit: bool = True, max_batch: int = 1024,
                     inline_threshold: int | None = None,
                     settings: StoreConfig | None = None) -> AsyncIterator[StoreHandle]:
    """Open (creating if needed, unless ``create`` is false) the store at ``location`` and
    run its publisher.

    On exit the mailbox is closed and the publisher drains what is already queued before
    the store closes; on cancellation a commit in progress still finishes (shielded).
    """
    kw: dict[str, Any] = {} if inline_threshold is None else {
        "inline_threshold": inline_threshold}
    if settings is not None:
        kw.update(blob_root=settings.blob_root, lease_s=settings.lease_s)
    store = await trio.to_thread.run_sync(lambda: open_backend(location, write=True,
                                                               create=create, **kw))
    stats = PublisherStats()
    send, recv = mailbox()
    try:
        async with open_workers(store.reader_threads, "viano-store") as threads, \
                serving(lambda **ts: run_publisher(
                    recv, store, max_batch=max_batch, group_commit=group_commit, stats=stats,
                    threads=threads, **ts), send):
            yield StoreHandle(store, send, stats, threads)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)
