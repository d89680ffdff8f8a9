"""The publisher actor: the only writer of a store in this process.

Callers put :class:`PublishMsg` in its mailbox and wait on the message's event. The actor
takes everything waiting in the mailbox (up to ``max_batch``) and commits it in one
transaction on a worker thread (group commit), then answers each caller. The commit runs
under a shield and its worker-thread hop is never abandoned, so a started transaction ends
committed or rolled back, never half done, whatever is cancelled meanwhile. A caller
cancelled while waiting does not un-send its request: it may still commit, in full.

When its mailbox is closed the actor drains it: everything sent before the close is
committed (or refused on its merits) before the actor returns. Only if the actor itself is
cancelled or fails are the requests still queued answered with ``store_unavailable``.
Store upkeep (SQLite's checkpoints) is the backend's own business.
"""

from __future__ import annotations

import logging
import math

import attrs
import trio

from engine import Outcome, Published, Request, StorageError, Store

from ._workers import Workers

log = logging.getLogger("viano.publisher")


@attrs.define(eq=False)
class PublishMsg:
    request: Request
    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: Outcome | None = None


@attrs.define
class PublisherStats:
    """What the publisher committed: ``requests`` taken into transactions, of which
    ``published`` were committed (a request refused in its transaction, such as an intake
    of a case already there or a stale generation, is no publication)."""

    batches: int = 0
    requests: int = 0
    published: int = 0
    largest_batch: int = 0

    @property
    def per_transaction(self) -> float:
        return self.published / self.batches if self.batches else 0.0

    def to_json(self) -> dict[str, float]:
        return {"transactions": self.batches, "publications": self.published,
                "refused": self.requests - self.published,
                "largest_batch": self.largest_batch,
                "publications_per_transaction": round(self.per_transaction, 2)}


async def run_publisher(inbox: trio.MemoryReceiveChannel[PublishMsg], store: Store, *,
                        max_batch: int = 1024, group_commit: bool = True,
                        stats: PublisherStats | None = None,
                        threads: Workers | None = None,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    limit = max_batch if group_commit else 1
    batch: list[PublishMsg] = []
    try:
        task_status.started()
        async for first in inbox:
            batch = [first]
            while len(batch) < limit:
                try:
                    batch.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await _commit(store, batch, threads)
            if stats is not None:
                stats.batches += 1
                stats.requests += len(batch)
                stats.published += sum(isinstance(m.outcome, Published) for m in batch)
                stats.largest_batch = max(stats.largest_batch, len(batch))
    finally:
        # However the actor ends, no caller is left waiting: what was taken but not
        # answered, and what is still queued, is answered with an error (nothing of it was
        # committed by this actor after this point).
        _fail_unanswered(batch, inbox)
        inbox.close()


def _fail_unanswered(batch: list[PublishMsg], inbox: trio.MemoryReceiveChannel[PublishMsg],
                     ) -> None:
    stopped = StorageError("the publisher stopped before answering this request",
                           reason="store_unavailable",
                           hint="Check 'viano status' for what was committed, then retry.")
    pending = [m for m in batch if not m.done.is_set()]
    while True:
        try:
            pending.append(inbox.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            break
    for msg in pending:
        msg.outcome = stopped
        msg.done.set()


async def _commit(store: Store, batch: list[PublishMsg],
                  threads: Workers | None) -> None:
    requests = [m.request for m in batch]
    with trio.CancelScope(shield=True):
        try:
            # Never abandoned, either way: a started transaction ends.
            outcomes: list[Outcome] = await (
                threads.run(store.commit_batch, requests) if threads is not None
                else trio.to_thread.run_sync(store.commit_batch, requests))
        except StorageError as exc:
            # The transaction rolled back: nothing of this batch was written.
            outcomes = [exc] * len(batch)
        except Exception as exc:
            # A bug, not a refusal: fail this batch loudly, keep serving the next one.
            log.exception("commit of a batch of %d failed", len(batch))
            error = StorageError(f"commit failed unexpectedly ({type(exc).__name__})",
                                 reason="internal_error")
            outcomes = [error] * len(batch)
    for msg, outcome in zip(batch, outcomes, strict=True):
        msg.outcome = outcome
        msg.done.set()


def mailbox(size: int = 0) -> tuple[trio.MemorySendChannel[PublishMsg],
                                     trio.MemoryReceiveChannel[PublishMsg]]:
    """The publisher's mailbox. Unbounded by default: callers are bounded by their own
    concurrency, and a bounded buffer here would only move the queue into blocked senders."""
    return trio.open_memory_channel[PublishMsg](size if size else math.inf)
