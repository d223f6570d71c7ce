"""Sequence headers and the consumer's de-duplicator.

Every record the harvester publishes can carry two headers (``sequenceHeaders``):

* ``sluice-id`` — the outbox row id, in decimal: per key, ids grow in commit order (the
  harvester already relies on it: a key's ids going backwards is an invariant violation);
* ``sluice-leader`` — the leader id that marked and sent it (a fresh UUID per term and refresh).

At-least-once delivery re-sends: a record whose acknowledgement was lost (the same id again),
and with ``perKeyInFlight`` > 1 a key's unpurged *suffix* after a failover or a delivery error
(``…, 7, 8, 9, 8, 9, 10, …``). A consumer that keeps, per key, the last ``sluice-id`` it passed
and drops anything not above it sees every record once and in order:
:class:`Deduplicator` does exactly that, with bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from sluiceway.outbox.record import Header, MarkedRecord

SLUICE_ID = "sluice-id"
SLUICE_LEADER = "sluice-leader"

_new_tuple = tuple.__new__


def with_sequence_headers(record: MarkedRecord) -> MarkedRecord:
    """The record as published: its own headers, then ``sluice-id`` and ``sluice-leader``."""
    rid, created, topic, key, value, headers, leader_id, partition = record
    extra: tuple[Header, ...] = ((SLUICE_ID, str(rid)), (SLUICE_LEADER, leader_id or ""))
    # Built as a plain tuple of the type: MarkedRecord(...) runs a Python-level __new__ (and
    # NamedTuple._replace costs several times more), once per published record.
    return _new_tuple(MarkedRecord, (rid, created, topic, key, value, headers + extra, leader_id, partition))


def sequence_id(headers: Iterable[Sequence[Any]] | None) -> int | None:
    """The ``sluice-id`` in ``headers`` (pairs of name and str/bytes value), or None.

    Accepts confluent-kafka's ``msg.headers()``, a journal record's headers and the pipeline's
    ``[{"key": …, "value": …}]`` rows alike.
    """
    if not headers:
        return None
    found: int | None = None
    for header in headers:
        if isinstance(header, dict):
            name, value = header.get("key"), header.get("value")
        else:
            name, value = header[0], header[1]
        if name == SLUICE_ID and value is not None:
            text = value.decode("ascii") if isinstance(value, bytes | bytearray) else str(value)
            try:
                found = int(text)  # the last one wins: ours is appended after the row's own
            except ValueError:
                continue
    return found


class Deduplicator:
    """Drops re-sent records: per ``(namespace, key)``, a record passes only if its ``sluice-id``
    is above the last one passed. Records without a ``sluice-id`` always pass (nothing to judge).

    >>> dedup = Deduplicator(max_keys=100_000)
    >>> [dedup.admit("k", [("sluice-id", s)]) for s in (b"7", b"8", b"7", b"8", b"9")]
    [True, True, False, False, True]

    With a confluent-kafka consumer: ``if dedup.admit(msg.key(), msg.headers(), msg.topic()):``.

    State is one integer per key, kept for the ``max_keys`` most recently seen keys (LRU). It is
    exact while a key stays among them; a key evicted and then re-sent from before its last
    passed id would pass again (plain at-least-once for that key, still in order within each
    re-send). Size ``max_keys`` above the number of keys active within a failover window.
    Not thread-safe: one per consumer thread, as a consumer is.
    """

    def __init__(self, max_keys: int = 1_000_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self._last: OrderedDict[tuple[str, str | bytes], int] = OrderedDict()
        self.passed = 0
        self.dropped = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._last)

    def admit(
        self, key: str | bytes | None, headers: Iterable[Sequence[Any]] | None, namespace: str = ""
    ) -> bool:
        """True if the record is new for its key (and remember it); False for a re-send."""
        sid = sequence_id(headers)
        if sid is None:
            self.passed += 1
            return True
        return self.admit_id(key, sid, namespace)

    def admit_id(self, key: str | bytes | None, sluice_id: int, namespace: str = "") -> bool:
        """As :meth:`admit`, with the ``sluice-id`` already parsed."""
        slot = (namespace, key if key is not None else "")
        last = self._last.get(slot)
        if last is not None:
            self._last.move_to_end(slot)
            if sluice_id <= last:
                self.dropped += 1
                return False
        self._last[slot] = sluice_id
        if last is None and len(self._last) > self.max_keys:
            self._last.popitem(last=False)
            self.evicted += 1
        self.passed += 1
        return True

    def last(self, key: str | bytes, namespace: str = "") -> int | None:
        """The last ``sluice-id`` passed for ``key``, if remembered."""
        return self._last.get((namespace, key))
