"""Vectorised decode of journal batches into Arrow record batches (the bulk read path).

This module finds where every record's fields lie for many commits at once, without a Python
loop per record, in either batch format (a read buffer may hold both):

* format 2 (BATCH frames, columnar): the trailers of all the batches are gathered as 64-bit
  words and read as one record array; each per-record column is then one unaligned 64-bit
  load per record, masked to its batch's width, and a field's starts are a cumulative sum of
  its lengths;
* format 1 (RECORD frames): record boundaries come from the BEGIN length indexes (a
  cumulative sum), and the fixed 40-byte headers are gathered as one ``(n, 5)`` matrix of
  64-bit words viewed through a structured dtype.

Then the columns are built from those positions, the same way for both:

* short fields (namespace, key, header strings) are gathered into contiguous Arrow buffers
  with one fancy-indexing copy;
* long fields (values) are described as Arrow *binary views* — ``(length, prefix, buffer,
  offset)`` into the read buffer — and Arrow's C++ cast turns them into a plain ``binary``
  column with one memcpy per value.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby, pairwise
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from sluiceway.journal.format import (
    DELTA_WIDTHS,
    FLAG_NULL_VALUE,
    KIND_BATCH,
    KIND_RECORD,
    LENGTH_WIDTHS,
    NAMESPACE_WIDTHS,
    REC_HEADER_SIZE,
    RECORDS_NULLS,
    RECORDS_TRAILER,
    TRAILER_SIZE,
)
from sluiceway.journal.parse import ParsedBatch, RecordProblem
from sluiceway.journal.record import ARROW_SCHEMA

REC_DTYPE = np.dtype(
    [
        ("len", "<u4"),
        ("crc", "<u4"),
        ("offset", "<i8"),
        ("ts", "<i8"),
        ("kind", "u1"),
        ("flags", "u1"),
        ("nsl", "<u2"),
        ("kl", "<u4"),
        ("vl", "<u4"),
        ("hl", "<u4"),
    ]
)
assert REC_DTYPE.itemsize == REC_HEADER_SIZE
_TRAILER = np.dtype(
    [
        ("count", "<u4"),
        ("kw", "u1"),
        ("vw", "u1"),
        ("nw", "u1"),
        ("hw", "u1"),
        ("base_ts", "<i8"),
        ("tw", "u1"),
        ("ow", "u1"),
        ("flags", "u1"),
        ("r0", "u1"),
        ("keys", "<u4"),
        ("values", "<u4"),
        ("namespaces", "<u4"),
        ("headers", "<u4"),
        ("r1", "<u4"),
    ]
)
assert _TRAILER.itemsize == RECORDS_TRAILER.size
_WIDTH_MASK = np.array([(1 << (8 * w)) - 1 for w in range(9)], dtype=np.uint64)  # the low w bytes

_GATHER_MAX_MEAN = 8  # mean field length (bytes) up to which a byte gather beats binary views
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
_STRUCT_TYPE = _HEADERS_TYPE.value_type
_OP = b"insert"


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None:
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _gather(
    u8: np.ndarray, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType, valid: np.ndarray | None
) -> pa.Array:
    """Copy ``u8[starts[i] : starts[i]+lens[i]]`` for every i into one contiguous Arrow column."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        src = np.repeat(starts - offsets[:-1], lens)
        src += np.arange(total, dtype=np.int64)
        data = pa.py_buffer(u8[src])
    else:
        data = pa.py_buffer(b"")
    return pa.Array.from_buffers(typ, n, [_validity(valid), pa.py_buffer(offsets), data])


class _Source:
    """One read buffer seen three ways: bytes, and unaligned 64/32-bit words at every byte position.

    The overlapping word views (stride 1 byte) let us load the first bytes of many variable-length
    fields with one 1-D fancy index each, instead of building an index matrix per byte.
    """

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.size = len(buf)
        self.u8 = np.frombuffer(buf, dtype=np.uint8)
        self.data = pa.py_buffer(buf)
        self.w64 = np.ndarray((max(self.size - 7, 0),), dtype="<u8", buffer=buf, strides=(1,))
        self.w32 = np.ndarray((max(self.size - 3, 0),), dtype="<u4", buffer=buf, strides=(1,))


