"""A fixed set of worker threads for the store's reads and commits: a cheaper hop than
``trio.to_thread.run_sync``, with the same cancellation rule.

A case takes about a dozen worker-thread hops (each step's plan, the record of a model's
answer, the group commits it shares). Measured here (``bench/hop.py``), a hop through
``trio.to_thread.run_sync`` with a limiter costs ~125 us of CPU when 64 tasks hop at once
and ~165 us one at a time: a thread cache handoff, a limiter, a cancel scope and a wakeup
per call. A hop here is a job on a queue that ``size`` long-lived threads take in turn, and
its result comes back with ``run_sync_soon``: ~25 us at 64 at once, ~120 us alone.

What stays as with ``to_thread.run_sync`` (its default, ``abandon_on_cancel=False``):

- a task cancelled before its job is queued raises ``Cancelled`` and nothing runs;
- once queued, the job is never abandoned: the task waits for it, and a cancellation is
  delivered at the task's next checkpoint after the job has returned, so a started
  transaction always ends committed or rolled back;
- the job's exception is raised in the task, with its traceback.

And one thing is new: the threads live as long as the pool, so the thread-local state of
the jobs (the SQLite backend's reader connection of each thread) is made ``size`` times,
not once for every thread that trio's cache starts again after 10 s idle (a long-running
daemon would otherwise keep opening reader connections and never close the old ones).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], trio.lowlevel.TrioToken, trio.lowlevel.Task]


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
        self.running = 0  # jobs queued or running (the tests' virtual clock reads it)
        for t in self._threads:
            t.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the threads (see the module for cancellation)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker pool is closed")
            self.running += 1
        self._jobs.put((fn, args, trio.lowlevel.current_trio_token(),
                        trio.lowlevel.current_task()))

        def abort(_: Any) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.FAILED  # never abandoned: wait for the job

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def _work(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            fn, args, token, task = job
            result = outcome.capture(fn, *args)
            del fn, args  # nothing of the job outlives it on this thread
            token.run_sync_soon(self._done, task, result)
            del task, result

    def _done(self, task: trio.lowlevel.Task, result: outcome.Outcome[Any]) -> None:
        with self._lock:
            self.running -= 1
        trio.lowlevel.reschedule(task, result)

    def close(self) -> None:
        """Stop the threads once the jobs queued before have run (every caller awaits its
        job, so at the end of the pool's scope there are none)."""
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
