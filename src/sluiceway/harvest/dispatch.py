"""The MP/R bookkeeping: per-key windows, throttle, forceRemark — pure, thread-safe, no I/O.

A record is *in flight* from the moment it is handed to a send queue until it leaves its key's
window (purged, buried, or reset after a failure); at most ``max_in_flight`` are (the throttle).
Each key has a *window* of at most ``per_key`` records, in id order (``perKeyInFlight``; 1 is
goharvest's per-key barrier). Marked records that cannot go yet wait instead of blocking the
marker (goharvest blocks the whole marker at the barrier):

* *pending*: behind a full (or fenced) window, in that key's FIFO;
* *ready*: in the window, but the throttle is full — first in line for the next free slot.

A window only holds records bound for one destination (topic, explicit partition): records of a
key go to one partition through one producer, whose idempotence keeps them in order and gapless.
A record bound elsewhere waits until the window is empty. A window also holds records marked
under one leader id only: a gapless publisher takes another leader id as the start of a re-send
(after a failure its key's records are dropped until one comes under a new id), so a record
marked after a refresh — raised by another key's failure or a failed mark — must not be sent
while its key's records of the older id are unreported: it waits until the window is empty.

Settling a window (:meth:`Dispatcher.acknowledge`) keeps purges in order: only the acknowledged
*prefix* of a window is purged, so a key's unpurged rows are always a suffix — a new leader
re-sends that suffix, never a hole. After a delivery error the key is *fenced*: nothing more of
it is sent, and once nothing of the window is in flight any more, its first failed record is
reported (:class:`Failure`) with the records behind it, acknowledged or not. None of those is
purged: the engine resets or buries the failed one and :meth:`close_failure` raises forceRemark,
so all of them are marked again, in order, under a fresh leader id.

Two shapes, one interface: ``Dispatcher(max_in_flight, per_key)`` makes a :class:`Barrier` for
``per_key`` 1 — a key's window is its one entry, an acknowledgement settles it straight away
(no window pass), the default path most outboxes run — and :class:`Windows` above 1.

Invariants checked at run time (a violation raises :class:`InvariantViolation`):
* a key's dispatched ids never go backwards, except back to the first record its window gave
  up unsettled (a re-send of that suffix, never an older record after a newer one);
* a settled or acknowledged record was in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from sluiceway.errors import InvariantViolation
from sluiceway.outbox.record import MarkedRecord

# States of a window entry.
READY, SENT, ACKED, FAILED, PURGING = range(5)


#: A window entry: ``[record, state]`` — a list, not an object: one is made per record on the
#: hot path, and a list is the cheapest mutable pair Python has.
_Entry = list[Any]
RECORD, STATE = 0, 1

#: A marked record's id (field 0 of the tuple), as a C-level sort key.
_ID = itemgetter(0)


class _Window:
    """A key's records in flight or ready, in id order, all bound for one topic and partition."""

    __slots__ = ("entries", "fenced", "leader_id", "partition", "topic")

    def __init__(self, record: MarkedRecord) -> None:
        self.entries: deque[_Entry] = deque()
        self.fenced = False
        self.topic, self.partition, self.leader_id = record.topic, record.partition, record.leader_id


@dataclass(frozen=True, slots=True)
class Failure:
    """A fenced key's window once nothing of it is in flight: its first failed record and the
    records sent (or withheld) behind it. None of them may be purged."""

    key: str
    record: MarkedRecord
    behind: tuple[MarkedRecord, ...] = ()


@dataclass(slots=True)
class Settlement:
    """What a round of delivery reports allows: rows to purge now (in-order prefixes of their
    windows, one statement) and drained failures to resolve (reset or bury)."""

    purge: list[MarkedRecord] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


