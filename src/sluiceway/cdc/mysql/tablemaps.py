"""Table-map events decoded once per distinct event, not once per transaction.

The server writes a table-map event before the row events of every transaction, one per table
it touched. python-mysql-replication parses each from scratch — the column types, the optional
metadata with every column's name and charset, a ``Table`` whose primary key it finds by
building a dict per column — which for one-row transactions is about half of its decoding
time. An event with the same bytes (table id, names, types, metadata: everything the parse
reads, under the same stream's filters) parses the same, so :func:`install` memoizes the parse
by the event's bytes, per stream, for the streams that ask (a :class:`TableMap`): a hit copies
the parsed fields and registers the same ``Table`` in the stream's table map. A change of the
table (``ALTER``, a new table id) changes the bytes, and is parsed afresh.

It relies on two details of the library and of PyMySQL (the event's bytes in the packet at its
read position); where either is missing it leaves the library's parse in place.
"""

from __future__ import annotations

import threading
from typing import Any

#: Parses a stream keeps (tables times their DDL history); past this it starts over.
LIMIT = 4096
_lock = threading.Lock()
_installed = False
#: Fields of an event that belong to the stream it came from, not to its parse.
_PER_STREAM = ("packet", "table_map", "_ctl_connection")


class TableMap(dict[int, Any]):
    """A stream's table map whose events are memoized in ``memo`` (parsed fields by event bytes).

    One stream's maps share one memo: give the map that replaces it (at a rotate) the same
    ``memo``. Streams with a plain dict — other users of the library in the process — parse as
    the library does."""

    def __init__(self, memo: dict[bytes, dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.memo: dict[bytes, dict[str, Any]] = {} if memo is None else memo


def install() -> None:
    """Memoize ``TableMapEvent``'s parse for streams whose ``table_map`` is a :class:`TableMap`
    (once per process; idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from pymysqlreplication.row_event import TableMapEvent

        original = TableMapEvent.__init__

        def __init__(self: Any, from_packet: Any, size: int, table_map: Any, ctl: Any, **kw: Any) -> None:
            body = _event_bytes(from_packet, size) if isinstance(table_map, TableMap) else None
            if body is None:
                original(self, from_packet, size, table_map, ctl, **kw)
                return
            memo = table_map.memo
            hit = memo.get(body)
            if hit is not None:
                self.__dict__.update(hit)
                self.packet, self.table_map, self._ctl_connection = from_packet, table_map, ctl
                self.timestamp, self.event_size = from_packet.timestamp, size
                table_map[self.table_id] = self.table_obj
                return
            original(self, from_packet, size, table_map, ctl, **kw)
            if self._processed and getattr(self, "table_obj", None) is not None:
                if len(memo) >= LIMIT:
                    memo.clear()
                memo[body] = {k: v for k, v in self.__dict__.items() if k not in _PER_STREAM}

        TableMapEvent.__init__ = __init__
        _installed = True


def _event_bytes(wrapper: Any, size: int) -> bytes | None:
    """The event's body (after its header), from the PyMySQL packet under the library's wrapper."""
    packet = getattr(wrapper, "packet", None)
    data, at = getattr(packet, "_data", None), getattr(packet, "_position", None)
    if not isinstance(data, bytes | bytearray) or not isinstance(at, int) or size <= 0:
        return None
    if getattr(wrapper, "_BinLogPacketWrapper__data_buffer", b""):
        return None  # bytes pushed back: the read position is not the event's
    return bytes(data[at : at + size])
