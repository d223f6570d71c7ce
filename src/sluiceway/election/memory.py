"""An in-memory LeaseStore for unit tests of the lease rules (no I/O).

Answers the same verbs as the SQL store with the same semantics; its clock plays the database's
clock, so a test decides when leases expire. ``fail_next`` injects failures, including the nasty
kind — the call takes effect, then reports an error anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from sluiceway.clock import Clock
from sluiceway.election.protocol import LeaseView
from sluiceway.errors import DatabaseError

T = TypeVar("T")


class MemoryLeaseStore:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        # holder, epoch, version, expiry, acquired at
        self._rows: dict[str, tuple[str | None, int, int, float, float]] = {}
        self._faults: dict[str, list[bool]] = {}  # verb -> queue of "applied before failing?" flags
        self.calls: dict[str, int] = {}

    def fail_next(self, verb: str, *, applied: bool = False, times: int = 1) -> None:
        """Make the next ``times`` calls of ``verb`` raise; ``applied`` = the change happens first."""
        with self._lock:
            self._faults.setdefault(verb, []).extend([applied] * times)

    def _call(self, verb: str, change: Callable[[], T]) -> T:
        with self._lock:
            self.calls[verb] = self.calls.get(verb, 0) + 1
            queue = self._faults.get(verb)
            applied = queue.pop(0) if queue else None
            if applied is False:
                raise DatabaseError(f"{verb} lease: injected failure")
            result = change()
            if applied:
                raise DatabaseError(f"{verb} lease: injected failure after the change")
            return result

    def _row(self, name: str) -> tuple[str | None, int, int, float, float]:
        return self._rows.setdefault(name, (None, 0, 0, 0.0, 0.0))

    def acquire(self, name: str, holder: str, ttl: float) -> LeaseView | None:
        def change() -> LeaseView | None:
            current, epoch, version, expiry, _ = self._row(name)
            now = self.clock.monotonic()
            if current is not None and expiry >= now:
                return None
            self._rows[name] = (holder, epoch + 1, version + 1, now + ttl, now)
            return self._view(name)

        return self._call("acquire", change)

    def renew(self, name: str, holder: str, epoch: int, version: int, ttl: float) -> bool:
        def change() -> bool:
            row = self._row(name)
            if row[:3] != (holder, epoch, version):
                return False
            self._rows[name] = (holder, epoch, version + 1, self.clock.monotonic() + ttl, row[4])
            return True

        return self._call("renew", change)

    def release(self, name: str, holder: str, epoch: int) -> None:
        def change() -> None:
            current, current_epoch, version, _, _ = self._row(name)
            if (current, current_epoch) == (holder, epoch):
                self._rows[name] = (None, epoch, version + 1, 0.0, 0.0)

        self._call("release", change)

    def read(self, name: str) -> LeaseView | None:
        with self._lock:
            return self._view(name) if name in self._rows else None

    def _view(self, name: str) -> LeaseView:
        holder, epoch, version, expiry, acquired = self._rows[name]
        now = self.clock.monotonic()
        return LeaseView(holder, epoch, version, expiry - now, None if holder is None else now - acquired)

    def close(self) -> None:
        pass
