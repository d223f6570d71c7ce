"""An in-memory OutboxStore for unit tests of the pure harvester core (no I/O).

Answers the same verbs as the SQL store, with the same semantics: mark claims the oldest rows
whose leader id is not the caller's; purge/reset/bury act by id. ``fail_next`` injects failures,
including the nasty kind — the call takes effect, then reports an error anyway.
``tests/contract/test_outbox_store.py`` holds this fake to what the SQL store does on every database.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from sluiceway.errors import DatabaseError
from sluiceway.outbox.record import MAX_ERROR_LENGTH, MarkedRecord, OutboxRecord, validate_record


class _Bell:
    """Wake-ups of the in-memory store (what the notify trigger and LISTEN are on PostgreSQL)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._rung = self._seen = 0

    def ring(self) -> None:
        with self._cv:
            self._rung += 1
            self._cv.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._cv:
            if not self._cv.wait_for(lambda: self._rung != self._seen, timeout):
                return False
            self._seen = self._rung
            return True

    def close(self) -> None:
        pass


class MemoryOutboxStore:
    def __init__(self, *, notify: bool = False) -> None:
        #: Inserts wake listeners (:meth:`wakeups`), as the notify trigger does on PostgreSQL.
        self.notify = notify
        self._bells: list[_Bell] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.rows: dict[int, MarkedRecord] = {}
        self.dead: dict[int, tuple[MarkedRecord, str, int]] = {}
        self.parked: dict[int, str] = {}  # dead letter id -> the key it parks
        self._faults: dict[str, list[bool]] = {}  # verb -> queue of "applied before failing?" flags
        self.calls: dict[str, int] = {}

    # -- test controls -----------------------------------------------------------------------
    def stash(self, record: OutboxRecord) -> int:
        value = validate_record(record)
        with self._lock:
            rid = next(self._ids)
            self.rows[rid] = MarkedRecord(
                rid,
                datetime.now(UTC),
                record.topic,
                record.key,
                value,
                # As the SQL store reads them back: pairs as tuples, a partition of -1 as none pinned.
                tuple((name, text) for name, text in record.headers),
                None,
                record.partition if record.partition is not None and record.partition >= 0 else None,
            )
            bells = list(self._bells)
        for bell in bells:
            bell.ring()
        return rid

    def fail_next(self, verb: str, *, applied: bool = False, times: int = 1) -> None:
        """Make the next ``times`` calls of ``verb`` raise; ``applied`` = the change happens first."""
        with self._lock:
            self._faults.setdefault(verb, []).extend([applied] * times)

    def _fault(self, verb: str) -> bool | None:
        self.calls[verb] = self.calls.get(verb, 0) + 1
        queue = self._faults.get(verb)
        return queue.pop(0) if queue else None

    # -- OutboxStore -------------------------------------------------------------------------
    def mark(self, leader_id: str, limit: int) -> list[MarkedRecord]:
        with self._lock:
            fault = self._fault("mark")
            if fault is False:
                raise DatabaseError("injected: mark failed")
            out: list[MarkedRecord] = []
            parked = set(self.parked.values())
            for rid in sorted(self.rows):
                if len(out) >= limit:
                    break
                row = self.rows[rid]
                if row.leader_id != leader_id and row.key not in parked:
                    row = MarkedRecord(
                        row.id,
                        row.create_time,
                        row.topic,
                        row.key,
                        row.value,
                        row.headers,
                        leader_id,
                        row.partition,
                    )
                    self.rows[rid] = row
                    out.append(row)
            if fault is True:
                raise DatabaseError("injected: mark applied, then the connection dropped")
            return out

    def purge(self, ids: Sequence[int]) -> None:
        with self._lock:
            fault = self._fault("purge")
            if fault is False:
                raise DatabaseError("injected: purge failed")
            for rid in ids:
                self.rows.pop(rid, None)
            if fault is True:
                raise DatabaseError("injected: purge applied, then the connection dropped")

    def reset(self, record_id: int, leader_id: str) -> None:
        with self._lock:
            fault = self._fault("reset")
            if fault is False:
                raise DatabaseError("injected: reset failed")
            row = self.rows.get(record_id)
            if row is not None and row.leader_id == leader_id:
                self.rows[record_id] = MarkedRecord(
                    row.id, row.create_time, row.topic, row.key, row.value, row.headers, None, row.partition
                )
            if fault is True:
                raise DatabaseError("injected: reset applied, then the connection dropped")

    def bury(self, record: MarkedRecord, error: str, attempts: int, parked: bool = False) -> None:
        with self._lock:
            fault = self._fault("bury")
            if fault is False:
                raise DatabaseError("injected: bury failed")
            row = self.rows.pop(record.id, None)
            if row is not None:
                self.dead[record.id] = (row, error[:MAX_ERROR_LENGTH], attempts)
                if parked:
                    self.parked[record.id] = row.key
            if fault is True:
                raise DatabaseError("injected: bury applied, then the connection dropped")

    def parked_keys(self) -> int:
        with self._lock:
            return len(set(self.parked.values()))

    # -- operator actions (as outbox.deadletters does in SQL) -----------------------------------
    def retry(self, record_id: int) -> None:
        """Put a dead letter back: a parked one at the head of its key (its own id), unmarked."""
        with self._lock:
            row, _, _ = self.dead.pop(record_id)
            rid = record_id if self.parked.pop(record_id, None) is not None else next(self._ids)
            self.rows[rid] = row._replace(id=rid, leader_id=None)
            bells = list(self._bells)
        for bell in bells:
            bell.ring()

    def resolve(self, record_id: int) -> None:
        """Discard a dead letter, releasing its key."""
        with self._lock:
            del self.dead[record_id]
            self.parked.pop(record_id, None)

    def wakeups(self) -> _Bell | None:
        if not self.notify:
            return None
        bell = _Bell()
        with self._lock:
            self._bells.append(bell)
        return bell

    def close(self) -> None:
        pass
