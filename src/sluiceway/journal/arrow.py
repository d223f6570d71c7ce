"""Vectorised decode of journal batches into Arrow record batches (the bulk read path).

The per-record frames stay on disk exactly as the iterator reads them; this module finds the
frames of many commits at once from their BEGIN length indexes (a cumulative sum), gathers
the fixed headers as one ``(n, 40)`` byte matrix viewed through a structured dtype, and
builds the variable-length columns without a Python loop per record:

* short fields (namespace, key, header strings) are gathered into contiguous Arrow buffers
  with one fancy-indexing copy;
* long fields (values) are described as Arrow *binary views* — ``(length, prefix, buffer,
  offset)`` into the read buffer — and Arrow's C++ cast turns them into a plain ``binary``
  column with one memcpy per value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sluiceway.journal.format import FLAG_NULL_VALUE, KIND_RECORD, REC_HEADER_SIZE
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
    # Views need 12 readable bytes from each start and offsets that fit an i32; the frames
    # that follow every field (and the COMMIT frame) guarantee the first, chunk sizes the second.
    if total > _GATHER_MAX_MEAN * n and int(starts.max()) + 12 <= src.size and src.size < 1 << 31:
        return _views(src, starts, lens, typ, valid)
    return _gather(src.u8, starts, lens, typ, valid)


def _headers(src: _Source, hstart: np.ndarray, hlen: np.ndarray) -> pa.Array:
    """Decode every record's headers block into ``list<struct<key, value>>``."""
    n = len(hstart)
    counts = np.zeros(n, dtype=np.int64)
    has = hlen > 0
    if has.any():
        counts[has] = src.w32[hstart[has]]
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


def decode_arrow(buf: bytes, batches: Sequence[ParsedBatch], lo: int, hi: int) -> pa.RecordBatch:
    """Decode the records with offsets in ``[lo, hi)`` of ``batches`` (all located in ``buf``).

    The batches must already be verified (``records_ok``). Structural inconsistencies raise
    :class:`RecordProblem` with the buffer position of the first bad frame.
    """
    if not batches:
        return empty_batch()
    counts = np.fromiter((b.count for b in batches), dtype=np.int64, count=len(batches))
    lens = np.concatenate([b.lens(buf) for b in batches]).astype(np.int64)
    n = len(lens)
    if n == 0:
        return empty_batch()
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

    keep = (offsets >= lo) & (offsets < hi)
    if not keep.all():
        sel = np.flatnonzero(keep)
        starts, offsets, nsl, kl, vl, hl = (a[sel] for a in (starts, offsets, nsl, kl, vl, hl))
        h = h[sel]
        n = len(sel)
        if n == 0:
            return empty_batch()
    src = _Source(buf)
    ns_start = starts + REC_HEADER_SIZE
    key_start = ns_start + nsl
    val_start = key_start + kl
    hdr_start = val_start + vl
    null = (h["flags"] & FLAG_NULL_VALUE) != 0
    valid = ~null if null.any() else None
    vlens = np.where(null, 0, vl) if valid is not None else vl
    columns = [
        pa.array(np.ascontiguousarray(offsets), type=pa.int64()),
        _column(src, ns_start, nsl, pa.string()),
        _op_column(n),
        _column(src, key_start, kl, pa.string()),
        _column(src, val_start, vlens, pa.binary(), valid),
        _headers(src, hdr_start, hl),
        pa.array(np.ascontiguousarray(h["ts"]), type=pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
