"""SQLite takes one writer at a time; this module makes our own writers take turns fairly.

SQLite's busy handler polls: a writer that finds the file locked sleeps 1, 2, 5 … then 100 ms
between tries, while a writer in a tight loop takes the lock again microseconds after releasing
it. Under load (four application threads committing, a harvester marking and purging, a lease
renewing, all in one process on a busy machine) a polling writer can lose every try for longer
than ``busy_timeout`` and fail with "database is locked" though nothing is wrong.

So, for the connections sluiceway opens itself:

- the writers of one process queue for a database file in a :class:`WriteGate`, first come first
  served, with room at the head for the urgent ones (a lease renewal goes before a mark: a late
  renewal costs the leadership, a late mark costs nothing);
- a writer that still finds the file locked (by another process, or by an application's own
  connection) asks again every few milliseconds (:data:`POLL_SECONDS` per try of SQLite's own
  handler), not every 100 ms, until its budget is spent.

Readers never queue: WAL lets them read beside the writer.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

#: SQLite's own busy handler gets this long per try; between tries we ask again at once.
POLL_SECONDS = 0.02


class WriteGate:
    """A fair lock (first come, first served; ``urgent`` waiters go to the head of the queue).

    >>> gate = WriteGate()
    >>> gate.acquire(timeout=1.0)
    True
    >>> gate.acquire(timeout=0.01)  # held: the second waiter times out
    False
    >>> gate.release()
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held = False
        self._queue: deque[object] = deque()

    def acquire(self, *, timeout: float, urgent: bool = False) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._held and not self._queue:
                self._held = True
                return True
            ticket = object()
            if urgent:
                self._queue.appendleft(ticket)
            else:
                self._queue.append(ticket)
            try:
                while self._held or self._queue[0] is not ticket:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                self._held = True
                return True
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may be someone else now

    @property
    def waiting(self) -> int:
        """How many writers are queued behind the holder."""
        with self._cond:
            return len(self._queue)

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()


_gates: dict[str, WriteGate] = {}
_gates_lock = threading.Lock()


def gate_for(path: str) -> WriteGate | None:
    """The gate of one database file (None for an in-memory database: no one to share it)."""
    if path in ("", ":memory:") or path.startswith("file::memory:"):
        return None
    key = os.path.realpath(path)
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _gates[key] = WriteGate()
        return gate


_READS = ("SELECT", "PRAGMA", "EXPLAIN", "VALUES")


def is_write(sql: str) -> bool:
    """Whether a statement may take SQLite's write lock (anything that is not plainly a read).

    >>> is_write("  select 1"), is_write("UPDATE outbox SET x = 1"), is_write("WITH t AS (…) DELETE …")
    (False, True, True)
    """
    head = sql.lstrip()[:8].upper()
    return not head.startswith(_READS)
