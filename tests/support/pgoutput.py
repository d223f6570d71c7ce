"""Building pgoutput messages (protocol version 1) for unit tests of the decoder and assembler:
the inverse of ``sluiceway.cdc.pgoutput.decode``, plus a small stream writer that hands out LSNs
the way a WAL does (each record after the last)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluiceway.cdc.pgoutput import PG_EPOCH_US, UNCHANGED


def _cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(values: Sequence[object]) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            raw = str(value).encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def relation(
    relid: int, schema: str, name: str, columns: Sequence[tuple[str, int, bool]], identity: str = "d"
) -> bytes:
    out = b"R" + struct.pack(">I", relid) + _cstring(schema) + _cstring(name) + identity.encode()
    out += struct.pack(">h", len(columns))
    for col, oid, key in columns:
        out += bytes([1 if key else 0]) + _cstring(col) + struct.pack(">Ii", oid, -1)
    return out


def begin(final_lsn: int, xid: int, at_us: int = PG_EPOCH_US) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, at_us - PG_EPOCH_US, xid)


def commit(commit_lsn: int, end_lsn: int, at_us: int = PG_EPOCH_US) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, at_us - PG_EPOCH_US)


def insert(relid: int, values: Sequence[object]) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + tuple_data(values)


def update(relid: int, new: Sequence[object], old: Sequence[object] | None = None, kind: str = "K") -> bytes:
    out = b"U" + struct.pack(">I", relid)
    if old is not None:
        out += kind.encode() + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(relid: int, old: Sequence[object], kind: str = "K") -> bytes:
    return b"D" + struct.pack(">I", relid) + kind.encode() + tuple_data(old)


def truncate(*relids: int) -> bytes:
    return b"T" + struct.pack(">iB", len(relids), 0) + struct.pack(f">{len(relids)}I", *relids)


def message(lsn: int, prefix: str, content: str, transactional: bool = False) -> bytes:
    raw = content.encode()
    return (
        b"M"
        + bytes([1 if transactional else 0])
        + struct.pack(">Q", lsn)
        + _cstring(prefix)
        + struct.pack(">i", len(raw))
        + raw
    )


@dataclass
class Stream:
    """A slot's output as ``(lsn, xid, data)`` rows; LSNs grow by 100 per WAL record."""

    rows: list[tuple[int, int, bytes]] = field(default_factory=list)
    lsn: int = 1_000
    xid: int = 700
    described: set[int] = field(default_factory=set)

    def _next(self) -> int:
        self.lsn += 100
        return self.lsn

    def transaction(self, *changes: bytes, relations: Sequence[bytes] = (), xid: int | None = None) -> int:
        """One committed transaction; returns its position (the end of its commit record)."""
        self.xid += 1
        xid = self.xid if xid is None else xid
        first = self._next()
        final = self.lsn + 100 * len(changes) + 100
        self.rows.append((first, xid, begin(final, xid)))
        for rel in relations:
            self.rows.append((first, xid, rel))
        for change in changes:
            self.rows.append((self._next(), xid, change))
        commit_lsn = self._next()
        end = commit_lsn + 50
        self.rows.append((end, xid, commit(commit_lsn, end)))
        return end

    def watermark(self, prefix: str, content: str) -> int:
        """A non-transactional message between transactions; returns its position."""
        lsn = self._next()
        self.rows.append((lsn, 0, message(lsn, prefix, content)))
        return lsn
