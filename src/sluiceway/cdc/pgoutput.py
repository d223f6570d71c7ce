"""Decoding PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1): pure.

``pg_logical_slot_peek_binary_changes`` returns one row ``(lsn, xid, data)`` per message; this
module turns ``data`` into small values. Column values stay in PostgreSQL's *text* format
(``str``), ``None`` for SQL NULL, or :data:`UNCHANGED` for a TOASTed value an update did not
touch (the server does not send it); :mod:`sluiceway.cdc.values` maps them to JSON.

Only what a change-data-capture reader needs is decoded: Begin, Commit, Relation, Insert,
Update, Delete, Truncate, logical decoding Messages (our watermarks), Origin and Type (skipped).
Layout per message: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from sluiceway.cdc.errors import DecodeError

#: Marks a TOASTed column an UPDATE left unchanged (its value is not in the message).
UNCHANGED: Final = object()

#: The first byte of each kind of message, as :func:`decode` and the assembler tell them apart.
BEGIN: Final = 0x42  # 'B'
COMMIT: Final = 0x43  # 'C'
RELATION: Final = 0x52  # 'R'
INSERT: Final = 0x49  # 'I'
UPDATE: Final = 0x55  # 'U'
DELETE: Final = 0x44  # 'D'
TRUNCATE: Final = 0x54  # 'T'
MESSAGE: Final = 0x4D  # 'M': a logical decoding message (our watermarks)
ORIGIN: Final = 0x4F  # 'O'
TYPE: Final = 0x59  # 'Y'

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
PG_EPOCH_US: Final = 946_684_800_000_000


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` → 64-bit integer."""
    hi, _, lo = text.partition("/")
    if not lo:
        raise ValueError(f"not an LSN: {text!r} (expected 'X/Y' in hex)")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(value: int) -> str:
    """64-bit integer → ``'16/B374D848'`` (PostgreSQL's own notation)."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    schema: str
    name: str
    #: Replica identity: ``d`` default (primary key), ``f`` full, ``i`` index, ``n`` nothing.
    identity: str
    columns: tuple[Column, ...]

    @property
    def namespace(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class Begin:
    #: LSN of the commit record (its start).
    final_lsn: int
    #: Commit time, microseconds since the Unix epoch.
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    #: LSN just past the commit record: the position a reader has consumed after this transaction.
    end_lsn: int
    commit_time: int


Values = list[object]  # str | None | UNCHANGED, one per column


@dataclass(frozen=True, slots=True)
class Insert:
    relid: int
    new: Values


@dataclass(frozen=True, slots=True)
class Update:
    relid: int
    #: ``K`` (key columns only, others None), ``O`` (the whole old row) or ``""`` (not sent).
    old_kind: str
    old: Values | None
    new: Values


@dataclass(frozen=True, slots=True)
class Delete:
    relid: int
    old_kind: str
    old: Values


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Other:
    """Origin and Type messages: nothing a reader acts on."""

    kind: str


Decoded = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Message | Other


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(0, pos)
    return data[pos:end].decode(), end + 1


def _tuple(data: bytes, pos: int) -> tuple[Values, int]:
    (n,) = _I16.unpack_from(data, pos)
    pos += 2
    values: Values = []
    append = values.append
    for _ in range(n):
        kind = data[pos]
        pos += 1
        if kind == 0x74:  # 't': text
            (size,) = _I32.unpack_from(data, pos)
            pos += 4
            if size < 0 or pos + size > len(data):
                raise DecodeError(f"a column value runs past the end of the message ({size} bytes)")
            append(data[pos : pos + size].decode())
            pos += size
        elif kind == 0x6E:  # 'n': null
            append(None)
        elif kind == 0x75:  # 'u': unchanged TOASTed value
            append(UNCHANGED)
        elif kind == 0x62:  # 'b': binary — only with the 'binary' option, which we never ask for
            raise DecodeError("binary column values were not requested")
        else:
            raise DecodeError(f"unknown tuple column kind {chr(kind)!r}")
    return values, pos


def decode(data: bytes) -> Decoded:
    """One pgoutput message → a value (see the module docstring)."""
    if not data:
        raise DecodeError("empty pgoutput message")
    kind = data[0]
    try:
        if kind == INSERT:
            (relid,) = _U32.unpack_from(data, 1)
            if data[5] != 0x4E:
                raise DecodeError("insert without a new tuple")
            new, _ = _tuple(data, 6)
            return Insert(relid, new)
        if kind == UPDATE:
            (relid,) = _U32.unpack_from(data, 1)
            pos = 5
            old_kind, old = "", None
            if data[pos] in (0x4B, 0x4F):  # 'K' / 'O'
                old_kind = chr(data[pos])
                old, pos = _tuple(data, pos + 1)
            if data[pos] != 0x4E:
                raise DecodeError("update without a new tuple")
            new, _ = _tuple(data, pos + 1)
            return Update(relid, old_kind, old, new)
        if kind == DELETE:
            (relid,) = _U32.unpack_from(data, 1)
            if data[5] not in (0x4B, 0x4F):  # 'K' / 'O'
                raise DecodeError("delete without an old tuple")
            old, _ = _tuple(data, 6)
            return Delete(relid, chr(data[5]), old)
        if kind == BEGIN:
            final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
            return Begin(final_lsn, ts + PG_EPOCH_US, xid)
        if kind == COMMIT:
            _flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
            return Commit(commit_lsn, end_lsn, ts + PG_EPOCH_US)
        if kind == RELATION:
            (relid,) = _U32.unpack_from(data, 1)
            schema, pos = _cstring(data, 5)
            name, pos = _cstring(data, pos)
            identity = chr(data[pos])
            (ncols,) = _I16.unpack_from(data, pos + 1)
            pos += 3
            cols = []
            for _ in range(ncols):
                flags = data[pos]
                col, pos = _cstring(data, pos + 1)
                type_oid, typmod = struct.unpack_from(">Ii", data, pos)
                pos += 8
                cols.append(Column(col, type_oid, typmod, bool(flags & 1)))
            return Relation(relid, schema, name, identity, tuple(cols))
        if kind == MESSAGE:
            flags = data[1]
            (lsn,) = _U64.unpack_from(data, 2)
            prefix, pos = _cstring(data, 10)
            (size,) = _I32.unpack_from(data, pos)
            if size < 0 or pos + 4 + size > len(data):
                raise DecodeError(f"the content runs past the end of the message ({size} bytes)")
            return Message(bool(flags & 1), lsn, prefix, bytes(data[pos + 4 : pos + 4 + size]))
        if kind == TRUNCATE:
            (n,) = _I32.unpack_from(data, 1)
            options = data[5]
            relids = struct.unpack_from(f">{n}I", data, 6)
            return Truncate(tuple(relids), bool(options & 1), bool(options & 2))
        if kind in (ORIGIN, TYPE):
            return Other(chr(kind))
    except (struct.error, IndexError, ValueError, DecodeError) as exc:  # a tuple's own DecodeError too
        raise DecodeError(f"malformed {chr(kind)!r} message: {exc}") from None
    raise DecodeError(f"unknown pgoutput message {chr(kind)!r}")
