"""Case leases as rows of ``viano_leases``, shared by every worker on one PostgreSQL store.

A lease is ``(case_id, holder, expires_at)``; expiry is the database server's clock, so
hosts whose clocks disagree still agree on it. A worker takes a lease with one upsert that
succeeds only if the row is absent, its own, or expired; it releases it by deleting its own
row. One thread per store renews every lease the process holds in one statement every
``lease_s / 3`` seconds, so 512 cases in flight cost one round trip per renewal, not 512
connections. A worker that dies (SIGKILL, a lost host) stops renewing, and its leases
expire after ``lease_s``: another worker then takes the case over. A worker that wakes up
late after its lease was taken is fenced twice: the commit refuses a request for a case
leased to another holder (``lease_lost``), and the generation compare-and-swap refuses a
stale parent whatever the leases say.

Work is handed out by :meth:`Leases.claim`: ``SELECT … FOR UPDATE SKIP LOCKED`` over the due
index and the upsert of the leases in one statement, so two workers claiming at the same
moment never get the same case.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .._errors import CaseLocked

log = logging.getLogger("viano.store")

TAKE = """
INSERT INTO viano_leases AS l (case_id, holder, expires_at)
VALUES (%(case)s, %(me)s, clock_timestamp() + %(lease)s * interval '1 second')
ON CONFLICT (case_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp()
RETURNING 1
"""
RENEW = """
UPDATE viano_leases SET expires_at = clock_timestamp() + %(lease)s * interval '1 second'
WHERE holder = %(me)s AND case_id = ANY(%(cases)s) RETURNING case_id
"""
RELEASE = "DELETE FROM viano_leases WHERE case_id = %(case)s AND holder = %(me)s"
RELEASE_ALL = "DELETE FROM viano_leases WHERE holder = %(me)s"
# Held by someone else: live, or (for a case this process believes it holds) at all.
FENCE = """
SELECT case_id FROM viano_leases
WHERE case_id = ANY(%(cases)s) AND holder <> %(me)s
  AND (expires_at > clock_timestamp() OR case_id = ANY(%(held)s))
"""
CLAIM = """
WITH due AS (
    SELECT r.case_id, COALESCE(r.due_at, %(now)s) AS sort_key FROM viano_refs r
    WHERE ({where}) AND r.case_id <> ALL(%(skip)s)
      AND NOT EXISTS (SELECT 1 FROM viano_leases l WHERE l.case_id = r.case_id
                      AND l.holder <> %(me)s AND l.expires_at > clock_timestamp())
    ORDER BY sort_key, r.case_id LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
), taken AS (
    INSERT INTO viano_leases AS l (case_id, holder, expires_at)
    SELECT case_id, %(me)s, clock_timestamp() + %(lease)s * interval '1 second' FROM due
    ON CONFLICT (case_id) DO UPDATE SET holder = excluded.holder,
        expires_at = excluded.expires_at
    WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp()
    RETURNING case_id
)
SELECT c.considered, x.* FROM (SELECT count(*) AS considered FROM due) c
LEFT JOIN (SELECT {columns}, due.sort_key FROM viano_refs r JOIN due USING (case_id)
           WHERE r.case_id IN (SELECT case_id FROM taken)) x ON true
ORDER BY x.sort_key, x.case_id
"""
# The claim's rows carry how many due rows it considered: fewer taken than considered means
# another worker's claim committed between this statement's snapshot and its row locks (its
# leases were not yet visible), and the claim is made again with a fresh snapshot.
CLAIM_ATTEMPTS = 8

Connect = Callable[[], AbstractContextManager[Any]]


class Leases:
    """The leases one store handle holds, and the thread that renews them.

    ``_held`` are the cases a ``hold`` is inside (it refuses a second one at once);
    ``_taken`` the subset whose row this handle has taken and not yet given back (what
    renewal renews); ``_lost`` those whose row another holder took while this one held
    them (its commits are fenced, and its next step refused)."""

    def __init__(self, connect: Connect, holder: str, lease_s: float):
        self.connect = connect
        self.holder = holder
        self.lease_s = lease_s
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._taken: set[str] = set()
        self._lost: set[str] = set()
        self._claimed: dict[str, float] = {}  # case -> monotonic time of the claim
        self._confirmed: dict[str, float] = {}  # case -> when its row was last known ours
        self._hold_no: dict[str, int] = {}  # case -> which hold of it this is (renewal)
        self._holds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.lost = 0
        self._took_any = False  # a lease or a claim was ever taken: close gives them back

    @property
    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def is_lost(self, case_id: str) -> bool:
        with self._lock:
            return case_id in self._lost

    def claimed(self, case_ids: Collection[str], at: float | None = None) -> None:
        """Note claims made at monotonic time ``at`` (taken before the claim's first
        statement: the server set the expiry after it)."""
        now = time.monotonic() if at is None else at
        with self._lock:
            self._took_any = self._took_any or bool(case_ids)
            for case in [c for c, t in self._claimed.items() if now - t > self.lease_s]:
                del self._claimed[case]
            for case in case_ids:
                self._claimed[case] = now

    @contextmanager
    def hold(self, case_id: str) -> Iterator[None]:
        with self._lock:
            if case_id in self._held:
                raise CaseLocked(f"case {case_id!r} is locked by another dispatch")
            self._held.add(case_id)
            claimed_at = self._claimed.pop(case_id, None)
        try:
            # A claim this process made a moment ago stands (its row expires lease_s after
            # it, by the server's clock, and renewal comes every lease_s / 3): no second
            # round trip to take it.
            fresh = claimed_at is not None and time.monotonic() - claimed_at < self.lease_s / 4
            confirmed = claimed_at if fresh else time.monotonic()
            if not fresh and not self._take(case_id):
                raise CaseLocked(f"case {case_id!r} is leased by another worker")
            with self._lock:
                self._taken.add(case_id)
                self._lost.discard(case_id)
                self._holds += 1
                self._hold_no[case_id] = self._holds
                self._confirmed[case_id] = confirmed if confirmed is not None else 0.0
            self._start()
            try:
                yield
            finally:
                self._release(case_id)
        finally:
            with self._lock:
                self._held.discard(case_id)
                self._taken.discard(case_id)
                self._lost.discard(case_id)
                self._confirmed.pop(case_id, None)
                self._hold_no.pop(case_id, None)

    def _take(self, case_id: str) -> bool:
        with self.connect() as conn:
            taken = conn.execute(TAKE, {"case": case_id, "me": self.holder,
                                        "lease": self.lease_s}).fetchone() is not None
        with self._lock:
            self._took_any = self._took_any or taken
        return taken

    def still_held(self, case_id: str) -> bool:
        """Before a step: False if this handle holds ``case_id`` but has lost it. When the
        row was last known ours more than lease_s / 2 ago (renewals are late: this process
        stalled), it is asserted again (one round trip) rather than trusted."""
        with self._lock:
            if case_id in self._lost:
                return False
            if case_id not in self._taken:
                return True  # not held here: nothing to fence
            stale = time.monotonic() - self._confirmed.get(case_id, 0.0) > self.lease_s / 2
        if not stale:
            return True
        if self._take(case_id):
            with self._lock:
                self._confirmed[case_id] = time.monotonic()
            return True
        with self._lock:
            self._lost.add(case_id)
        self.lost += 1
        log.warning("lost the lease on case %r while this worker stalled", case_id)
        return False

    def _release(self, case_id: str) -> None:
        with self._lock:
            self._taken.discard(case_id)  # renewal leaves it alone from here on
        try:
            with self.connect() as conn:
                conn.execute(RELEASE, {"case": case_id, "me": self.holder})
        except Exception as exc:  # the lease expires by itself; the work is done
            log.warning("could not release the lease on case %r (%s); it expires in %.0f s",
                        case_id, type(exc).__name__, self.lease_s)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                                name="viano-lease-renewal")
                self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            self.renew()

    def renew(self) -> None:
        """Push out the expiry of every lease taken; one that another holder took (this
        process stalled past its expiry) is marked lost: counted, logged, fenced."""
        with self._lock:
            taken = sorted(self._taken)
            holds = {c: self._hold_no.get(c) for c in taken}
        if not taken:
            return
        started = time.monotonic()
        try:
            with self.connect() as conn:
                kept = {r[0] for r in conn.execute(RENEW, {"lease": self.lease_s,
                                                           "me": self.holder,
                                                           "cases": taken})}
        except Exception as exc:
            log.warning("could not renew %d case lease(s) (%s); retrying in %.1f s",
                        len(taken), type(exc).__name__, self.lease_s / 3)
            return
        self.renewals += 1
        with self._lock:  # the same hold still taken: not released (nor held anew) meanwhile
            lost = [c for c in taken if c not in kept and c in self._taken
                    and self._hold_no.get(c) == holds[c]]
            self._lost.update(lost)
            for c in kept:
                if c in self._confirmed and self._hold_no.get(c) == holds.get(c):
                    self._confirmed[c] = started
        if lost:
            self.lost += len(lost)
            log.warning("lost the lease on %d case(s) (%s): their next steps and commits "
                        "are refused", len(lost), ", ".join(lost[:5]))

    def close(self) -> None:
        """Stop renewing and give back every lease and claim of this handle."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if not self._took_any:  # nothing to give back (a reader; a role that may only
                return              # read, which was warned on every command it ran)
        try:
            with self.connect() as conn:
                conn.execute(RELEASE_ALL, {"me": self.holder})
        except Exception as exc:
            log.warning("could not release this worker's leases (%s); they expire in "
                        "%.0f s", type(exc).__name__, self.lease_s)
