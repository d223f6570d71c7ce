"""The append transaction: validate records as they are written, encode and commit them at once.

Why it is shaped so:

* **Nothing touches the disk before the commit.** Records are validated as they are written
  and kept in memory, column by column, so aborting is free and a crashed append leaves at
  most a torn tail (that recovery truncates).
* **The work is per column, not per record.** :meth:`AppendTransaction.write` runs once per
  record, so it only validates and appends each field to its column (exact-type fast paths on
  the main line, odd cases — ``str`` or ``bytearray`` values, explicit timestamps — in helpers
  off it); :meth:`~AppendTransaction.write_many` extends whole columns. At commit the
  appending thread encodes and checksums the records block in one go
  (:func:`sluiceway.journal.encode.encode_records`) *before* it joins a commit group, so the
  writer's serialised commit path only adds a small header (:mod:`sluiceway.journal.writer`).
* **The transaction knows the writer only as a port** (:class:`Committer`): a clock and one
  ``commit`` verb that takes the encoded records and the append's expectations and returns
  the offsets, once durable. The writer never sees this class.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import repeat
from types import NoneType, TracebackType
from typing import TYPE_CHECKING, Final, Protocol, Self

import numpy as np

from sluiceway.journal.encode import ColumnPiece, EncodedRecords, encode_pieces, encode_records, frame_length
from sluiceway.journal.errors import AppendAborted, InvalidJournalRecord, JournalError
from sluiceway.journal.format import BATCH_HEADER_SIZE, MAX_FRAME_BYTES, MAX_NAMESPACE_BYTES, encode_pairs
from sluiceway.journal.record import EPOCH

if TYPE_CHECKING:
    import pyarrow as pa

MicrosClock = Callable[[], int]
"""Returns the current time in microseconds since the Unix epoch (record timestamps). Not
:class:`sluiceway.clock.Clock`, the monotonic clock of the state machines."""


_time_ns = time.time_ns
_US = timedelta(microseconds=1)


def system_clock() -> int:
    return _time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Expectations:
    """What an append requires of the journal when it commits, and the registers it sets.

    ``offset``: the first offset the append must get; ``registers``: the value each named
    register must have (``None``: unset); ``set_registers``: committed with the records.
    """

    offset: int | None = None
    registers: Mapping[str, str | None] = field(default_factory=dict)
    set_registers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def checked(
        cls,
        expect_offset: int | None,
        expect_registers: Mapping[str, str | None] | None,
        set_registers: Mapping[str, str] | None,
    ) -> Expectations:
        """Built from :meth:`Journal.append`'s arguments, each one checked.

        A bad ``expect_offset`` raises ``ValueError``; a bad register map, :class:`InvalidJournalRecord`.
        """
        if expect_offset is not None and (not isinstance(expect_offset, int) or expect_offset < 0):
            raise ValueError("expect_offset must be a non-negative int")
        expect = (
            _check_register_map("expect_registers", expect_registers, allow_none=True)
            if expect_registers
            else {}
        )
        sets: dict[str, str] = {}
        if set_registers:
            sets = {
                k: v
                for k, v in _check_register_map("set_registers", set_registers, allow_none=False).items()
                if v is not None
            }
        return cls(expect_offset, expect, sets)


NO_EXPECTATIONS: Final = Expectations()
"""Shared by every append without expectations or register updates (the common case)."""


class Committer(Protocol):
    """What an append needs from the journal's writer: its clock, and a durable commit."""

    @property
    def clock(self) -> MicrosClock: ...

    def commit(self, records: EncodedRecords, expectations: Expectations) -> range:
        """Commit the encoded records and return their offsets, once durable."""
        ...


def to_timestamp_us(timestamp: datetime | int | None, clock: MicrosClock) -> int:
    if timestamp is None:
        return clock()
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise InvalidJournalRecord("timestamp", "naive datetime (give it a timezone)")
        return (timestamp - EPOCH) // _US
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        if not -(1 << 63) <= timestamp < 1 << 63:
            raise InvalidJournalRecord("timestamp", "out of the 64-bit microsecond range")
        return timestamp
    raise InvalidJournalRecord(
        "timestamp", f"expected datetime, int (µs since epoch) or None, got {type(timestamp).__name__}"
    )


