"""The one record shape every source yields and every sink takes, as Arrow, Spark and Python.

``offset, namespace, op, key, value, headers, timestamp``: ``offset`` is the source's position
of the record (journal offset, Kafka partition offset, outbox row id); ``namespace`` the topic,
table or collection; ``op`` ``insert``/``update``/``delete``/…; ``value`` bytes (``None`` is a
tombstone, whose op is ``delete``); ``headers`` a list of ``(key, value)`` string pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.journal.record import ARROW_SCHEMA as _JOURNAL_SCHEMA
from sluiceway.journal.record import OP_HEADER

#: The Arrow schema of a record batch: the journal's bulk-read schema itself, the one definition
#: of the shape (the journal, the lowest layer that reads and writes it, owns it).
RECORD_SCHEMA: pa.Schema = _JOURNAL_SCHEMA


def spark_ddl(schema: pa.Schema) -> str:
    """An Arrow schema as Spark DDL (the types the record shape uses; built without a JVM).

    >>> spark_ddl(pa.schema([pa.field("offset", pa.int64()), pa.field("tags", pa.list_(pa.string()))]))
    'offset BIGINT, tags ARRAY<STRING>'
    """
    return ", ".join(f"{f.name} {_ddl_type(f.type)}" for f in schema)


def _ddl_type(t: pa.DataType) -> str:
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{f.name}: {_ddl_type(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ARRAY<{_ddl_type(t.value_type)}>"
    if pa.types.is_timestamp(t):
        # Spark's TIMESTAMP is an instant (Arrow's zoned timestamp); TIMESTAMP_NTZ has no zone.
        return "TIMESTAMP" if t.tz is not None else "TIMESTAMP_NTZ"
    for test, name in _DDL_TYPES:
        if test(t):
            return name
    raise TypeError(f"no Spark DDL type for Arrow type {t}")


_DDL_TYPES = (
    (pa.types.is_int64, "BIGINT"),
    (pa.types.is_int32, "INT"),
    (pa.types.is_boolean, "BOOLEAN"),
    (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_string, "STRING"),
    (pa.types.is_large_string, "STRING"),
    (pa.types.is_binary, "BINARY"),
    (pa.types.is_large_binary, "BINARY"),
)

#: The same schema as Spark DDL (what the data sources declare), derived from the Arrow schema.
RECORD_DDL = spark_ddl(RECORD_SCHEMA)

RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_SCHEMA.names)

#: The type names a table sink's ``schema`` may give (the Delta/Iceberg primitive names), and
#: their Arrow types.
LAKE_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "binary": pa.binary(),
}

#: The record columns a table sink keeps beside the value's own in ``columns: json``.
JSON_META = ("namespace", "key", "op", "offset", "timestamp")

_DELETE = pa.scalar("delete", pa.string())
_OP_HEADER = pa.scalar(OP_HEADER, pa.string())


@dataclasses.dataclass(slots=True)
class Record:
    """One record, as per-record Python transforms see it.

    >>> r = Record(offset=7, namespace="orders", key="o-1", value=b"{}")
    >>> r.replace(op="update").op
    'update'

    ``extra`` holds any columns beyond the common shape (added by a SQL transform, say).
    """

    offset: int = 0
    namespace: str = ""
    op: str = "insert"
    key: str = ""
    value: bytes | None = None
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    timestamp: datetime | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def replace(self, **changes: Any) -> Record:
        return dataclasses.replace(self, **changes)

    def header(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def as_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "offset": self.offset,
            "namespace": self.namespace,
            "op": self.op,
            "key": self.key,
            "value": self.value,
            "headers": [{"key": k, "value": v} for k, v in self.headers],
            "timestamp": self.timestamp,
        }
        row.update(self.extra)
        return row


def record_from_row(row: Mapping[str, Any]) -> Record:
    """A :class:`Record` from a ``to_pylist`` row (headers as ``{key, value}`` structs)."""
    headers = row.get("headers") or []
    extra = {k: v for k, v in row.items() if k not in RECORD_COLUMNS}
    return Record(
        offset=int(row.get("offset") or 0),
        namespace=row.get("namespace") or "",
        op=row.get("op") or ("delete" if row.get("value") is None else "insert"),
        key=row.get("key") or "",
        value=row.get("value"),
        headers=[(h["key"], h["value"]) for h in headers] if headers else [],
        timestamp=row.get("timestamp"),
        extra=extra,
    )


def coerce_record(obj: Any, *, where: str = "transform") -> Record:
    """Accept what a transform may return for one record: a :class:`Record` or a mapping."""
    if isinstance(obj, Record):
        return obj
    if isinstance(obj, Mapping):
        data = dict(obj)
        headers = data.get("headers") or []
        data["headers"] = [
            {"key": h[0], "value": h[1]} if isinstance(h, tuple | list) else dict(h) for h in headers
        ]
        value = data.get("value")
        if isinstance(value, str):
            data["value"] = value.encode()
        return record_from_row(data)
    raise TypeError(f"{where} must return a Record, a dict, a list of them or None; got {type(obj).__name__}")


def records_to_arrow(records: Sequence[Record], schema: pa.Schema = RECORD_SCHEMA) -> pa.RecordBatch:
    """Build a record batch in ``schema`` (extra columns come from each record's ``extra``)."""
    rows = [r.as_row() for r in records]
    for row in rows:
        ts = row.get("timestamp")
        if isinstance(ts, datetime) and ts.tzinfo is None:
            row["timestamp"] = ts.replace(tzinfo=UTC)
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def records_from_arrow(batch: pa.RecordBatch | pa.Table) -> list[Record]:
    return [record_from_row(row) for row in batch.to_pylist()]


def with_delete_ops(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Tombstones (null value) get ``op = 'delete'`` — vectorised, and free when there are none."""
    value = batch.column("value")
    if value.null_count == 0:
        return batch
    i = batch.schema.get_field_index("op")
    op = pc.if_else(pc.is_null(value), _DELETE, batch.column(i))
    return batch.set_column(i, batch.schema.field(i), op)


def with_header_ops(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Records whose first header is ``sluice.op`` get that ``op`` (a CDC capture's records read
    back from its journal) — vectorised, and free for a batch without headers."""
    headers = batch.column("headers")
    if len(headers.values) == 0:
        return batch
    offsets = np.asarray(headers.offsets, dtype=np.int64)
    has = offsets[1:] > offsets[:-1]
    if headers.null_count:
        has &= np.asarray(headers.is_valid(), dtype=bool)
    rows = np.flatnonzero(has)
    if not len(rows):
        return batch
    first = headers.values.take(pa.array(offsets[rows]))
    marked = pc.equal(first.field("key"), _OP_HEADER).fill_null(False)
    if not pc.any(marked).as_py():
        return batch
    i = batch.schema.get_field_index("op")
    mask = np.zeros(batch.num_rows, dtype=bool)
    mask[rows[np.asarray(marked, dtype=bool)]] = True
    ops = pc.replace_with_mask(batch.column(i), pa.array(mask), first.field("value").filter(marked))
    return batch.set_column(i, batch.schema.field(i), ops)


def empty_batch(schema: pa.Schema = RECORD_SCHEMA) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def header_pairs(value: Iterable[Any] | None) -> list[tuple[str, str]]:
    """Headers from an Arrow/pylist value (``[{key, value}]``) as ``(key, value)`` pairs."""
    if not value:
        return []
    return [(str(h["key"]), "" if h["value"] is None else str(h["value"])) for h in value]