class Dispatcher:
    """What both shapes share: the throttle and its ready line, the pending FIFOs, forceRemark and
    generations, the log of records done for good, and the per-key order invariant."""

    def __new__(cls, max_in_flight: int, per_key: int = 1) -> Dispatcher:
        if cls is Dispatcher:
            cls = Barrier if per_key == 1 else Windows
        return super().__new__(cls)

    def __init__(self, max_in_flight: int, per_key: int = 1) -> None:
        self.max_in_flight = max_in_flight
        self.per_key = per_key
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        #: key -> its window (only keys with something in flight or ready); the shape's own type.
        self._windows: dict[str, Any] = {}
        self._ready: deque[_Entry] = deque()
        self._pending: dict[str, deque[MarkedRecord]] = {}
        self._held_ids: set[int] = set()  # ids that are ready or pending
        self._last_sent: dict[str, int] = {}
        #: key -> lowest id its window gave up unsettled: where the key's re-send must start.
        self._floor: dict[str, int] = {}
        #: Keys with a delivery error this term. Written without the lock by whichever thread reports
        #: the error (set.add is atomic), read by the send threads before every send: a fenced key
        #: sends nothing more until its window is closed (:meth:`close_failure`).
        self.fenced_keys: set[str] = set()
        self._force_remark = False
        #: Bumped by every refresh (new leader id): batches marked under an older one are stale.
        self.generation = 0
        #: Bumped whenever records are done for good (purged or buried). A mark that started before
        #: may have returned a copy of such a row (it still existed then): admitting it would
        #: publish the record again. ``_done`` remembers those ids (id -> tick) until every batch
        #: marked before them has been admitted.
        self.tick = 0
        self._done: set[int] = set()
        self._done_log: deque[tuple[int, list[int]]] = deque()  # (tick, ids), oldest first

    # -- views -------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    @property
    def pending(self) -> int:
        """Records marked but not yet sent (pending behind a key, or ready behind the throttle)."""
        return len(self._held_ids)

    @property
    def force_remark(self) -> bool:
        return self._force_remark

    def busy_keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._windows)

    # -- the interface (each shape) ------------------------------------------------------------
    def admit(
        self, marked: Iterable[MarkedRecord], generation: int | None = None, tick: int | None = None
    ) -> tuple[list[MarkedRecord], bool]:
        """Take a marked batch (any order). Return the records to send now, and whether the batch
        was abandoned — because forceRemark was raised, or because it was marked under a leader
        id that has since been refreshed (``generation``). ``tick``: :attr:`tick` when the mark
        started (batches are admitted in the order they were marked)."""
        sends: list[MarkedRecord] = []
        with self._lock:
            if tick is not None:
                self._forget_done(tick)
            if generation is not None and generation != self.generation:
                return sends, True
            abandoned = self._admit(sorted(marked, key=_ID), sends)
        return sends, abandoned

    def acknowledge(self, ok: Iterable[MarkedRecord], failed: Iterable[MarkedRecord]) -> Settlement:
        """Delivery reports arrived. Returns the rows that may be purged now (each window's
        acknowledged prefix, marked as being purged: call :meth:`settle` once the DELETE has
        committed) and the failures whose windows have drained (resolve each, then
        :meth:`close_failure`)."""
        raise NotImplementedError

    def settle(self, records: Iterable[MarkedRecord]) -> list[MarkedRecord]:
        """Records are done for good (purged): they leave their windows; return what may now be
        sent (the next records of their keys, and ready records for the freed slots)."""
        sends: list[MarkedRecord] = []
        with self._lock:
            records = list(records)
            self._note_done([record.id for record in records])
            refill = self._leave_settled(records)
            self._fill(sends)  # the oldest ready records first, then what the windows now let in
            for key in refill:
                self._refill(key, sends)
            self._room.notify_all()
        return sends

    def close_failure(self, failure: Failure, *, settled: bool, park: bool = False) -> list[MarkedRecord]:
        """The engine resolved a drained failure: the failed row was reset (``settled`` False) or
        buried (True); ``park`` — buried with its key parked. Every record of the window leaves
        it. Unless the key simply goes on (buried, nothing behind it, not parked), raise
        forceRemark: the records behind are re-marked in order under a fresh leader id (or, parked,
        wait in the outbox for an operator). Returns what may now be sent."""
        sends: list[MarkedRecord] = []
        with self._lock:
            key = failure.key
            unsettled: list[int] = []
            for record in self._close(key, failure):
                if settled and record.id == failure.record.id:
                    self._note_done([record.id])
                else:
                    unsettled.append(record.id)
            self.fenced_keys.discard(key)
            if park:
                # The operator decides what comes next (retry puts the record back at the head).
                self._last_sent.pop(key, None)
                self._floor.pop(key, None)
            elif unsettled:
                self._floor[key] = min([*unsettled, self._floor.get(key, unsettled[0])])
            if park or unsettled:
                queue = self._pending.pop(key, None)
                for record in queue or ():
                    self._held_ids.discard(record.id)
                self._force_remark = True
            else:
                self._fill(sends)
                self._refill(key, sends)
            self._room.notify_all()
        return sends

    def abandon(self, records: Iterable[MarkedRecord]) -> None:
        """In-flight records taken off the send queues without being sent (shutdown, fencing).

        Their rows stay marked with the current leader id, so they would never be marked again
        under it: raise forceRemark, so that if the term goes on, the marker first takes a fresh
        id (and drops what waits behind them) — otherwise a key's later rows could overtake them.
        """
        with self._lock:
            for record in records:
                self._leave(record)
                floor = self._floor.get(record.key)
                self._floor[record.key] = record.id if floor is None else min(floor, record.id)
            self._force_remark = True
            self._room.notify_all()

    # -- marker side ---------------------------------------------------------------------------
    def wait_for_room(self, timeout: float) -> bool:
        """Block until marking more is useful: the throttle has free slots nobody is queued for,
        and the pending backlog is bounded (memory)."""
        with self._room:
            return self._room.wait_for(
                lambda: (
                    (
                        self.in_flight + len(self._ready) < self.max_in_flight
                        and len(self._held_ids) < self.max_in_flight
                    )
                    or self._force_remark
                ),
                timeout,
            )

    def refresh(self) -> int:
        """The marker takes a fresh leader id: drop every unsent record (they are re-marked under
        the new id) and clear forceRemark. Returns how many were dropped."""
        with self._lock:
            dropped = len(self._held_ids)
            for entry in self._ready:
                self._unready(entry)
            self._ready.clear()
            self._pending.clear()
            self._held_ids.clear()
            self._force_remark = False
            self.generation += 1
            self._room.notify_all()
            return dropped

    # -- internals (lock held; the shape-specific ones in each shape) --------------------------
    def _admit(self, records: list[MarkedRecord], sends: list[MarkedRecord]) -> bool:
        """Admit ``records`` (in id order) into ``sends`` or their waiting lines; True if the
        batch was abandoned (forceRemark was raised)."""
        raise NotImplementedError

    def _leave(self, record: MarkedRecord) -> None:
        """An in-flight record leaves its window (settled or abandoned)."""
        raise NotImplementedError

    def _leave_settled(self, records: list[MarkedRecord]) -> list[str]:
        """Purged records leave their windows; return the keys with records pending behind."""
        pending = self._pending
        refill: list[str] = []
        for record in records:
            self._leave(record)
            if record.key in pending:
                refill.append(record.key)
        return refill

    def _refill(self, key: str, sends: list[MarkedRecord]) -> None:
        """Move a key's pending records into its window while it has room."""
        raise NotImplementedError

    def _close(self, key: str, failure: Failure) -> list[MarkedRecord]:
        """Empty a fenced, drained window for :meth:`close_failure`; return its records."""
        raise NotImplementedError

    def _unready(self, entry: _Entry) -> None:
        """A ready (unsent) entry leaves its window: it is re-marked after a refresh."""
        raise NotImplementedError

    def _dispatch(self, entry: _Entry) -> None:
        raise NotImplementedError

    def _note_done(self, ids: list[int]) -> None:
        self.tick += 1
        self._done.update(ids)
        self._done_log.append((self.tick, ids))

    def _forget_done(self, tick: int) -> None:
        """A batch marked at ``tick`` started after everything done up to it: no copy of those can
        follow (ticks are stamped after the increment, so "done at t <= tick" means before)."""
        log = self._done_log
        while log and log[0][0] <= tick:
            self._done.difference_update(log.popleft()[1])

    def _check_order(self, key: str, rid: int) -> None:
        """The per-key order invariant, for a record about to be dispatched."""
        floor = self._floor.pop(key, None) if self._floor else None
        if floor is not None:
            if rid < floor:
                raise InvariantViolation(
                    f"discontinuity for key {key!r}: record {rid} dispatched before {floor}, "
                    "where its re-send must start"
                )
        else:
            last = self._last_sent.get(key)
            if last is not None and rid < last:
                raise InvariantViolation(
                    f"discontinuity for key {key!r}: record {rid} dispatched after {last}"
                )
        self._last_sent[key] = rid
        if len(self._last_sent) > 200_000:
            # Bound memory: forget idle keys (nothing in flight or waiting for them).
            self._last_sent = {k: v for k, v in self._last_sent.items() if k in self._windows}
            self._floor = {k: v for k, v in self._floor.items() if k in self._windows}

    def _fill(self, sends: list[MarkedRecord]) -> None:
        """Dispatch ready records, oldest first, while the throttle has room."""
        if self._force_remark:
            return
        while self._ready and self.in_flight < self.max_in_flight:
            entry = self._ready.popleft()
            self._held_ids.discard(entry[RECORD].id)
            self._dispatch(entry)
            sends.append(entry[RECORD])