def _check_register_map(
    name: str, mapping: Mapping[str, object] | None, *, allow_none: bool
) -> dict[str, str | None]:
    if mapping is None:
        return {}
    out: dict[str, str | None] = {}
    for k, v in mapping.items():
        if not isinstance(k, str) or not (isinstance(v, str) or (allow_none and v is None)):
            raise InvalidJournalRecord(name, f"register names and values must be str, got {k!r}: {v!r}")
        out[k] = v
    return out


def _encode_headers(headers: list[tuple[str, str]]) -> bytes:
    try:
        for hk, hv in headers:
            if type(hk) is not str or type(hv) is not str:
                raise TypeError
        return encode_pairs(headers)
    except UnicodeEncodeError as exc:  # before ValueError: it is one
        raise InvalidJournalRecord("headers", f"not encodable as UTF-8: {exc.reason}") from None
    except (TypeError, ValueError):
        raise InvalidJournalRecord("headers", "must be a list of (str, str) pairs") from None


def _encode_namespace(namespace: str) -> bytes:
    if type(namespace) is not str:
        raise InvalidJournalRecord("namespace", f"must be str, got {type(namespace).__name__}")
    nsb = namespace.encode()
    if len(nsb) > MAX_NAMESPACE_BYTES:
        raise InvalidJournalRecord("namespace", f"longer than {MAX_NAMESPACE_BYTES} bytes")
    return nsb


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidJournalRecord("value", f"must be bytes or None, got {type(value).__name__}")


def _value_bytes(value: object) -> bytes:
    """``write``'s value off the fast path: ``str`` as UTF-8 (as confluent-kafka's producer does)."""
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidJournalRecord("value", f"not encodable as UTF-8: {exc.reason}") from None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidJournalRecord("value", f"must be str, bytes or None, got {type(value).__name__}")


_MAX_RECORDS_BYTES = MAX_FRAME_BYTES - BATCH_HEADER_SIZE  # without register updates
_BULK_MIN = 32  # write_many checks types column-wise (not record by record) from this many records
# Transaction states; OPEN is 0 so the per-record check is a plain truth test.
_OPEN, _COMMITTING, _COMMITTED, _ABORTED, _FAILED = range(5)
# Open, holding write_arrow's column pieces: non-zero, so the per-record check in write() sends
# it off the fast path once, to turn the pieces into lists (_writable) — no cost per record.
_ARROW = 5


