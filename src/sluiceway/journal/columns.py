"""Records in as Arrow columns: the write-side twin of ``read_arrow``.

:meth:`AppendTransaction.write_arrow <sluiceway.journal.append.AppendTransaction.write_arrow>`
takes a table shaped like what ``read_arrow`` returns and turns it into one column piece
(:class:`~sluiceway.journal.encode.ColumnPiece`) without a Python object per record: each
field's lengths as one array and its bytes back to back, header lists encoded column-wise.

Columns used (others, such as ``offset``, are ignored):

* ``key`` — string (or binary holding UTF-8), no nulls;
* ``value`` — binary or string; null is a tombstone;
* ``namespace`` — string, optional; null or absent is "";
* ``headers`` — list of ``struct<key: string, value: string>``, optional; a null header value
  is stored as "" (journal headers have no null);
* ``timestamp`` — a timestamp with a time zone, or int64 microseconds since the epoch, optional;
  null or absent is now.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.journal.encode import ColumnPiece
from sluiceway.journal.errors import InvalidJournalRecord
from sluiceway.journal.format import MAX_NAMESPACE_BYTES


def arrow_piece(table: pa.Table | pa.RecordBatch, now: int) -> ColumnPiece:
    """The records of ``table`` as one column piece for :func:`~sluiceway.journal.encode.encode_pieces`
    (``now``: the timestamp of records without one); :class:`InvalidJournalRecord` names what is
    wrong (a missing or null key, a missing value, a column of the wrong type, a long namespace)."""
    names = set(table.schema.names)
    for required in ("key", "value"):
        if required not in names:
            raise InvalidJournalRecord(required, f"the table has no {required!r} column")
    n = table.num_rows
    key = _column(table, "key")
    if key.null_count:
        raise InvalidJournalRecord("key", "must not be null")
    key_lens, key_data = _lengths_and_bytes(_as_binary(key, "key"))
    value = _as_binary(_column(table, "value"), "value")
    nulls = None
    if value.null_count:
        nulls = ~np.asarray(value.is_valid(), dtype=bool)
        value = value.fill_null(b"")
    value_lens, value_data = _lengths_and_bytes(value)
    namespace: bytes | None = b""
    ns_lens, ns_data = None, b""
    if "namespace" in names:
        ns = pc.fill_null(_as_binary(_column(table, "namespace"), "namespace"), b"")
        if n and pc.max(pc.binary_length(ns)).as_py() > MAX_NAMESPACE_BYTES:
            raise InvalidJournalRecord("namespace", f"longer than {MAX_NAMESPACE_BYTES} bytes")
        if n and pc.count_distinct(ns).as_py() == 1:
            namespace = ns[0].as_py()
        elif n:
            namespace = None
            ns_lens, ns_data = _lengths_and_bytes(ns)
    if "headers" in names:
        header_lens, header_data = _header_blocks(_column(table, "headers"))
    else:
        header_lens, header_data = np.zeros(n, dtype=np.int64), b""
    if "timestamp" in names:
        stamps = _timestamp_array(_column(table, "timestamp"))
        timestamps = stamps.fill_null(now).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        timestamps = np.full(n, now, dtype=np.int64)
    return ColumnPiece(
        n, key_lens, key_data, value_lens, value_data, nulls, namespace, ns_lens, ns_data,
        header_lens, header_data, timestamps,
    )  # fmt: skip


def _lengths_and_bytes(col: pa.Array) -> tuple[np.ndarray, bytes]:
    """A binary column's lengths (int64) and its bytes back to back."""
    wide = pa.types.is_large_binary(col.type)
    bounds = np.frombuffer(col.buffers()[1], dtype=np.int64 if wide else np.int32)
    bounds = bounds[col.offset : col.offset + len(col) + 1].astype(np.int64)
    data = col.buffers()[2]
    first, last = int(bounds[0]), int(bounds[-1])
    raw = b"" if data is None else data.slice(first, last - first).to_pybytes()
    return np.diff(bounds), raw


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    col: Any = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _as_binary(col: pa.Array, field: str) -> pa.Array:
    kind = col.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return col.cast(pa.binary())
    if pa.types.is_binary(kind):
        return col
    raise InvalidJournalRecord(field, f"must be a string or binary column, got {kind}")


