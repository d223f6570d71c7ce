"""The engine's send queues: one per shard, bounded by ``sendBuffer``, moved in batches."""

from __future__ import annotations

import threading
from collections import deque

from sluiceway.outbox.record import MarkedRecord


class ShardQueue:
    """A send queue that holds at most ``capacity`` records (``sendBuffer``), moved in batches:
    one lock round trip per batch rather than per record keeps thread hand-offs cheap. Taking
    from any shard signals the shared ``room`` condition, which the enqueuer waits on."""

    def __init__(self, capacity: int, room: threading.Condition) -> None:
        self.capacity = capacity
        self._items: deque[MarkedRecord] = deque()
        self._cv = threading.Condition()
        self._room = room
        self._closed = False

    def qsize(self) -> int:
        return len(self._items)

    def offer(self, records: list[MarkedRecord], start: int) -> int:
        """Enqueue ``records[start:]`` as far as there is room, without blocking.
        Returns how many were taken, or -1 once the queue is closed."""
        with self._cv:
            if self._closed:
                return -1
            n = min(self.capacity - len(self._items), len(records) - start)
            if n > 0:
                self._items.extend(records[start : start + n])
                self._cv.notify()
            return max(n, 0)

    def take(self) -> list[MarkedRecord] | None:
        """Everything queued (blocking until something is), or None once closed and empty."""
        with self._cv:
            self._cv.wait_for(lambda: self._items or self._closed)
            if not self._items:
                return None
            batch = list(self._items)
            self._items.clear()
        with self._room:
            self._room.notify_all()
        return batch

    def close(self) -> list[MarkedRecord]:
        """Stop accepting; return what was still queued (never sent)."""
        with self._cv:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._cv.notify_all()
        return left