class AppendTransaction:
    """One all-or-nothing append. Get one from :meth:`Journal.append`; use it as a context manager.

    Records are validated as they are written and kept in memory; nothing touches the disk until
    the append commits (on leaving the ``with`` block). An exception in the block, or
    :meth:`abort`, discards everything.
    """

    __slots__ = (
        "_arrow",
        "_clock",
        "_expectations",
        "_headers",
        "_keys",
        "_namespaces",
        "_nulls",
        "_offsets",
        "_state",
        "_system_clock",
        "_timestamps",
        "_values",
        "_writer",
    )

    def __init__(self, writer: Committer, expectations: Expectations = NO_EXPECTATIONS) -> None:
        self._writer = writer
        self._clock = writer.clock
        self._system_clock = writer.clock is system_clock
        self._expectations = expectations
        # The records so far, one column per field (encoded once, at commit).
        self._keys: list[bytes] = []
        self._values: list[bytes | None] = []
        self._namespaces: list[bytes] = []
        self._headers: list[bytes] = []  # encoded pairs blocks, b"" for none
        self._timestamps: list[int] = []
        self._nulls = False  # some value is None
        # Records written with write_arrow and nothing else so far, kept as column pieces and
        # encoded straight from them (no Python object per record); a write() turns them into
        # the per-record lists above first.
        self._arrow: list[ColumnPiece] = []
        self._state = _OPEN
        self._offsets: range | None = None

    def write(
        self,
        key: str,
        value: str | bytes | bytearray | memoryview | None,
        headers: list[tuple[str, str]] | None = None,
        namespace: str = "",
        timestamp: datetime | int | None = None,
    ) -> None:
        """Add one record to the append. ``value=None`` writes a tombstone.

        ``key`` is a ``str``; ``value`` is bytes (``bytes``, ``bytearray``, ``memoryview``) or a
        ``str``, which is stored encoded as UTF-8 (as confluent-kafka's producer does).
        ``timestamp`` is an aware ``datetime`` or microseconds since the epoch; default now.

        >>> with journal.append() as tx:                                # doctest: +SKIP
        ...     tx.write("order-1", '{"total": 12}', namespace="orders")
        """
        if self._state:
            self._writable()
        # Exact-type fast paths with the odd cases handled off the main line: this runs once
        # per record and is most of an append's CPU time.
        if type(key) is not str:
            raise InvalidJournalRecord("key", f"must be str, got {type(key).__name__}")
        try:
            kb = key.encode()
            nsb = _encode_namespace(namespace) if namespace else b""
        except UnicodeEncodeError as exc:
            raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
        if value is None:
            self._nulls = True
        elif type(value) is not bytes:
            value = _value_bytes(value)
        hb = _encode_headers(headers) if headers else b""
        if timestamp is None:
            ts = _time_ns() // 1000 if self._system_clock else self._clock()
        else:
            ts = to_timestamp_us(timestamp, self._clock)
        self._keys.append(kb)
        self._values.append(value)
        self._namespaces.append(nsb)
        self._headers.append(hb)
        self._timestamps.append(ts)

    def write_many(
        self,
        records: Iterable[tuple[str, bytes | bytearray | memoryview | None]],
        namespace: str = "",
        timestamp: datetime | int | None = None,
    ) -> int:
        """Add many ``(key, value)`` records sharing a namespace and timestamp; returns how many.

        The bulk form of :meth:`write` for producers that batch: one call, one timestamp (default
        now), no headers, and about half the per-record cost. The same validation applies; if a
        record is invalid, none of this call's records are added.
        """
        if self._state:
            self._writable()
        try:
            nsb = _encode_namespace(namespace) if namespace else b""
        except UnicodeEncodeError as exc:
            raise InvalidJournalRecord("namespace", f"not encodable as UTF-8: {exc.reason}") from None
        if timestamp is None:
            ts = _time_ns() // 1000 if self._system_clock else self._clock()
        else:
            ts = to_timestamp_us(timestamp, self._clock)
        if not isinstance(records, list | tuple):
            records = list(records)
        n = len(records)
        keys: list[bytes] = []
        values: list[bytes | None] = []
        nulls = False
        # Well-formed bulk input (pairs of str and bytes/None) is checked a column at a time;
        # any other input takes the loop below, which converts or rejects record by record.
        if n >= _BULK_MIN:
            try:
                key_col, value_col = zip(*records, strict=True)
            except (ValueError, TypeError):  # not all pairs: the loop below says which is wrong
                key_col = value_col = ()
            value_types = set(map(type, value_col))
            if key_col and set(map(type, key_col)) <= {str} and value_types <= {bytes, NoneType}:
                try:
                    keys = list(map(str.encode, key_col))
                except UnicodeEncodeError as exc:
                    raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
                values = list(value_col)
                nulls = NoneType in value_types
        if len(keys) != n:
            append_key, append_value = keys.append, values.append
            for key, value in records:
                if type(key) is not str:
                    raise InvalidJournalRecord("key", f"must be str, got {type(key).__name__}")
                try:
                    append_key(key.encode())
                except UnicodeEncodeError as exc:
                    raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
                if value is None:
                    nulls = True
                elif type(value) is not bytes:
                    value = _as_bytes(value)
                append_value(value)
        self._keys.extend(keys)
        self._values.extend(values)
        self._namespaces.extend(repeat(nsb, n))
        self._headers.extend(repeat(b"", n))
        self._timestamps.extend(repeat(ts, n))
        self._nulls = self._nulls or nulls
        return n

    def write_arrow(self, table: pa.Table | pa.RecordBatch) -> int:
        """Add every row of an Arrow table or record batch; returns how many.

        The bulk form for records that already live in Arrow — the write-side twin of
        :meth:`Journal.read_arrow`: columns ``key`` (string) and ``value`` (binary or string;
        null is a tombstone), optionally ``namespace``, ``headers`` (a list of
        ``struct<key, value>``) and ``timestamp`` (with a time zone, or int64 µs; null is now).
        Other columns are ignored. If a record is invalid, none of the table's are added.

        >>> with journal.append() as tx:                                # doctest: +SKIP
        ...     for batch in other_journal.read_arrow(0, 1000):
        ...         tx.write_arrow(batch)
        """
        if self._state and self._state != _ARROW:
            self._not_open()
        from sluiceway.journal.columns import arrow_piece

        now = _time_ns() // 1000 if self._system_clock else self._clock()
        piece = arrow_piece(table, now)
        if piece.n:
            self._arrow.append(piece)
            self._nulls = self._nulls or piece.nulls is not None
            self._state = _ARROW
        return piece.n

    def _unpack_arrow(self) -> None:
        """Turn the column pieces into per-record lists (a write() joins a write_arrow append)."""
        for piece in self._arrow:
            self._keys.extend(_split(piece.key_data, piece.key_lens))
            values: list[bytes | None] = list(_split(piece.value_data, piece.value_lens))
            if piece.nulls is not None:
                values = [None if null else v for v, null in zip(values, piece.nulls.tolist(), strict=True)]
            self._values.extend(values)
            if piece.namespace is not None:
                self._namespaces.extend(repeat(piece.namespace, piece.n))
            else:
                assert piece.namespace_lens is not None
                self._namespaces.extend(_split(piece.namespace_data, piece.namespace_lens))
            self._headers.extend(_split(piece.header_data, piece.header_lens))
            self._timestamps.extend(piece.timestamps.tolist())
        self._arrow = []
        if self._state == _ARROW:
            self._state = _OPEN

    def _writable(self) -> None:
        """Off the fast path: pieces to turn into lists first, or the append is not open."""
        if self._state != _ARROW:
            self._not_open()
        self._unpack_arrow()

    def _not_open(self) -> None:
        if self._state == _ABORTED:
            raise AppendAborted("the append was aborted")
        raise JournalError("the append has already been committed or failed")

    @property
    def count(self) -> int:
        """Records written so far (committed, once the append has committed)."""
        if self._offsets is not None:
            return len(self._offsets)
        return len(self._keys) + sum(piece.n for piece in self._arrow)

    def abort(self) -> None:
        """Discard the append. Leaving the ``with`` block afterwards commits nothing."""
        if self._state in (_OPEN, _ARROW):
            self._state = _ABORTED
            self._clear()

    def _clear(self) -> None:
        self._keys, self._values, self._namespaces, self._headers, self._timestamps = [], [], [], [], []
        self._arrow = []

    def _encode(self) -> EncodedRecords:
        """The append's records block, as it will be written (``InvalidJournalRecord`` if too large)."""
        if self._arrow and (self._keys or sum(piece.n for piece in self._arrow) <= _BULK_MIN):
            # Records written one by one came before some of the pieces (they stay in order as
            # lists), or only a few records: the list encoders are quicker.
            self._unpack_arrow()
        try:
            if self._arrow:
                records = encode_pieces(self._arrow)
            else:
                records = encode_records(
                    self._keys,
                    self._values,
                    self._namespaces,
                    self._headers,
                    self._timestamps,
                    has_null=self._nulls,
                )
        except ValueError as exc:
            raise InvalidJournalRecord("append", str(exc)) from None
        sets = self._expectations.set_registers
        if (sets or records.size > _MAX_RECORDS_BYTES) and frame_length(records, sets) > MAX_FRAME_BYTES:
            raise InvalidJournalRecord("append", "larger than 4 GiB on disk")
        return records

    def commit(self) -> range:
        """Commit now (the ``with`` block does this on exit) and return the assigned offsets."""
        if self._state and self._state != _ARROW:
            self._not_open()
        self._state = _COMMITTING
        try:
            # Encoded here, in the appending thread, before joining a commit group: the group
            # leader's serialised work stays a header per append.
            self._offsets = self._writer.commit(self._encode(), self._expectations)
        except BaseException:
            # Interrupted while queued, the records may still be written: the writer holds its
            # own reference to them, and the failure says nothing about whether they were.
            self._state = _FAILED
            raise
        self._state = _COMMITTED
        self._clear()  # the group is done with the records; free the memory early
        return self._offsets

    @property
    def offsets(self) -> range:
        """The offsets the committed append was given (an empty range if it wrote no records)."""
        if self._state == _COMMITTED and self._offsets is not None:
            return self._offsets
        if self._state == _ABORTED:
            raise AppendAborted("the append was aborted")
        raise JournalError("the append has not committed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state in (_OPEN, _ARROW):
            self.commit()


def _split(data: bytes, lens: np.ndarray) -> list[bytes]:
    """``data`` cut into pieces of the given lengths."""
    ends = np.cumsum(lens).tolist()
    starts = [0, *ends[:-1]]
    return [data[lo:hi] for lo, hi in zip(starts, ends, strict=True)]
