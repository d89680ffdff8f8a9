"""A fixed set of worker threads for the store's reads and commits: a cheaper hop than
``trio.to_thread.run_sync``, with the same cancellation rule.

A case takes about a dozen worker-thread hops (each step's plan, the record of a model's
answer, the group commits it shares). Measured here (``python bench/hop.py``, medians of
3), a hop through ``trio.to_thread.run_sync`` with a limiter costs 111 us of CPU when 64
tasks hop at once and 145 us one at a time: a thread-cache handoff, a limiter, a cancel
scope and a wakeup per call. A hop here is a job on a queue that ``size`` long-lived
threads take in turn, and its result comes back with ``run_sync_soon``: 22 us at 64 at
once, 112 us alone.

What stays as with ``to_thread.run_sync`` and a limiter (its default,
``abandon_on_cancel=False``):

- a task cancelled before a thread has taken its job raises ``Cancelled`` and the job never
  runs (a job waiting in the queue is like a task waiting for a limiter's slot);
- once a thread has taken it, the job is never abandoned: the task waits for it, and a
  cancellation is delivered at the task's next checkpoint after the job returned, so a
  started transaction always ends committed or rolled back;
- the job's exception is raised in the task, with its traceback.

What differs: a job runs in the worker thread's own context, not a copy of the caller's
(no contextvars, no ``trio.from_thread``; nothing here uses either). And the threads live
as long as the pool, so the thread-local state of the jobs (the SQLite backend's reader
connection of each thread) is made ``size`` times, not once for every thread trio's cache
starts again after 10 s idle (a long-running daemon kept opening reader connections and
never closed the old ones).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import outcome
import trio

from engine import StorageError

T = TypeVar("T")
log = logging.getLogger("viano.store")

_QUEUED, _TAKEN, _CANCELLED = 0, 1, 2


class _Job:
    __slots__ = ("args", "fn", "state", "task", "token")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]):
        self.fn, self.args = fn, args
        self.token = trio.lowlevel.current_trio_token()
        self.task = trio.lowlevel.current_task()
        self.state = _QUEUED


class Workers:
    """``size`` threads taking jobs in the order they were queued."""

    def __init__(self, size: int, name: str):
        if size < 1:
            raise ValueError("a worker pool needs at least one thread")
        self.size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(size)]
        self._lock = threading.Lock()
        self._closed = False
        self.running = 0  # jobs queued or running
        for t in self._threads:
            t.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the threads (see the module for cancellation)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        job = _Job(fn, args)
        with self._lock:  # queued under the lock: never after close()'s sentinels
            if self._closed:
                raise StorageError("the store's worker threads are closed",
                                   reason="store_unavailable",
                                   hint="Use the handle only inside its 'async with "
                                        "open_store()'.")
            self.running += 1
            self._jobs.put(job)

        def abort(_: Any) -> trio.lowlevel.Abort:
            with self._lock:
                if job.state != _QUEUED:
                    return trio.lowlevel.Abort.FAILED  # taken: wait for it to return
                job.state = _CANCELLED  # the thread that takes it skips it
                self.running -= 1
            return trio.lowlevel.Abort.SUCCEEDED

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def _work(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            with self._lock:
                taken = job.state == _QUEUED
                job.state = _TAKEN
            if not taken:  # its caller was cancelled while it waited
                del job
                continue
            result = outcome.capture(job.fn, *job.args)
            token, task = job.token, job.task
            # Dropped before the caller resumes: an idle thread holds nothing of its last
            # job's function and arguments (a batch's requests, a snapshot's closure).
            del job
            try:
                token.run_sync_soon(self._done, task, result)
            except trio.RunFinishedError:  # not expected: every caller awaits its job
                log.error("a store job finished after its trio run had ended")
                with self._lock:
                    self.running -= 1
            del result, task, token

    def _done(self, task: trio.lowlevel.Task, result: outcome.Outcome[Any]) -> None:
        with self._lock:
            self.running -= 1
        trio.lowlevel.reschedule(task, result)

    def close(self) -> None:
        """Stop the threads once the jobs queued before have run (every caller awaits its
        job, so at the end of the pool's scope there are none and this returns at once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
        for t in self._threads:
            t.join()


@asynccontextmanager
async def open_workers(size: int, name: str) -> AsyncIterator[Workers]:
    workers = Workers(size, name)
    try:
        yield workers
    finally:
        workers.close()
