"""The append transaction: validate and encode records as they are written, commit them at once.

Why it is shaped so:

* **Nothing touches the disk before the commit.** Records are encoded and checksummed into
  memory as they are written, so aborting is free, a crashed append leaves at most a torn tail
  (that recovery truncates), and the writer's serialized commit path only stamps offsets and
  frames whole batches (:mod:`sluiceway.journal.writer`).
* **The per-record path is the budget.** :meth:`AppendTransaction.write` runs once per record
  and is most of an append's CPU, so it inlines the reference encoder
  (:func:`sluiceway.journal.encode.append_record`, checked byte for byte by
  ``tests/unit/journal/test_format.py``), keeps exact-type fast paths on the main line and
  sends the odd cases (``str`` or ``bytearray`` values, explicit timestamps) to helpers off
  it. :meth:`~AppendTransaction.write_many` takes a vectorised encoder for bulk input.
* **The transaction knows the writer only as a port** (:class:`Committer`): a clock and one
  ``commit`` verb that takes the encoded frames and the append's expectations and returns the
  offsets, once durable. The writer never sees this class.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import NoneType, TracebackType
from typing import Final, Protocol, Self

from google_crc32c import value as _crc32c

from sluiceway.journal.encode import encode_many, pack_record_body, pack_record_prefix
from sluiceway.journal.errors import AppendAborted, InvalidJournalRecord, JournalError
from sluiceway.journal.format import (
    FLAG_NULL_VALUE,
    KIND_RECORD,
    MAX_FIELD_BYTES,
    MAX_NAMESPACE_BYTES,
    REC_CRC_START,
    REC_HEADER_SIZE,
    ZEROS,
    encode_pairs,
)
from sluiceway.journal.record import EPOCH

Clock = Callable[[], int]
"""Returns the current time in microseconds since the Unix epoch."""


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
    def clock(self) -> Clock: ...

    def commit(self, parts: list[bytes | bytearray], lens: array[int], expectations: Expectations) -> range:
        """Commit the encoded frames (one length per record) and return their offsets, once durable."""
        ...


def to_timestamp_us(timestamp: datetime | int | None, clock: Clock) -> int:
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


_MAX_FRAME = MAX_FIELD_BYTES - 8
_BULK_MIN = 32  # write_many switches to the vectorised encoder from this many records
# Transaction states; OPEN is 0 so the per-record check is a plain truth test.
_OPEN, _COMMITTING, _COMMITTED, _ABORTED, _FAILED = range(5)


class AppendTransaction:
    """One all-or-nothing append. Get one from :meth:`Journal.append`; use it as a context manager.

    Records are encoded and checksummed as they are written and kept in memory; nothing touches
    the disk until the append commits (on leaving the ``with`` block). An exception in the block,
    or :meth:`abort`, discards everything.
    """

    __slots__ = (
        "_clock",
        "_expectations",
        "_lens",
        "_offsets",
        "_parts",
        "_state",
        "_system_clock",
        "_writer",
    )

    def __init__(self, writer: Committer, expectations: Expectations = NO_EXPECTATIONS) -> None:
        self._writer = writer
        self._clock = writer.clock
        self._system_clock = writer.clock is system_clock
        self._expectations = expectations
        # Encoded frames as (prefix, body) pairs from write(), or one bytearray of many frames
        # from write_many(); joined once at commit. One length per record.
        self._parts: list[bytes | bytearray] = []
        self._lens = array("I")
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
            self._not_open()
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
            flags = FLAG_NULL_VALUE
            value = b""
        else:
            flags = 0
            if type(value) is not bytes:
                value = _value_bytes(value)
        hb = _encode_headers(headers) if headers else b""
        if timestamp is None:
            ts = _time_ns() // 1000 if self._system_clock else self._clock()
        else:
            ts = to_timestamp_us(timestamp, self._clock)
        # encode.append_record, inlined: a function call is a tenth of the per-record budget.
        # tests/unit/journal/test_format.py checks that both produce identical frames.
        nl, kl, vl, hl = len(nsb), len(kb), len(value), len(hb)
        used = REC_HEADER_SIZE + nl + kl + vl + hl
        if used > _MAX_FRAME:
            raise InvalidJournalRecord("value", "record larger than 4 GiB")
        body = b"".join(
            (pack_record_body(ts, KIND_RECORD, flags, nl, kl, vl, hl), nsb, kb, value, hb, ZEROS[: -used & 7])
        )
        length = len(body) + REC_CRC_START
        parts = self._parts
        parts.append(pack_record_prefix(length, _crc32c(body), 0))
        parts.append(body)
        self._lens.append(length)

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
            self._not_open()
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
        # Well-formed bulk input (pairs of str and bytes/None) takes the vectorised encoder; any
        # other input takes the loop below, which converts or rejects record by record.
        if len(records) >= _BULK_MIN:
            try:
                keys, values = zip(*records, strict=True)
            except (ValueError, TypeError):  # not all pairs: the loop below says which is wrong
                keys = values = ()
            value_types = set(map(type, values))
            if keys and set(map(type, keys)) <= {str} and value_types <= {bytes, NoneType}:
                try:
                    frames, flens = encode_many(nsb, keys, values, ts, has_null=NoneType in value_types)
                except UnicodeEncodeError as exc:
                    raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
                if int(flens.max()) > _MAX_FRAME:
                    raise InvalidJournalRecord("value", "record larger than 4 GiB")
                # One part holding many frames: the writer joins parts, it does not care how they split.
                self._parts.append(frames)
                self._lens.frombytes(flens.astype("I").tobytes())  # native uint, as array("I")
                return len(flens)
        nl = len(nsb)
        fixed = REC_HEADER_SIZE + nl
        parts: list[bytes] = []
        lens = array("I")
        append_part, append_len = parts.append, lens.append
        pack_body, pack_prefix, crc, zeros = pack_record_body, pack_record_prefix, _crc32c, ZEROS
        for key, value in records:
            if type(key) is not str:
                raise InvalidJournalRecord("key", f"must be str, got {type(key).__name__}")
            try:
                kb = key.encode()
            except UnicodeEncodeError as exc:
                raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
            if value is None:
                flags = FLAG_NULL_VALUE
                value = b""
            else:
                flags = 0
                if type(value) is not bytes:
                    value = _as_bytes(value)
            kl, vl = len(kb), len(value)
            used = fixed + kl + vl
            if used > _MAX_FRAME:
                raise InvalidJournalRecord("value", "record larger than 4 GiB")
            body = b"".join(
                (pack_body(ts, KIND_RECORD, flags, nl, kl, vl, 0), nsb, kb, value, zeros[: -used & 7])
            )
            length = len(body) + REC_CRC_START
            append_part(pack_prefix(length, crc(body), 0))
            append_part(body)
            append_len(length)
        self._parts.extend(parts)
        self._lens.extend(lens)
        return len(lens)

    def _not_open(self) -> None:
        if self._state == _ABORTED:
            raise AppendAborted("the append was aborted")
        raise JournalError("the append has already been committed or failed")

    @property
    def count(self) -> int:
        """Records written so far."""
        return len(self._lens)

    def abort(self) -> None:
        """Discard the append. Leaving the ``with`` block afterwards commits nothing."""
        if self._state == _OPEN:
            self._state = _ABORTED
            self._parts = []
            self._lens = array("I")

    def commit(self) -> range:
        """Commit now (the ``with`` block does this on exit) and return the assigned offsets."""
        if self._state:
            self._not_open()
        self._state = _COMMITTING
        try:
            self._offsets = self._writer.commit(self._parts, self._lens, self._expectations)
        except BaseException:
            # Interrupted while queued, the frames may still be written: the writer holds its own
            # reference to them, and the failure says nothing about whether they were.
            self._state = _FAILED
            raise
        self._state = _COMMITTED
        self._parts = []  # the group is done with them; free the memory early
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
        elif self._state == _OPEN:
            self.commit()