# Masks keeping the first k (0..12) bytes of a view's inline data: 8 in the low word, 4 in the high.
_MASK_LO = np.array([(1 << (8 * min(k, 8))) - 1 for k in range(13)], dtype=np.uint64)
_MASK_HI = np.array([(1 << (8 * min(max(k - 8, 0), 4))) - 1 for k in range(13)], dtype=np.uint32)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _views(
    src: _Source, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType, valid: np.ndarray | None
) -> pa.Array:
    """Describe the spans as Arrow binary/string views over the buffer, then cast to ``typ``.

    A view is 16 bytes: ``i32 length`` then, for ≤ 12 bytes, the data inline (zero padded), else
    a 4-byte prefix, ``i32 buffer index`` and ``i32 offset``. Arrow's cast then copies each value
    into a contiguous ``binary``/``string`` column in C++.
    """
    n = len(starts)
    views = np.empty((n, 4), dtype="<u4")
    views[:, 0] = lens
    inline = np.minimum(lens, 12)
    lo = src.w64[starts] & _MASK_LO[inline]
    views[:, 1] = lo & _LOW32
    views[:, 2] = lo >> _SHIFT32
    views[:, 3] = src.w32[starts + 8] & _MASK_HI[inline]
    long_ = lens > 12
    if long_.any():
        views[long_, 2] = 0  # buffer index: the one data buffer
        views[long_, 3] = starts[long_]
    view_type = pa.string_view() if typ == pa.string() else pa.binary_view()
    arr = pa.Array.from_buffers(view_type, n, [_validity(valid), pa.py_buffer(views), src.data])
    return arr.cast(typ)


def _column(
    src: _Source, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType, valid: np.ndarray | None = None
) -> pa.Array:
    n = len(starts)
    if n == 0:
        return pa.array([], typ)
    total = int(lens.sum())
    # Views need 12 readable bytes from each start and offsets that fit an i32; what follows
    # every field (a BATCH frame's 40-byte trailer; in format 1, the COMMIT frame) guarantees
    # the first, chunk sizes the second.
    if total > _GATHER_MAX_MEAN * n and int(starts.max()) + 12 <= src.size and src.size < 1 << 31:
        return _views(src, starts, lens, typ, valid)
    return _gather(src.u8, starts, lens, typ, valid)


def _headers(src: _Source, hstart: np.ndarray, hlen: np.ndarray) -> pa.Array:
    """Decode every record's headers block into ``list<struct<key, value>>``."""
    n = len(hstart)
    counts = np.zeros(n, dtype=np.int64)
    has = hlen > 0
    if has.any():
        if int(hlen[has].min()) < 4:
            raise RecordProblem(int(hstart[has][np.argmin(hlen[has])]), None, "headers block is truncated")
        counts[has] = src.w32[hstart[has]]
        # Checked before the count sizes anything: a damaged u32 would index past the buffer,
        # or ask np.repeat for billions of rows.
        over = has & (4 + 8 * counts > hlen)
        if over.any():
            raise RecordProblem(int(hstart[np.argmax(over)]), None, "headers block count overruns the block")
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    total = int(list_offsets[-1])
    if total == 0:
        empty = pa.StructArray.from_arrays(
            [pa.array([], pa.string()), pa.array([], pa.string())], fields=list(_STRUCT_TYPE)
        )
        return pa.ListArray.from_arrays(pa.array(list_offsets), empty, type=_HEADERS_TYPE)
    row = np.repeat(np.arange(n, dtype=np.int64), counts)
    k = np.arange(total, dtype=np.int64) - np.repeat(list_offsets[:-1].astype(np.int64), counts)
    lens_pos = hstart[row] + 4 + 8 * k
    klen = src.w32[lens_pos].astype(np.int64)
    vlen = src.w32[lens_pos + 4].astype(np.int64)
    # Each row's strings follow its length table, k0 v0 k1 v1 …: start of pair k = data start of
    # the row + the sizes of the pairs before it in the same row (a cumulative sum, reset per row).
    pair = klen + vlen
    csum = np.cumsum(pair) - pair
    row_first = np.repeat(list_offsets[:-1].astype(np.int64), counts)
    within = csum - csum[row_first]
    kstart = hstart[row] + 4 + 8 * counts[row] + within
    if int((kstart + pair - hstart[row] - hlen[row]).max()) > 0:
        raise RecordProblem(int(hstart[row][0]), None, "headers block overruns its record")
    keys = _column(src, kstart, klen, pa.string())
    values = _column(src, kstart + klen, vlen, pa.string())
    structs = pa.StructArray.from_arrays([keys, values], fields=list(_STRUCT_TYPE))
    return pa.ListArray.from_arrays(pa.array(list_offsets), structs, type=_HEADERS_TYPE)


