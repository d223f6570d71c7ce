"""The MP/R bookkeeping: per-key barrier, throttle, forceRemark — pure, thread-safe, no I/O.

A record is *in flight* from the moment it is handed to a send queue until its delivery is
settled (purged, buried, or reset); at most ``max_in_flight`` are (the throttle). At most one
record per key is in flight or about to be (the per-key barrier). Marked records that cannot go
yet wait instead of blocking the marker (goharvest blocks the whole marker at the barrier):

* *pending*: behind a busy key, in that key's FIFO;
* *ready*: the key is free but the throttle is full — first in line for the next free slot.
  A ready record already holds its key's barrier, so no later record of the key can pass it.

Invariants checked at run time (a violation raises :class:`InvariantViolation`):
* a key's dispatched ids never go backwards — a re-send is the same id again, never an older one
  after a newer (that would be reordering, not duplication);
* a settled record was in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from sluiceway.errors import InvariantViolation
from sluiceway.outbox.record import MarkedRecord


class Dispatcher:
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._busy: dict[str, int] = {}  # key -> id holding its barrier (in flight or ready)
        self._in_flight_ids: set[int] = set()
        self._ready: deque[MarkedRecord] = deque()
        self._pending: dict[str, deque[MarkedRecord]] = {}
        self._held_ids: set[int] = set()  # ids that are ready or pending
        self._last_sent: dict[str, int] = {}
        self._force_remark = False
        #: Bumped by every refresh (new leader id): batches marked under an older one are stale.
        self.generation = 0

    # -- views -------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._in_flight_ids)

    @property
    def pending(self) -> int:
        """Records marked but not yet sent (pending behind a key, or ready behind the throttle)."""
        return len(self._held_ids)

    @property
    def force_remark(self) -> bool:
        return self._force_remark

    def busy_keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._busy)

    # -- marker side ---------------------------------------------------------------------------
    def wait_for_room(self, timeout: float) -> bool:
        """Block until marking more is useful: the throttle has free slots nobody is queued for,
        and the pending backlog is bounded (memory)."""
        with self._room:
            return self._room.wait_for(
                lambda: (
                    (
                        len(self._in_flight_ids) + len(self._ready) < self.max_in_flight
                        and len(self._held_ids) < self.max_in_flight
                    )
                    or self._force_remark
                ),
                timeout,
            )

    def admit(
        self, marked: Iterable[MarkedRecord], generation: int | None = None
    ) -> tuple[list[MarkedRecord], bool]:
        """Take a marked batch (any order). Return the records to send now, and whether the batch
        was abandoned — because forceRemark was raised, or because it was marked under a leader
        id that has since been refreshed (``generation``)."""
        sends: list[MarkedRecord] = []
        with self._lock:
            if generation is not None and generation != self.generation:
                return sends, True
            for record in sorted(marked, key=lambda r: r.id):
                if self._force_remark:
                    return sends, True
                if record.id in self._in_flight_ids or record.id in self._held_ids:
                    # A re-marked copy of a record we already hold (after a leader refresh): its
                    # original settles it — purged on success, reset and re-marked on failure.
                    continue
                if record.key in self._busy:
                    self._pending.setdefault(record.key, deque()).append(record)
                    self._held_ids.add(record.id)
                elif len(self._in_flight_ids) < self.max_in_flight:
                    self._busy[record.key] = record.id
                    self._dispatch(record)
                    sends.append(record)
                else:
                    self._busy[record.key] = record.id
                    self._ready.append(record)
                    self._held_ids.add(record.id)
        return sends, False

    def refresh(self) -> int:
        """The marker takes a fresh leader id: drop every unsent record (they are re-marked under
        the new id) and clear forceRemark. Returns how many were dropped."""
        with self._lock:
            dropped = len(self._held_ids)
            for record in self._ready:
                del self._busy[record.key]
            self._ready.clear()
            self._pending.clear()
            self._held_ids.clear()
            self._force_remark = False
            self.generation += 1
            self._room.notify_all()
            return dropped

    # -- purge/reset side ----------------------------------------------------------------------
    def settle(self, records: Iterable[MarkedRecord]) -> list[MarkedRecord]:
        """Records are done for good (purged or buried): lower their barriers; return what may now
        be sent (the next record of each key, and ready records for the freed slots)."""
        sends: list[MarkedRecord] = []
        with self._lock:
            for record in records:
                self._release(record)
                queue = self._pending.get(record.key)
                if queue and not self._force_remark:
                    nxt = queue.popleft()
                    if not queue:
                        del self._pending[record.key]
                    self._busy[record.key] = nxt.id
                    self._ready.append(nxt)
                else:
                    del self._busy[record.key]
            if not self._force_remark:
                while self._ready and len(self._in_flight_ids) < self.max_in_flight:
                    nxt = self._ready.popleft()
                    self._held_ids.discard(nxt.id)
                    self._dispatch(nxt)
                    sends.append(nxt)
            self._room.notify_all()
        return sends

    def fail(self, record: MarkedRecord) -> None:
        """Delivery failed and the row was reset (or may have been): raise forceRemark, lower the barrier."""
        with self._lock:
            self._release(record)
            del self._busy[record.key]
            self._force_remark = True
            self._room.notify_all()

    def abandon(self, records: Iterable[MarkedRecord]) -> None:
        """In-flight records taken off the send queues without being sent (shutdown, fencing).

        Their rows stay marked with the current leader id, so they would never be marked again
        under it: raise forceRemark, so that if the term goes on, the marker first takes a fresh
        id (and drops what waits behind them) — otherwise a key's later rows could overtake them.
        """
        with self._lock:
            for record in records:
                self._release(record)
                del self._busy[record.key]
            self._force_remark = True
            self._room.notify_all()

    # -- internals (lock held) ----------------------------------------------------------------
    def _dispatch(self, record: MarkedRecord) -> None:
        last = self._last_sent.get(record.key)
        if last is not None and record.id < last:
            raise InvariantViolation(
                f"discontinuity for key {record.key!r}: record {record.id} dispatched after {last}"
            )
        self._last_sent[record.key] = record.id
        if len(self._last_sent) > 200_000:
            # Bound memory: forget idle keys (nothing in flight or waiting for them).
            self._last_sent = {k: v for k, v in self._last_sent.items() if k in self._busy}
            self._last_sent[record.key] = record.id
        self._in_flight_ids.add(record.id)

    def _release(self, record: MarkedRecord) -> None:
        if record.id not in self._in_flight_ids or self._busy.get(record.key) != record.id:
            raise InvariantViolation(f"record {record.id} (key {record.key!r}) settled but was not in flight")
        self._in_flight_ids.discard(record.id)