class Barrier(Dispatcher):
    """``perKeyInFlight`` 1, goharvest's per-key barrier. A key's window is its one entry
    ``[record, state]``: an acknowledged record is the window's whole prefix, so it is purged
    straight from its delivery report, and a failed one has drained its window at once."""

    def __init__(self, max_in_flight: int, per_key: int = 1) -> None:
        super().__init__(max_in_flight, 1)
        self._windows: dict[str, _Entry]
        self._flying = 0

    @property
    def in_flight(self) -> int:
        return self._flying

    def _admit(self, records: list[MarkedRecord], sends: list[MarkedRecord]) -> bool:
        windows, pending, held, done = self._windows, self._pending, self._held_ids, self._done
        ready = self._ready
        for record in records:
            if self._force_remark:
                return True
            rid, key = record.id, record.key
            if rid in done:
                continue  # purged or buried after this batch was marked: a stale copy
            entry = windows.get(key)
            if entry is not None:
                if entry[RECORD].id == rid or rid in held:
                    continue  # a re-marked copy of a record we hold: its original settles it
                queue = pending.get(key)
                if queue is None:
                    pending[key] = deque((record,))
                else:
                    queue.append(record)
                held.add(rid)
                continue
            # A key with no window has nothing pending (pending keys keep their window, but
            # while forceRemark is up — and then this loop has returned).
            entry = windows[key] = [record, READY]
            if not ready and self._flying < self.max_in_flight:
                self._check_order(key, rid)  # _dispatch, inline: this is the hot path
                entry[STATE] = SENT
                self._flying += 1
                sends.append(record)
            else:
                ready.append(entry)
                held.add(rid)
        return False

    def acknowledge(self, ok: Iterable[MarkedRecord], failed: Iterable[MarkedRecord]) -> Settlement:
        plan = Settlement()
        with self._lock:
            windows, purge = self._windows, plan.purge
            for record in ok:
                entry = windows.get(record.key)
                if entry is None or entry[STATE] != SENT or entry[RECORD].id != record.id:
                    raise _not_in_flight(record, "acknowledged")
                entry[STATE] = PURGING
                purge.append(entry[RECORD])
            for record in failed:
                entry = windows.get(record.key)
                if entry is None or entry[STATE] != SENT or entry[RECORD].id != record.id:
                    raise _not_in_flight(record, "acknowledged")
                entry[STATE] = FAILED
                self.fenced_keys.add(record.key)
                plan.failures.append(Failure(record.key, entry[RECORD]))
        return plan

    def _leave_settled(self, records: list[MarkedRecord]) -> list[str]:
        # _leave unrolled: this runs once for every record purged.
        windows, pending = self._windows, self._pending
        refill: list[str] = []
        for record in records:
            key = record.key
            entry = windows.get(key)
            if entry is None or entry[STATE] in (READY, FAILED) or entry[RECORD].id != record.id:
                raise _not_in_flight(record, "settled")
            del windows[key]
            self._flying -= 1
            if key in pending:
                refill.append(key)
        return refill

    def _dispatch(self, entry: _Entry) -> None:
        record = entry[RECORD]
        self._check_order(record.key, record.id)
        entry[STATE] = SENT
        self._flying += 1

    def _leave(self, record: MarkedRecord) -> None:
        key = record.key
        entry = self._windows.get(key)
        if entry is None or entry[STATE] in (READY, FAILED) or entry[RECORD].id != record.id:
            raise _not_in_flight(record, "settled")
        del self._windows[key]
        self._flying -= 1

    def _refill(self, key: str, sends: list[MarkedRecord]) -> None:
        queue = self._pending.get(key)
        if not queue or self._force_remark or key in self._windows:
            return
        record = queue.popleft()
        if not queue:
            del self._pending[key]
        self._held_ids.discard(record.id)
        entry = self._windows[key] = [record, READY]
        if not self._ready and self._flying < self.max_in_flight:
            self._dispatch(entry)
            sends.append(record)
        else:
            self._ready.append(entry)
            self._held_ids.add(record.id)

    def _close(self, key: str, failure: Failure) -> list[MarkedRecord]:
        entry = self._windows.get(key)
        if entry is None or entry[STATE] != FAILED:
            raise _not_fenced(failure)
        del self._windows[key]
        self._flying -= 1
        return [entry[RECORD]]

    def _unready(self, entry: _Entry) -> None:
        del self._windows[entry[RECORD].key]


