"""Encoding batches (format 2): the write path.

Everything here produces exactly the bytes :mod:`sluiceway.journal.format` describes. The work
is split by who does it:

* :func:`encode_records` builds and checksums an append's records block. The appending thread
  calls it when its append commits, *before* joining a commit group, so the serialised part of
  a commit (the group leader's) never touches the records. Its cost is per column, not per
  record: a column's lengths are one ``numpy`` conversion, its bytes one ``join``, and the
  whole block gets one CRC32C — where format 1 spent about a fifth of an append's time on a
  CRC32C per record.
* :func:`encode_batch_header` is what the group leader adds once offsets are assigned: 56 bytes
  with the offsets, the commit time and the register updates, checksummed.

Small appends take a pure-Python twin of the column encoder (numpy's fixed cost per call
would dominate a few records), one record a shorter one still;
``tests/unit/journal/test_format.py`` checks that all produce the same bytes.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
from google_crc32c import extend as _crc32c_extend
from google_crc32c import value as _crc32c

from sluiceway.journal.format import (
    BATCH_HEADER_SIZE,
    DELTA_WIDTHS,
    FRAME_PREFIX,
    KIND_BATCH,
    LENGTH_WIDTHS,
    MAX_FRAME_BYTES,
    NAMESPACE_WIDTHS,
    RECORDS_NULLS,
    RECORDS_TRAILER,
    ZEROS,
    encode_pairs,
    pad8,
)

_pack_frame_prefix = FRAME_PREFIX.pack
_pack_batch_rest = struct.Struct("<BBHIqqqIIII").pack  # the BATCH header after (length, crc)
_pack_trailer = RECORDS_TRAILER.pack
_UINT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_UINT_DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}
_U64 = (1 << 64) - 1
_SMALL = 16  # appends of up to this many records take the pure-Python encoder


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """An append's records block: its pieces (written as they are, with one vectored write),
    the number of records, its size in bytes (a multiple of 8) and its CRC32C."""

    parts: list[bytes]
    count: int
    size: int
    crc: int


def _width(top: int, widths: tuple[int, ...], what: str) -> int:
    """The fewest bytes (among ``widths``) that hold ``top``; 0 when ``top`` is 0."""
    for width in widths:
        if top < 1 << (8 * width):
            return width
    raise ValueError(f"{what} too large for the journal format")


def _uints_small(values: Sequence[int], widths: tuple[int, ...], what: str) -> tuple[int, bytes]:
    width = _width(max(values), widths, what)
    return width, struct.pack(f"<{len(values)}{_UINT_CODES[width]}", *values) if width else b""


def _uints_bulk(values: np.ndarray, widths: tuple[int, ...], what: str) -> tuple[int, bytes]:
    width = _width(int(values.max()), widths, what)
    return width, values.astype(_UINT_DTYPES[width]).tobytes() if width else b""


def encode_records(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    namespaces: Sequence[bytes],
    headers: Sequence[bytes],
    timestamps: Sequence[int],
    *,
    offsets: Sequence[int] | None = None,
    has_null: bool = True,
) -> EncodedRecords:
    """The records block of an append: one entry per record in each sequence.

    ``headers`` are encoded pairs blocks (``b""``: none); ``offsets`` are deltas from the
    batch's first offset, given only by compaction (``None``: contiguous). ``has_null=False``
    promises that no value is ``None``. ``ValueError`` if a field is too large for the format.
    """
    n = len(keys)
    if n == 1 and offsets is None:
        return _encode_one(keys[0], values[0], namespaces[0], headers[0], timestamps[0])
    if n == 0:
        return EMPTY_RECORDS
    if n <= _SMALL:
        cols = _columns_small(keys, values, namespaces, headers, timestamps, offsets)
        block = b"".join(_block(n, b"".join(keys), cols))
        return EncodedRecords([block], n, len(block), _crc32c(block))
    # Big appends stay in pieces (the values alone are most of the bytes): one CRC over them
    # all, and the vectored write takes them as they are.
    cols = _columns_bulk(keys, values, namespaces, headers, timestamps, offsets, has_null)
    return _checksummed(_block(n, b"".join(keys), cols), n)


def _checksummed(parts: list[bytes], n: int) -> EncodedRecords:
    crc = 0
    for part in parts:
        crc = _crc32c_extend(crc, part)
    return EncodedRecords(parts, n, sum(map(len, parts)), int(crc))


class ColumnPiece(NamedTuple):
    """Records already in columns (from Arrow, :mod:`sluiceway.journal.columns`): each field's
    lengths as an int64 array and its bytes back to back."""

    n: int
    key_lens: np.ndarray
    key_data: bytes
    value_lens: np.ndarray  # 0 for a null value
    value_data: bytes
    nulls: np.ndarray | None  # bool per record: the value is null (None: no null)
    namespace: bytes | None  # the namespace every record shares, or None: see the next two
    namespace_lens: np.ndarray | None
    namespace_data: bytes
    header_lens: np.ndarray
    header_data: bytes
    timestamps: np.ndarray  # int64 µs


def encode_pieces(pieces: Sequence[ColumnPiece]) -> EncodedRecords:
    """The records block of an append made of column pieces — byte for byte what
    :func:`encode_records` makes of the same records, with no Python object per record."""
    n = sum(p.n for p in pieces)
    if n <= _SMALL:
        raise ValueError("encode_pieces is for bulk appends")  # the caller takes encode_records
    kw, kcol = _uints_bulk(np.concatenate([p.key_lens for p in pieces]), LENGTH_WIDTHS, "key")
    vw, vcol = _uints_bulk(np.concatenate([p.value_lens for p in pieces]), LENGTH_WIDTHS, "value")
    nulls = b""
    if any(p.nulls is not None for p in pieces):
        null = np.concatenate([np.zeros(p.n, dtype=bool) if p.nulls is None else p.nulls for p in pieces])
        if null.any():
            nulls = np.packbits(null, bitorder="little").tobytes()
    shared = {p.namespace for p in pieces}
    if len(shared) == 1 and None not in shared:
        nw, ncol, ns_data = 0, b"", pieces[0].namespace or b""
    else:
        lens = np.concatenate([_namespace_lens(p) for p in pieces])
        nw, ncol = _uints_bulk(lens, NAMESPACE_WIDTHS, "namespace")
        ns_data = b"".join(p.namespace * p.n if p.namespace is not None else p.namespace_data for p in pieces)
    header_lens = np.concatenate([p.header_lens for p in pieces])
    if not header_lens.any():
        hw, hcol, hdr_data = 0, b"", b""
    else:
        hw, hcol = _uints_bulk(header_lens, LENGTH_WIDTHS, "headers")
        hdr_data = b"".join(p.header_data for p in pieces)
    ts = np.concatenate([p.timestamps for p in pieces]).astype(np.int64)
    first = int(ts[0])
    if (ts == first).all():
        base, tw, tcol = first, 0, b""
    else:
        base = int(ts.min())
        tw, tcol = _uints_bulk(ts.view(np.uint64) - np.uint64(base & _U64), DELTA_WIDTHS, "timestamp")
    columns = b"".join((kcol, vcol, ncol, hcol, tcol, nulls))
    values = [p.value_data for p in pieces]
    cols = _Columns((kw, vw, nw, hw, tw, 0), base, columns, nulls != b"", values, ns_data, hdr_data)
    return _checksummed(_block(n, b"".join(p.key_data for p in pieces), cols), n)


def _namespace_lens(piece: ColumnPiece) -> np.ndarray:
    if piece.namespace is not None:
        return np.full(piece.n, len(piece.namespace), dtype=np.int64)
    assert piece.namespace_lens is not None
    return piece.namespace_lens


class _Columns(NamedTuple):
    """An append's per-record columns, encoded, and the fields that follow them."""

    widths: tuple[int, int, int, int, int, int]  # see the format: key ... offset-delta widths
    base_ts: int
    columns: bytes  # the six columns and the null bitmap, back to back
    has_nulls: bool
    values: Sequence[bytes]  # ``b""`` for a null value
    namespaces: bytes  # the namespace they all share, or every record's
    headers: bytes