def _header_blocks(col: pa.Array) -> tuple[np.ndarray, bytes]:
    """The encoded header blocks' lengths and bytes, back to back."""
    blocks = _header_array(col)
    if blocks is None:
        return np.zeros(len(col), dtype=np.int64), b""
    return _lengths_and_bytes(blocks)


def _header_array(col: pa.Array) -> pa.Array | None:
    """Each row's header list as an encoded pairs block, column-wise (``None``: no row has any).

    The block is ``u32 count``, then ``(u32 key length, u32 value length)`` per pair, then each
    pair's key and value bytes. Every piece is placed with one numpy scatter over all rows, so
    the cost per record is a slice, not a Python loop over its pairs.
    """
    kind = col.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(
        kind.value_type
    ):
        raise InvalidJournalRecord("headers", f"must be a list of struct<key, value>, got {kind}")
    struct = kind.value_type
    names = {struct.field(i).name for i in range(struct.num_fields)}
    if not {"key", "value"} <= names:
        raise InvalidJournalRecord("headers", f"must be a list of struct<key, value>, got {kind}")
    offsets = np.asarray(col.offsets, dtype=np.int64)
    counts = np.diff(offsets)
    if col.null_count:
        counts[~np.asarray(col.is_valid(), dtype=bool)] = 0
    total = int(counts.sum())
    if total == 0:
        return None
    # The pairs of every row, in row order (a null row has none).
    starts = np.cumsum(counts) - counts
    pair = pa.array(np.repeat(offsets[:-1] - starts, counts) + np.arange(total, dtype=np.int64))
    keys = _pair_text(col.values.field("key").take(pair), "keys")
    values = _pair_text(col.values.field("value").take(pair).fill_null(""), "values")
    # Fixed-width parts from numpy: the count, then (key length, value length) per pair.
    count_part = _fixed(counts[counts > 0].astype("<u4").view(np.uint8), np.where(counts > 0, 4, 0))
    lens = np.empty((total, 2), dtype="<u4")
    lens[:, 0] = pc.binary_length(keys).to_numpy()
    lens[:, 1] = pc.binary_length(values).to_numpy()
    lens_part = _fixed(lens.view(np.uint8).reshape(-1), 8 * counts)
    # The texts: each pair's key then value, each row's pairs joined, all in Arrow's kernels.
    per_pair = pc.binary_join_element_wise(keys, values, pa.scalar(b"", pa.large_binary()))
    bounds = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    text_part = pc.binary_join(
        pa.LargeListArray.from_arrays(bounds, per_pair), pa.scalar(b"", pa.large_binary())
    )
    return pc.binary_join_element_wise(count_part, lens_part, text_part, pa.scalar(b"", pa.large_binary()))


def _pair_text(texts: pa.Array, what: str) -> pa.Array:
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise InvalidJournalRecord("headers", "keys must be non-null strings, values strings")
    if texts.null_count:
        raise InvalidJournalRecord("headers", f"{what} must be non-null strings")
    return texts.cast(pa.large_binary())


def _fixed(data: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """A binary column whose row ``i`` is the next ``sizes[i]`` bytes of ``data``."""
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), len(sizes), [None, pa.py_buffer(bounds), pa.py_buffer(data.tobytes())]
    )


def _timestamp_array(col: pa.Array) -> pa.Array:
    """Microseconds since the epoch, int64 (null where the record has none)."""
    kind = col.type
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            raise InvalidJournalRecord("timestamp", "a timestamp column without a time zone")
        col = col.cast(pa.timestamp("us", kind.tz), safe=False).cast(pa.int64())
    elif not pa.types.is_integer(kind):
        raise InvalidJournalRecord("timestamp", f"must be a timestamp or int64 µs column, got {kind}")
    return col.cast(pa.int64())
