"""The rules of both elections as state machines: no threads, no sockets, no sleeping.

Time comes from an injected :class:`~sluiceway.clock.Clock` and the world through narrow ports
(a :class:`~sluiceway.election.protocol.LeaseStore`; for NELI, the messages the driver read), so
every transition — acquire, renew, lose, fence — is unit-tested by moving a clock by hand.
:class:`~sluiceway.election.lease.DatabaseLease` and :class:`~sluiceway.election.neli.KafkaElection`
are the drivers: a thread, a connection or a Kafka client, and a loop around these.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from sluiceway.clock import Clock, SystemClock
from sluiceway.election.protocol import ElectionListener, LeaseStore
from sluiceway.errors import DatabaseError, LockTimeoutError
from sluiceway.outage import BUSY_GRACE, OUTAGE_REMINDER, WarningThrottle

log = logging.getLogger("sluiceway.election")


class LeaseCampaign:
    """Campaign for, hold and renew one named lease in a :class:`LeaseStore`.

    Expiry is decided by the store's clock. Locally, the leader trusts its lease only until
    ``renewal start + ttl * safety`` by its own monotonic clock: the store set the expiry at or
    after the moment the renewal was sent, so the local view always ends first — a leader fences
    itself (stops acting) before anyone else can take over.
    """

    def __init__(
        self,
        store: LeaseStore,
        listener: ElectionListener,
        *,
        name: str,
        holder: str,
        ttl: float,
        safety: float = 0.8,
        clock: Clock | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        self.store = store
        self.listener = listener
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.safety = safety
        self.clock: Clock = clock or SystemClock()
        self.epoch = 0
        self._version = 0
        self._valid_until = 0.0  # monotonic; leadership is trusted strictly before this instant
        self._leader = False
        self._lock = threading.Lock()
        self.renew_interval = ttl / 4
        self.retry_interval = min(ttl / 4, 0.5)
        self._outage = WarningThrottle(log, OUTAGE_REMINDER, clock=self.clock.monotonic)
        self._busy = WarningThrottle(log, OUTAGE_REMINDER, clock=self.clock.monotonic, grace=BUSY_GRACE)

    def is_leader(self) -> bool:
        return self._leader and self.clock.monotonic() < self._valid_until

    def step(self) -> float:
        """Campaign once: renew while leading, else try to acquire. Return the seconds to wait
        before the next step (0 right after winning: the first renewal follows at once)."""
        try:
            if self._leader:
                self._renew()
                wait = self.renew_interval
            else:
                wait = 0.0 if self._try_acquire() else self.retry_interval
        except LockTimeoutError as exc:
            # "database is locked": another writer has SQLite's write lock. The statement did
            # nothing; ask again soon. A wait, not an outage: said only if it lasts.
            self._busy.warn(
                "lease %s: the database has been locked for a while (%s); retrying", self.name, exc
            )
            self._check_deadline()
            return min(self.retry_interval, 0.05)
        except DatabaseError as exc:
            # One line per outage (a reminder a minute while it lasts), not one per attempt.
            self._outage.warn("lease %s: database call failed (%s); retrying", self.name, exc)
            self._check_deadline()
            return min(self.retry_interval, 0.5)
        self._busy.resolved("lease %s: the database is writable again", self.name)
        self._outage.resolved(
            "lease %s: database reachable again after %.1fs", self.name, self._outage.duration()
        )
        return wait

    def resign(self) -> None:
        """Release the lease if held (on stop), so a rival need not wait for it to expire."""
        if not self._leader:
            return
        self._leader = False
        try:
            self.store.release(self.name, self.holder, self.epoch)
        except DatabaseError as exc:
            log.warning("lease %s: release failed (%s); it expires on its own", self.name, exc)
        self.listener.leader_revoked()

    def _try_acquire(self) -> bool:
        started = self.clock.monotonic()
        taken = self.store.acquire(self.name, self.holder, self.ttl)
        if taken is None:
            return False
        self.epoch, self._version = taken.epoch, taken.version
        self._valid_until = started + self.ttl * self.safety
        self._leader = True
        # "holder" is this process's id in the lease table (sluice status shows it as the leader).
        log.info(
            "lease %r acquired: this process leads (holder %s, epoch %d)", self.name, self.holder, self.epoch
        )
        self.listener.leader_acquired(self.epoch)
        return True

    def _renew(self) -> None:
        started = self.clock.monotonic()
        if self.store.renew(self.name, self.holder, self.epoch, self._version, self.ttl):
            self._version += 1
            self._valid_until = started + self.ttl * self.safety
            return
        # Someone changed the row: we lost the lease (it expired and was taken, or was released).
        self._lose(why="renewal found the lease changed")

    def _check_deadline(self) -> None:
        if self._leader and self.clock.monotonic() >= self._valid_until:
            self._lose(why="could not renew before the deadline")

    def _lose(self, *, why: str) -> None:
        with self._lock:
            if not self._leader:
                return
            self._leader = False
        log.warning("lease %r lost by this process (holder %s): %s", self.name, self.holder, why)
        self.listener.leader_fenced()


class NeliCampaign:
    """NELI's rules (goharvest/goNELI): leadership is partition 0 of the leader topic, confirmed by
    seeing one's own heartbeat there.

    Whoever the group assigns partition 0 publishes heartbeats to it and reads them back. Seeing
    its own heartbeat while assigned makes it leader (a new epoch each time) until
    ``heartbeat_timeout`` after the last one seen; past that, it fences itself on the worst-case
    assumption that the coordinator will hand partition 0 to someone else. The driver feeds in
    what the consumer reports (assignments, revocations, messages) and sends the beats this asks for.
    """

    def __init__(
        self,
        listener: ElectionListener,
        *,
        topic: str,
        group_id: str,
        member: str,
        heartbeat_timeout: float,
        heartbeat_interval: float,
        clock: Clock | None = None,
    ) -> None:
        self.listener = listener
        self.topic = topic
        self.group_id = group_id
        self.member = member
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat_interval = heartbeat_interval
        self.clock: Clock = clock or SystemClock()
        self.epoch = 0
        self.assigned = False  # partition 0 is ours according to the last rebalance callback
        self.leading = False
        self._confirmed_until = 0.0  # monotonic: our own heartbeat was seen, valid until then
        self._next_beat = 0.0

    @property
    def beat(self) -> bytes:
        """The heartbeat this member publishes (and looks for)."""
        return f"heartbeat:{self.member}".encode()

    def is_leader(self) -> bool:
        return self.leading and self.assigned and self.clock.monotonic() < self._confirmed_until

    def _holds_zero(self, partitions: Iterable[tuple[str, int]]) -> bool:
        return any(topic == self.topic and partition == 0 for topic, partition in partitions)

    def on_assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.assigned = self._holds_zero(partitions)
        if self.assigned:
            log.info("NELI: assigned partition 0 of %s; confirming with a heartbeat", self.topic)

    def on_revoke(self, partitions: Iterable[tuple[str, int]]) -> None:
        if self._holds_zero(partitions):
            self.assigned = False
            if self.leading:
                self.leading = False
                log.info("NELI: partition 0 revoked")
                self.listener.leader_revoked()

    def on_message(self, partition: int | None, value: bytes | None, now: float) -> None:
        """A message (not an error) read from the leader topic at ``now``."""
        if partition == 0 and value == self.beat and self.assigned:
            self._confirmed_until = now + self.heartbeat_timeout
            if not self.leading:
                self.leading = True
                self.epoch += 1
                log.info("NELI: leader of group %s (member %s)", self.group_id, self.member)
                self.listener.leader_acquired(self.epoch)

    def beat_due(self, now: float) -> bool:
        """Whether to publish a heartbeat now; asking schedules the next one."""
        if self.assigned and now >= self._next_beat:
            self._next_beat = now + self.heartbeat_interval
            return True
        return False

    def check_deadline(self, now: float) -> None:
        if self.leading and now >= self._confirmed_until:
            self.leading = False
            log.warning("NELI: no heartbeat seen within %.1fs: fencing", self.heartbeat_timeout)
            self.listener.leader_fenced()

    def leave(self) -> bool:
        """The driver is leaving the group: stop leading at once. Return whether we were leading;
        the driver reports the revocation once it has left."""
        was_leading = self.leading
        self.leading = False
        self.assigned = False
        return was_leading