def _block(n: int, key_data: bytes, cols: _Columns) -> list[bytes]:
    """The records block's pieces: columns, the fields' bytes, padding and the trailer."""
    fields = (key_data, b"".join(cols.values), cols.namespaces, cols.headers)
    sizes = tuple(map(len, fields))
    if max(sizes) > 0xFFFFFFFF:
        raise ValueError("an append's keys, values, namespaces or headers exceed 4 GiB")
    used = len(cols.columns) + sum(sizes)
    flags = RECORDS_NULLS if cols.has_nulls else 0
    trailer = _pack_trailer(n, *cols.widths[:4], cols.base_ts, *cols.widths[4:], flags, 0, *sizes, 0)
    parts = [part for part in (cols.columns, *fields) if part]
    parts.append(ZEROS[: -used & 7] + trailer)
    return parts


def _length_width(length: int) -> int:
    if length < 0x100:
        return 1 if length else 0
    if length < 0x10000:
        return 2
    if length <= 0xFFFFFFFF:
        return 4
    raise ValueError("a key, value or headers block larger than 4 GiB")


def _encode_one(key: bytes, value: bytes | None, namespace: bytes, headers: bytes, ts: int) -> EncodedRecords:
    """One record (every single-record append, group commit's common case), in a few calls.

    Exactly what :func:`_encode_small` makes of one record: its namespace is the append's
    (width 0), its timestamp the base (width 0).
    """
    if value is None:
        value, nulls, flags = b"", b"\x01", RECORDS_NULLS
    else:
        nulls, flags = b"", 0
    kl, vl, nl, hl = len(key), len(value), len(namespace), len(headers)
    kw, vw, hw = _length_width(kl), _length_width(vl), _length_width(hl)
    used = kw + vw + hw + len(nulls) + kl + vl + nl + hl
    block = b"".join(
        (
            kl.to_bytes(kw, "little"),
            vl.to_bytes(vw, "little"),
            hl.to_bytes(hw, "little"),
            nulls,
            key,
            value,
            namespace,
            headers,
            ZEROS[: -used & 7],
            _pack_trailer(1, kw, vw, 0, hw, ts, 0, 0, flags, 0, kl, vl, nl, hl, 0),
        )
    )
    return EncodedRecords([block], 1, len(block), _crc32c(block))