def _op_column(n: int) -> pa.Array:
    offsets = np.arange(n + 1, dtype=np.int32) * len(_OP)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(_OP * n)])


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


class _Fields(NamedTuple):
    """Where every record's fields lie in the buffer, one array per field, one entry per record."""

    offsets: np.ndarray
    timestamps: np.ndarray
    null: np.ndarray
    ns_start: np.ndarray
    ns_len: np.ndarray
    key_start: np.ndarray
    key_len: np.ndarray
    val_start: np.ndarray
    val_len: np.ndarray
    hdr_start: np.ndarray
    hdr_len: np.ndarray


def _record_frames(buf: bytes, batches: Sequence[ParsedBatch]) -> _Fields:
    """Format 1: the fields of every RECORD frame, from the batches' length indexes."""
    counts = np.fromiter((b.count for b in batches), dtype=np.int64, count=len(batches))
    lens = np.concatenate([b.lens(buf) for b in batches]).astype(np.int64)
    n = len(lens)
    # Frame start = the batch's records position + the sizes of the earlier frames in that batch.
    excl = np.cumsum(lens) - lens
    batch_first_rec = np.cumsum(counts) - counts
    rec_pos = np.fromiter((b.records_pos for b in batches), dtype=np.int64, count=len(batches))
    starts = excl + np.repeat(rec_pos - excl[np.minimum(batch_first_rec, n - 1)], counts)
    if (starts & 7).any():
        i = int(np.argmax((starts & 7) != 0))
        raise RecordProblem(int(starts[i]), None, "record frame is not 8-byte aligned")
    # Frames are 8-byte aligned: gather each fixed header as five 64-bit words, then reinterpret
    # the (n, 5) words as n packed 40-byte headers.
    words = np.frombuffer(buf, dtype="<u8", count=len(buf) // 8)
    hdr = words[(starts >> 3)[:, None] + np.arange(REC_HEADER_SIZE // 8, dtype=np.int64)]
    h = hdr.view(REC_DTYPE).reshape(n)
    offsets = h["offset"]
    nsl = h["nsl"].astype(np.int64)
    kl = h["kl"].astype(np.int64)
    vl = h["vl"].astype(np.int64)
    hl = h["hl"].astype(np.int64)

    # Structure checks, vectorised: the checksum already matched, so a failure here is a bug.
    used = REC_HEADER_SIZE + nsl + kl + vl + hl
    bad = (h["kind"] != KIND_RECORD) | (h["len"] != lens) | (((used + 7) & ~7) != lens)
    firsts = np.repeat(np.fromiter((b.first for b in batches), dtype=np.int64, count=len(batches)), counts)
    ends = np.repeat(np.fromiter((b.end for b in batches), dtype=np.int64, count=len(batches)), counts)
    bad |= (offsets < firsts) | (offsets >= ends)
    if n > 1:
        bad[1:] |= offsets[1:] <= offsets[:-1]
    if bad.any():
        i = int(np.argmax(bad))
        raise RecordProblem(int(starts[i]), int(offsets[i]), "malformed or out-of-sequence record frame")
    ns_start = starts + REC_HEADER_SIZE
    key_start = ns_start + nsl
    val_start = key_start + kl
    return _Fields(
        offsets=offsets,
        timestamps=h["ts"],
        null=(h["flags"] & FLAG_NULL_VALUE) != 0,
        ns_start=ns_start,
        ns_len=nsl,
        key_start=key_start,
        key_len=kl,
        val_start=val_start,
        val_len=vl,
        hdr_start=val_start + vl,
        hdr_len=hl,
    )


class _Columns:
    """Format 2: reads the per-record columns of many BATCH frames at once.

    Each batch has its own widths, so a column is read as one unaligned 64-bit load per record
    at ``column start + width * i``, masked down to ``width`` bytes (the trailer after every
    column guarantees the 8 readable bytes).
    """

    def __init__(self, src: _Source, counts: np.ndarray, first_rec: np.ndarray) -> None:
        self.src = src
        self.counts = counts
        self.first_rec = first_rec
        n = int(counts.sum())
        self.index = np.arange(n, dtype=np.int64) - np.repeat(first_rec, counts)  # i within its batch

    def per_record(self, per_batch: np.ndarray) -> np.ndarray:
        return np.repeat(per_batch, self.counts)

    def read(self, start: np.ndarray, width: np.ndarray) -> np.ndarray:
        """Column values (uint64) of every record; zeros where the batch's width is 0."""
        if not width.any():
            return np.zeros(len(self.index), dtype=np.uint64)
        w = self.per_record(width.astype(np.int64))
        values: np.ndarray = self.src.w64[self.per_record(start) + w * self.index] & _WIDTH_MASK[w]
        return values

    def spans(self, lens: np.ndarray, field_start: np.ndarray, field_size: np.ndarray) -> np.ndarray:
        """Start of each record's field: the batch's field start + the lengths before it.

        Raises :class:`RecordProblem` unless each batch's lengths add up to its field size.
        """
        csum = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=csum[1:])
        before = csum[self.first_rec]
        if (csum[self.first_rec + self.counts] - before != field_size).any():
            raise RecordProblem(int(field_start[0]), None, "record lengths do not add up")
        starts: np.ndarray = csum[:-1] + self.per_record(field_start - before)
        return starts


def _batch_frames(buf: bytes, src: _Source, batches: Sequence[ParsedBatch]) -> _Fields:
    """Format 2: the fields of every record of many BATCH frames, without a loop per record."""
    nb = len(batches)
    counts = np.fromiter((b.count for b in batches), dtype=np.int64, count=nb)
    records_pos = np.fromiter((b.records_pos for b in batches), dtype=np.int64, count=nb)
    trailer_pos = np.fromiter((b.records_end for b in batches), dtype=np.int64, count=nb) - TRAILER_SIZE
    if (trailer_pos & 7).any():
        i = int(np.argmax((trailer_pos & 7) != 0))
        raise RecordProblem(int(records_pos[i]), None, "records trailer is not 8-byte aligned")
    # The trailers are 8-byte aligned: gather them as 64-bit words, read them as a record array.
    words = np.frombuffer(buf, dtype="<u8", count=len(buf) // 8)
    t = words[(trailer_pos >> 3)[:, None] + np.arange(TRAILER_SIZE // 8, dtype=np.int64)].view(_TRAILER)
    t = t.reshape(nb)
    widths = [t[name].astype(np.int64) for name in ("kw", "vw", "nw", "hw", "tw", "ow")]
    has_nulls = t["flags"] == RECORDS_NULLS
    col = [records_pos]
    for w in widths:
        col.append(col[-1] + counts * w)
    sizes = [t[name].astype(np.int64) for name in ("keys", "values", "namespaces", "headers")]
    field = [col[-1] + np.where(has_nulls, (counts + 7) >> 3, 0)]
    for size in sizes:
        field.append(field[-1] + size)
    pad = trailer_pos - field[-1]
    bad = (t["count"] != counts) | (pad < 0) | (pad >= 8) | (t["r0"] != 0) | (t["r1"] != 0)
    bad |= ~np.isin(t["flags"], (0, RECORDS_NULLS)) | ~np.isin(t["nw"], NAMESPACE_WIDTHS)
    for w in (widths[0], widths[1], widths[3]):
        bad |= ~np.isin(w, LENGTH_WIDTHS)
    bad |= ~np.isin(widths[4], DELTA_WIDTHS) | ~np.isin(widths[5], DELTA_WIDTHS)
    if bad.any():
        i = int(np.argmax(bad))
        raise RecordProblem(int(records_pos[i]), None, "malformed records trailer or block")

    cols = _Columns(src, counts, np.cumsum(counts) - counts)
    kl = cols.read(col[0], widths[0]).astype(np.int64)
    vl = cols.read(col[1], widths[1]).astype(np.int64)
    per_ns = cols.read(col[2], widths[2]).astype(np.int64)
    hl = cols.read(col[3], widths[3]).astype(np.int64)
    key_start = cols.spans(kl, field[0], sizes[0])
    val_start = cols.spans(vl, field[1], sizes[1])
    hdr_start = cols.spans(hl, field[3], sizes[3])
    shared_ns = widths[2] == 0
    ns_start = cols.spans(per_ns, field[2], np.where(shared_ns, 0, sizes[2]))
    ns_len = np.where(cols.per_record(shared_ns), cols.per_record(sizes[2]), per_ns)

    base_ts = cols.per_record(t["base_ts"])
    timestamps = (base_ts.view(np.uint64) + cols.read(col[4], widths[4])).view(np.int64)
    firsts = cols.per_record(np.fromiter((b.first for b in batches), dtype=np.int64, count=nb))
    ends = cols.per_record(np.fromiter((b.end for b in batches), dtype=np.int64, count=nb))
    deltas = cols.read(col[5], widths[5]).astype(np.int64)
    offsets = firsts + np.where(cols.per_record(widths[5]) > 0, deltas, cols.index)
    bad_rec = (offsets < firsts) | (offsets >= ends)
    bad_rec[1:] |= offsets[1:] <= offsets[:-1]
    if bad_rec.any():
        i = int(np.argmax(bad_rec))
        pos = int(cols.per_record(records_pos)[i])
        raise RecordProblem(pos, int(offsets[i]), "record offset out of sequence")
    null = np.zeros(len(offsets), dtype=bool)
    if has_nulls.any():
        rec_has = cols.per_record(has_nulls)
        byte = np.where(rec_has, cols.per_record(col[6]) + (cols.index >> 3), 0)
        null = rec_has & (((src.u8[byte] >> (cols.index & 7)) & 1) != 0)
    return _Fields(
        offsets=offsets,
        timestamps=timestamps,
        null=null,
        ns_start=ns_start,
        ns_len=ns_len,
        key_start=key_start,
        key_len=kl,
        val_start=val_start,
        val_len=vl,
        hdr_start=hdr_start,
        hdr_len=hl,
    )


def decode_arrow(buf: bytes, batches: Sequence[ParsedBatch], lo: int, hi: int) -> pa.RecordBatch:
    """Decode the records with offsets in ``[lo, hi)`` of ``batches`` (all located in ``buf``).

    The batches must already be verified (``records_ok``); they may be of either format, in any
    mix. Structural inconsistencies raise :class:`RecordProblem` with the buffer position of
    the first bad frame.
    """
    batches = [b for b in batches if b.count]
    if not batches:
        return empty_batch()
    src = _Source(buf)
    runs = [
        _batch_frames(buf, src, run) if kind == KIND_BATCH else _record_frames(buf, run)
        for kind, run in ((k, list(g)) for k, g in groupby(batches, key=attrgetter("kind")))
    ]
    for before, after in pairwise(runs):  # each run checked its own order; now where they meet
        if after.offsets[0] <= before.offsets[-1]:
            raise RecordProblem(
                int(after.ns_start[0]), int(after.offsets[0]), "record offsets out of sequence"
            )
    f = runs[0] if len(runs) == 1 else _Fields(*map(np.concatenate, zip(*runs, strict=True)))
    n = len(f.offsets)
    keep = (f.offsets >= lo) & (f.offsets < hi)
    if not keep.all():
        sel = np.flatnonzero(keep)
        f = _Fields(*(a[sel] for a in f))
        n = len(sel)
        if n == 0:
            return empty_batch()
    valid = ~f.null if f.null.any() else None
    vlens = np.where(f.null, 0, f.val_len) if valid is not None else f.val_len
    columns = [
        pa.array(np.ascontiguousarray(f.offsets), type=pa.int64()),
        _column(src, f.ns_start, f.ns_len, pa.string()),
        _op_column(n),
        _column(src, f.key_start, f.key_len, pa.string()),
        _column(src, f.val_start, vlens, pa.binary(), valid),
        _headers(src, f.hdr_start, f.hdr_len),
        pa.array(np.ascontiguousarray(f.timestamps), type=pa.int64()).cast(
            ARROW_SCHEMA.field("timestamp").type
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
