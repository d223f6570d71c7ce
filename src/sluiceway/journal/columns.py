"""Records in as Arrow columns: the write-side twin of ``read_arrow``.

:meth:`AppendTransaction.write_arrow <sluiceway.journal.append.AppendTransaction.write_arrow>`
takes a table shaped like what ``read_arrow`` returns and turns it into the transaction's
columns without a Python object per field: keys, values and namespaces leave Arrow as bytes in
one call each, timestamps as integers, and header lists are encoded once per distinct list (a
batch's records mostly share a few).

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

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.journal.errors import InvalidJournalRecord
from sluiceway.journal.format import MAX_NAMESPACE_BYTES, encode_pairs


@dataclass(frozen=True, slots=True)
class Columns:
    """One append's worth of records, as the transaction keeps them."""

    keys: list[bytes]
    values: list[bytes | None]
    namespaces: list[bytes]
    headers: list[bytes]
    #: Microseconds since the epoch; None where the record takes the append's clock.
    timestamps: list[int | None]
    nulls: bool


def arrow_columns(table: pa.Table | pa.RecordBatch) -> Columns:
    """The records of ``table`` as columns; :class:`InvalidJournalRecord` names what is wrong."""
    names = set(table.schema.names)
    for required in ("key", "value"):
        if required not in names:
            raise InvalidJournalRecord(required, f"the table has no {required!r} column")
    n = table.num_rows
    key = _column(table, "key")
    if key.null_count:
        raise InvalidJournalRecord("key", "must not be null")
    value = _column(table, "value")
    namespaces: list[bytes] = [b""] * n
    if "namespace" in names:
        ns = pc.fill_null(_as_binary(_column(table, "namespace"), "namespace"), b"")
        if n and pc.max(pc.binary_length(ns)).as_py() > MAX_NAMESPACE_BYTES:
            raise InvalidJournalRecord("namespace", f"longer than {MAX_NAMESPACE_BYTES} bytes")
        namespaces = ns.to_pylist()
    return Columns(
        keys=_as_binary(key, "key").to_pylist(),
        values=_as_binary(value, "value").to_pylist(),
        namespaces=namespaces,
        headers=_headers(_column(table, "headers")) if "headers" in names else [b""] * n,
        timestamps=_timestamps(_column(table, "timestamp")) if "timestamp" in names else [None] * n,
        nulls=value.null_count > 0,
    )


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


def _headers(col: pa.Array) -> list[bytes]:
    kind = col.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(
        kind.value_type
    ):
        raise InvalidJournalRecord("headers", f"must be a list of struct<key, value>, got {kind}")
    pairs = col.values  # the whole child array; offsets index into it
    try:
        names = pairs.field("key").to_pylist()
        texts = pairs.field("value").to_pylist()
    except KeyError:
        raise InvalidJournalRecord("headers", f"must be a list of struct<key, value>, got {kind}") from None
    offsets = col.offsets.to_pylist()
    valid = col.is_valid().to_pylist() if col.null_count else None
    seen: dict[tuple[tuple[str, str], ...], bytes] = {}
    out: list[bytes] = []
    for i in range(len(col)):
        lo, hi = offsets[i], offsets[i + 1]
        if lo == hi or (valid is not None and not valid[i]):
            out.append(b"")
            continue
        block = tuple(zip(names[lo:hi], texts[lo:hi], strict=True))
        encoded = seen.get(block)
        if encoded is None:
            encoded = seen[block] = _encode_block(block)
        out.append(encoded)
    return out


def _encode_block(block: tuple[tuple[Any, Any], ...]) -> bytes:
    pairs: list[tuple[str, str]] = []
    for name, text in block:
        if not isinstance(name, str) or not (text is None or isinstance(text, str)):
            raise InvalidJournalRecord("headers", "keys must be non-null strings, values strings")
        pairs.append((name, text or ""))
    return encode_pairs(pairs)


def _timestamps(col: pa.Array) -> list[int | None]:
    kind = col.type
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            raise InvalidJournalRecord("timestamp", "a timestamp column without a time zone")
        col = col.cast(pa.timestamp("us", kind.tz), safe=False).cast(pa.int64())
    elif not pa.types.is_integer(kind):
        raise InvalidJournalRecord("timestamp", f"must be a timestamp or int64 µs column, got {kind}")
    out: list[int | None] = col.cast(pa.int64()).to_pylist()
    return out