def _columns_small(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    namespaces: Sequence[bytes],
    headers: Sequence[bytes],
    timestamps: Sequence[int],
    offsets: Sequence[int] | None,
) -> _Columns:
    """The columns of a few records, in plain Python."""
    n = len(keys)
    nulls = b""
    if None in values:
        bitmap = bytearray((n + 7) >> 3)
        for i, value in enumerate(values):
            if value is None:
                bitmap[i >> 3] |= 1 << (i & 7)
        nulls = bytes(bitmap)
        vals: Sequence[bytes] = [b"" if v is None else v for v in values]
    else:
        vals = values  # type: ignore[assignment]
    kw, kcol = _uints_small(list(map(len, keys)), LENGTH_WIDTHS, "key")
    vw, vcol = _uints_small(list(map(len, vals)), LENGTH_WIDTHS, "value")
    first_ns = namespaces[0]
    if namespaces.count(first_ns) == n:
        nw, ncol, ns_data = 0, b"", first_ns
    else:
        nw, ncol = _uints_small(list(map(len, namespaces)), NAMESPACE_WIDTHS, "namespace")
        ns_data = b"".join(namespaces)
    hw, hcol = _uints_small(list(map(len, headers)), LENGTH_WIDTHS, "headers")
    base = min(timestamps)
    tw, tcol = _uints_small([t - base for t in timestamps], DELTA_WIDTHS, "timestamp")
    ow, ocol = _uints_small(offsets, DELTA_WIDTHS, "offset") if offsets is not None else (0, b"")
    columns = b"".join((kcol, vcol, ncol, hcol, tcol, ocol, nulls))
    return _Columns((kw, vw, nw, hw, tw, ow), base, columns, nulls != b"", vals, ns_data, b"".join(headers))


