"""WAL upkeep for the SQLite store: checkpoints off the commit path, and WAL restarts.

With SQLite's default auto-checkpoint almost every group commit also copied its pages into
the database file and fsynced it inside COMMIT (measured: +28% publications/s without). So
the writer never checkpoints; this thread does, on its own connection (the second core),
once per ``CHECKPOINT_BYTES`` committed. Per commit would double a lone publisher's fsyncs
(measured 1,800 → 1,000/s).

PASSIVE copies the bulk of the WAL without blocking anyone but never catches a writer that
never pauses, so alone it never lets the WAL restart: it grew to 2.6 GB in 12 s and
throughput halved as page lookups searched a growing WAL index. When the WAL's logical
length (the frame count a checkpoint reports; the file itself stays at
``journal_size_limit``) passes ``WAL_RESTART_BYTES``, a RESTART pass runs holding the
store's commit lock, so no commit is in flight and the next one starts the WAL afresh. A
reader elsewhere holding an old snapshot makes RESTART give up after 200 ms rather than
stall the writer. A failed checkpoint is logged and tried again later; it never stops
commits.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable

# Spaced so that the pages every batch rewrites (index leaves, the refs table) are copied
# once per checkpoint rather than once per few batches: 64 / 256 MiB held a 12% higher rate
# at 4 GB than 16 / 64 MiB, and wrote 69 instead of 77 KiB per publication (3 runs each,
# bench/store_sustained.py); the WAL file then stays under ~450 MB.
CHECKPOINT_BYTES = 64 * 1024 * 1024
WAL_RESTART_BYTES = 256 * 1024 * 1024

log = logging.getLogger("viano.store")


class Checkpointer:
    def __init__(self, connect: Callable[[], sqlite3.Connection], commit_lock: threading.Lock):
        self._connect = connect
        self._commit_lock = commit_lock
        self._cond = threading.Condition()
        self._committed = 0
        self._done = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._busy = False
        self.passes = 0
        self.restarts = 0
        self.failures = 0

    def committed(self, nbytes: int) -> None:
        """Called after each commit with the bytes it wrote."""
        with self._cond:
            self._committed += nbytes
            if self._committed - self._done < CHECKPOINT_BYTES:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="viano-checkpoint",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self) -> None:
        """Wait until every checkpoint due so far has run (for tests and benchmarks)."""
        with self._cond:
            while self._thread is not None and not self._stop and \
                    self._committed - self._done >= CHECKPOINT_BYTES:
                self._cond.wait()
            while self._busy:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                with self._cond:
                    while not self._stop and self._committed - self._done < CHECKPOINT_BYTES:
                        self._cond.wait()
                    if self._stop:
                        return
                    self._done = self._committed
                    self._busy = True
                try:
                    self._pass(conn)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            conn.close()

    def _pass(self, conn: sqlite3.Connection) -> None:
        try:
            _busy, frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.passes += 1
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            if frames * page > WAL_RESTART_BYTES:
                conn.execute("PRAGMA busy_timeout=200")
                try:
                    with self._commit_lock:
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                    self.restarts += 1
                finally:
                    conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.Error as exc:
            self.failures += 1
            log.warning("checkpoint failed, will retry: %s", exc)