class Windows(Dispatcher):
    """``perKeyInFlight`` N > 1: a key's window holds up to N records in id order, for one
    destination and one leader id; only its acknowledged prefix is purged."""

    def __init__(self, max_in_flight: int, per_key: int = 2) -> None:
        super().__init__(max_in_flight, per_key)
        self._windows: dict[str, _Window]
        self._entries: dict[int, _Entry] = {}  # id -> entry, for every windowed record
        self._in_flight_ids: set[int] = set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight_ids)

    def _admit(self, records: list[MarkedRecord], sends: list[MarkedRecord]) -> bool:
        done = self._done
        for record in records:
            if self._force_remark:
                return True
            if record.id in done:
                continue  # purged or buried after this batch was marked: a stale copy
            if record.id in self._entries or record.id in self._held_ids:
                # A re-marked copy of a record we already hold (after a leader refresh): its
                # original settles it — purged on success, re-marked again on failure.
                continue
            key = record.key
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(record)
            elif key in self._pending or not self._open(window, record):
                self._pending.setdefault(key, deque()).append(record)
                self._held_ids.add(record.id)
                continue
            self._enter(window, record, sends)
        return False

    def acknowledge(self, ok: Iterable[MarkedRecord], failed: Iterable[MarkedRecord]) -> Settlement:
        plan = Settlement()
        with self._lock:
            touched: dict[str, _Window] = {}
            for record in ok:
                touched[record.key] = self._mark(record, ACKED)
            for record in failed:
                window = self._mark(record, FAILED)
                touched[record.key] = window
                if not window.fenced:
                    self._fence(record.key, window)
            for key, window in touched.items():
                if window.fenced:
                    failure = self._drained(key, window, plan.purge)
                    if failure is not None:
                        plan.failures.append(failure)
                    continue
                for entry in window.entries:
                    if entry[STATE] == ACKED:
                        entry[STATE] = PURGING
                        plan.purge.append(entry[RECORD])
                    elif entry[STATE] != PURGING:
                        break
        return plan

    # -- internals (lock held) ----------------------------------------------------------------
    def _open(self, window: _Window, record: MarkedRecord) -> bool:
        if window.fenced or len(window.entries) >= self.per_key:
            return False
        return not window.entries or (
            window.topic == record.topic
            and window.partition == record.partition
            and window.leader_id == record.leader_id
        )

    def _enter(self, window: _Window, record: MarkedRecord, sends: list[MarkedRecord]) -> None:
        """Into the window: dispatched at once if the throttle has room and nobody is queued for
        it (``sends``), else ready, in line for the next free slot."""
        if not window.entries:
            window.topic, window.partition, window.leader_id = (
                record.topic,
                record.partition,
                record.leader_id,
            )
        entry: _Entry = [record, READY]
        window.entries.append(entry)
        self._entries[record.id] = entry
        if not self._ready and not self._force_remark and len(self._in_flight_ids) < self.max_in_flight:
            self._dispatch(entry)
            sends.append(record)
        else:
            self._ready.append(entry)
            self._held_ids.add(record.id)

    def _refill(self, key: str, sends: list[MarkedRecord]) -> None:
        window = self._windows.get(key)
        queue = self._pending.get(key)
        if window is None:
            if not queue:
                return
            window = self._windows[key] = _Window(queue[0])
        if queue and not self._force_remark:
            while queue and self._open(window, queue[0]):
                record = queue.popleft()
                self._held_ids.discard(record.id)
                self._enter(window, record, sends)
            if not queue:
                del self._pending[key]
        if not window.entries and key not in self._pending:
            del self._windows[key]

    def _dispatch(self, entry: _Entry) -> None:
        record = entry[RECORD]
        self._check_order(record.key, record.id)
        entry[STATE] = SENT
        self._in_flight_ids.add(record.id)

    def _mark(self, record: MarkedRecord, state: int) -> _Window:
        entry = self._entries.get(record.id)
        if entry is None or entry[STATE] != SENT:
            raise _not_in_flight(record, "acknowledged")
        entry[STATE] = state
        return self._windows[record.key]

    def _fence(self, key: str, window: _Window) -> None:
        """A delivery of ``key`` failed: send nothing more of it. Its ready (unsent) records leave
        the window; they are marked again after the refresh that closing the failure raises."""
        window.fenced = True
        self.fenced_keys.add(key)
        while window.entries and window.entries[-1][STATE] == READY:
            entry = window.entries.pop()
            self._ready.remove(entry)
            self._held_ids.discard(entry[RECORD].id)
            del self._entries[entry[RECORD].id]

    def _drained(self, key: str, window: _Window, purge: list[MarkedRecord]) -> Failure | None:
        """A fenced window with nothing in flight: purge its acknowledged prefix; report the rest."""
        if any(entry[STATE] == SENT for entry in window.entries):
            return None
        entries = list(window.entries)
        first = 0
        while entries[first][STATE] != FAILED:
            if entries[first][STATE] == ACKED:
                entries[first][STATE] = PURGING
                purge.append(entries[first][RECORD])
            first += 1
        return Failure(key, entries[first][RECORD], tuple(e[RECORD] for e in entries[first + 1 :]))

    def _close(self, key: str, failure: Failure) -> list[MarkedRecord]:
        window = self._windows.get(key)
        if window is None or not window.fenced:
            raise _not_fenced(failure)
        records: list[MarkedRecord] = []
        for entry in window.entries:
            record = entry[RECORD]
            if entry[STATE] in (READY, SENT):
                raise InvariantViolation(f"key {key!r} closed with record {record.id} still in flight")
            del self._entries[record.id]
            self._in_flight_ids.discard(record.id)
            records.append(record)
        del self._windows[key]
        return records

    def _unready(self, entry: _Entry) -> None:
        record = entry[RECORD]
        window = self._windows[record.key]
        window.entries.remove(entry)  # ready entries are the window's unsent tail
        del self._entries[record.id]
        if not window.entries:
            del self._windows[record.key]

    def _leave(self, record: MarkedRecord) -> None:
        entry = self._entries.pop(record.id, None)
        if entry is None or record.id not in self._in_flight_ids:
            raise _not_in_flight(record, "settled")
        self._in_flight_ids.discard(record.id)
        window = self._windows[record.key]
        if window.entries[0] is entry:
            window.entries.popleft()
        else:
            window.entries.remove(entry)
        if not window.entries and not window.fenced and record.key not in self._pending:
            del self._windows[record.key]


def _not_fenced(failure: Failure) -> InvariantViolation:
    return InvariantViolation(
        f"failure of record {failure.record.id} closed but key {failure.key!r} is not fenced"
    )


def _not_in_flight(record: MarkedRecord, what: str) -> InvariantViolation:
    return InvariantViolation(f"record {record.id} (key {record.key!r}) {what} but was not in flight")