def _columns_bulk(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    namespaces: Sequence[bytes],
    headers: Sequence[bytes],
    timestamps: Sequence[int],
    offsets: Sequence[int] | None,
    has_null: bool,
) -> _Columns:
    """The columns of many records: each is one numpy conversion (``has_null=False``: no None)."""
    n = len(keys)
    nulls = b""
    vals: Sequence[bytes] = values  # type: ignore[assignment]
    if has_null:
        null = np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool, count=n)
        if null.any():
            nulls = np.packbits(null, bitorder="little").tobytes()
            vals = [b"" if v is None else v for v in values]
    kw, kcol = _uints_bulk(np.fromiter(map(len, keys), np.int64, n), LENGTH_WIDTHS, "key")
    vw, vcol = _uints_bulk(np.fromiter(map(len, vals), np.int64, n), LENGTH_WIDTHS, "value")
    # count() compares by identity first: write_many repeats one object, so these are quick.
    first_ns = namespaces[0]
    if namespaces.count(first_ns) == n:
        nw, ncol, ns_data = 0, b"", first_ns
    else:
        lens = np.fromiter(map(len, namespaces), np.int64, n)
        nw, ncol = _uints_bulk(lens, NAMESPACE_WIDTHS, "namespace")
        ns_data = b"".join(namespaces)
    if headers.count(b"") == n:
        hw, hcol, hdr_data = 0, b"", b""
    else:
        hw, hcol = _uints_bulk(np.fromiter(map(len, headers), np.int64, n), LENGTH_WIDTHS, "headers")
        hdr_data = b"".join(headers)
    base = timestamps[0]
    if timestamps.count(base) == n:
        tw, tcol = 0, b""
    else:
        ts = np.fromiter(timestamps, np.int64, n)
        base = int(ts.min())
        # Deltas from the smallest, as unsigned 64-bit: exact even across the whole i64 range.
        deltas = ts.view(np.uint64) - np.uint64(base & _U64)
        tw, tcol = _uints_bulk(deltas, DELTA_WIDTHS, "timestamp")
    ow, ocol = (0, b"")
    if offsets is not None:
        ow, ocol = _uints_bulk(np.asarray(offsets, dtype=np.uint64), DELTA_WIDTHS, "offset")
    columns = b"".join((kcol, vcol, ncol, hcol, tcol, ocol, nulls))
    return _Columns((kw, vw, nw, hw, tw, ow), base, columns, nulls != b"", vals, ns_data, hdr_data)


def _empty_records() -> EncodedRecords:
    block = ZEROS[:0] + _pack_trailer(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return EncodedRecords([block], 0, len(block), _crc32c(block))


EMPTY_RECORDS = _empty_records()
"""The records block of an append without records (one that only updates registers)."""


def frame_length(records: EncodedRecords, registers: Mapping[str, str] | None) -> int:
    """The size of the BATCH frame that ``records`` and these register updates make."""
    regs = pad8(len(encode_pairs(registers))) if registers else 0
    return BATCH_HEADER_SIZE + regs + records.size


def encode_batch_header(
    first: int,
    end: int,
    commit_time_us: int,
    records: EncodedRecords,
    registers: Mapping[str, str] | None = None,
    flags: int = 0,
) -> bytes:
    """The BATCH frame's header and register updates; the records block follows it."""
    count, crc, size = records.count, records.crc, records.size
    if registers:
        regs = encode_pairs(registers)
        rest = b"".join(
            (
                _pack_batch_rest(
                    KIND_BATCH, flags, 0, len(regs), first, end, commit_time_us, count, crc, size, 0
                ),
                regs,
                ZEROS[: -len(regs) & 7],
            )
        )
    else:
        rest = _pack_batch_rest(KIND_BATCH, flags, 0, 0, first, end, commit_time_us, count, crc, size, 0)
    length = len(rest) + 8 + size
    if length > MAX_FRAME_BYTES:
        raise ValueError("an append is larger than 4 GiB on disk")
    return _pack_frame_prefix(length, _crc32c(rest)) + rest


def encode_batch(
    records: EncodedRecords,
    first: int,
    commit_time_us: int,
    registers: Mapping[str, str] | None = None,
    *,
    end: int | None = None,
    flags: int = 0,
) -> list[bytes]:
    """A whole BATCH frame, as the buffers of one vectored write: header, then the records."""
    if end is None:
        end = first + records.count
    return [encode_batch_header(first, end, commit_time_us, records, registers, flags), *records.parts]
