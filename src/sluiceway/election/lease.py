"""Leader election by a database lease: one row per election name (holder, epoch, version, expiry).

Expiry is decided by the database clock. Locally, the leader trusts its lease only until
``renewal start + ttl * safety`` by its own monotonic clock: the database set the expiry at or
after the moment the renewal was sent, so the local view always ends first — a leader fences
itself (stops marking) before anyone else can take over.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from sluiceway.db import Database, QuerySet
from sluiceway.errors import DatabaseError
from sluiceway.harvest.ports import ElectionListener

log = logging.getLogger("sluiceway.election")

DEFAULT_LEASE_TABLE = "sluiceway_leases"


def init_leases(db: Database, table: str = DEFAULT_LEASE_TABLE) -> QuerySet:
    q = QuerySet("sluiceway.election", db.dialect, leases=table)
    db.execute(q["create_table"], what="create lease table")
    return q


@dataclass(frozen=True, slots=True)
class LeaseView:
    holder: str | None
    epoch: int
    version: int
    remaining: float


class DatabaseLease:
    """Campaigns for, holds and renews one named lease. Implements ``LeaderElection``."""

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        ttl: float = 5.0,
        table: str = DEFAULT_LEASE_TABLE,
        safety: float = 0.8,
        holder: str | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        self.dsn = dsn
        self.name = name
        self.ttl = ttl
        self.table = table
        self.safety = safety
        self.holder = holder or f"{uuid.uuid4()}"
        self.epoch = 0
        self._version = 0
        self._valid_until = 0.0  # monotonic; leadership is trusted strictly before this instant
        self._leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: ElectionListener | None = None
        self._lock = threading.Lock()
        self.renew_interval = ttl / 4
        self.retry_interval = min(ttl / 4, 0.5)

    # -- LeaderElection --------------------------------------------------------------------
    def start(self, listener: ElectionListener) -> None:
        self._listener = listener
        self._thread = threading.Thread(target=self._run, name=f"sluice-lease-{self.name}", daemon=True)
        self._thread.start()

    def is_leader(self) -> bool:
        return self._leader and time.monotonic() < self._valid_until

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl + 5)

    # -- campaign ----------------------------------------------------------------------------
    def _run(self) -> None:
        db = Database(self.dsn)
        q: QuerySet | None = None
        try:
            while not self._stop.is_set():
                try:
                    if q is None:
                        q = init_leases(db, self.table)
                        db.execute(q["ensure_row"], {"name": self.name}, what="lease row")
                    if self._leader:
                        self._renew(db, q)
                        self._stop.wait(self.renew_interval)
                    else:
                        if not self._try_acquire(db, q):
                            self._stop.wait(self.retry_interval)
                except DatabaseError as exc:
                    log.warning("lease %s: database call failed: %s", self.name, exc)
                    self._check_deadline()
                    self._stop.wait(min(self.retry_interval, 0.5))
            if self._leader and q is not None:
                self._release(db, q)
        finally:
            db.close()

    def _try_acquire(self, db: Database, q: QuerySet) -> bool:
        started = time.monotonic()
        params = {"name": self.name, "holder": self.holder, "ttl": self.ttl}
        with db.transaction():
            won = db.execute(q["acquire"], params, what="acquire lease") == 1
            row = db.fetchone(q["read"], {"name": self.name}, what="read lease") if won else None
        if not won or row is None:
            return False
        self.epoch, self._version = int(row[1]), int(row[2])
        self._valid_until = started + self.ttl * self.safety
        self._leader = True
        log.info("lease %s acquired by %s (epoch %d)", self.name, self.holder, self.epoch)
        if self._listener is not None:
            self._listener.leader_acquired(self.epoch)
        return True

    def _renew(self, db: Database, q: QuerySet) -> None:
        started = time.monotonic()
        params = {
            "name": self.name,
            "holder": self.holder,
            "epoch": self.epoch,
            "version": self._version,
            "ttl": self.ttl,
        }
        try:
            renewed = db.execute(q["renew"], params, what="renew lease") == 1
        except DatabaseError:
            self._check_deadline()
            raise
        if renewed:
            self._version += 1
            self._valid_until = started + self.ttl * self.safety
            return
        # Someone changed the row: we lost the lease (it expired and was taken, or was released).
        self._lose(fenced=True, why="renewal found the lease changed")

    def _check_deadline(self) -> None:
        if self._leader and time.monotonic() >= self._valid_until:
            self._lose(fenced=True, why="could not renew before the deadline")

    def _lose(self, *, fenced: bool, why: str) -> None:
        with self._lock:
            if not self._leader:
                return
            self._leader = False
        log.warning("lease %s lost by %s: %s", self.name, self.holder, why)
        if self._listener is not None:
            if fenced:
                self._listener.leader_fenced()
            else:
                self._listener.leader_revoked()

    def _release(self, db: Database, q: QuerySet) -> None:
        self._leader = False
        try:
            db.execute(
                q["release"], {"name": self.name, "holder": self.holder, "epoch": self.epoch}, what="release"
            )
        except DatabaseError as exc:
            log.warning("lease %s: release failed (%s); it expires on its own", self.name, exc)
        if self._listener is not None:
            self._listener.leader_revoked()

    # -- inspection -------------------------------------------------------------------------
    @staticmethod
    def view(dsn: str, name: str, table: str = DEFAULT_LEASE_TABLE) -> LeaseView | None:
        with Database(dsn) as db:
            q = init_leases(db, table)
            row = db.fetchone(q["read"], {"name": name}, what="read lease")
        if row is None:
            return None
        return LeaseView(row[0], int(row[1]), int(row[2]), float(row[3]))
