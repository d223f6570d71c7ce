"""The rows a table sink writes, from a batch of records: pure functions over Arrow tables.

* :func:`lake_rows` — the batch in the table's shape: the record's own columns, or with
  ``columns: json`` the value (a JSON object) unpacked into columns, typed by the table's
  current schema and the spec's ``schema``, the rest inferred.
* :func:`mirror_changes` — for ``mode: mirror``: the last change of every key (in the order
  keys were last changed), and the namespaces truncated (a ``truncate`` record deletes every row
  of its namespace; the changes before it no longer matter).
* :func:`evolve` — how a table's schema takes a batch's: columns added (nullable), or
  :class:`SchemaConflict` for a change no reader could follow (a column's type changed).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import PipelineError
from sluiceway.pipeline.record import JSON_META, LAKE_TYPES


class SchemaConflict(PipelineError):
    """A batch that does not fit the table (a column's type changed, a value that is not a JSON
    object): the sink stops, saying which column or record."""


def lake_rows(records: pa.Table, columns: str, known: pa.Schema | None, given: dict[str, str]) -> pa.Table:
    """The batch in the table's shape (see the module docstring)."""
    if columns == "record":
        return records
    meta = [c for c in JSON_META if c in records.column_names]
    values = records.column("value").to_pylist() if "value" in records.column_names else [None] * len(records)
    offsets = (
        records.column("offset").to_pylist() if "offset" in records.column_names else [None] * len(records)
    )
    objects: list[dict[str, Any]] = []
    for value, offset in zip(values, offsets, strict=True):
        if value is None:
            objects.append({})  # a tombstone: its key and op say all there is
            continue
        try:
            obj = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SchemaConflict(f"the record at offset {offset} is not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise SchemaConflict(
                f"the record at offset {offset} is a JSON {type(obj).__name__}, "
                "not an object to unpack into columns"
            )
        objects.append(obj)
    names = list(dict.fromkeys(k for o in objects for k in o))
    clash = next((c for c in names if c in JSON_META), None)
    if clash is not None:
        raise SchemaConflict(
            f"the value has a field {clash!r}, which is a record column of the table; "
            "rename it in a transform"
        )
    fields = []
    for name in names:
        column = [o.get(name) for o in objects]
        fields.append(_value_field(name, column, known, given))
    # Columns typed in ``schema`` are always there (a mirror keyed on one needs it even in a
    # batch of tombstones).
    fields += [pa.field(name, LAKE_TYPES[kind]) for name, kind in given.items() if name not in names]
    unpacked = {}
    errors = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, ValueError)
    for f in fields:
        if pa.types.is_null(f.type):
            continue  # no value yet: the column waits until it has one (its type unknown till then)
        try:
            unpacked[f.name] = _typed(json_column([o.get(f.name) for o in objects], f.type), f.type)
        except errors as exc:
            raise SchemaConflict(
                f"column {f.name!r}: values no longer fit its type {f.type} ({exc})"
            ) from None
    table = records.select(meta)
    for name, array in unpacked.items():
        table = table.append_column(name, array)
    return table


def _value_field(name: str, column: list[Any], known: pa.Schema | None, given: dict[str, str]) -> pa.Field:
    if known is not None and name in known.names:
        return known.field(name).with_nullable(True)
    if name in given:
        return pa.field(name, LAKE_TYPES[given[name]])
    present = [v for v in column if v is not None]
    if not present:
        return pa.field(name, pa.null())
    if all(isinstance(v, bool) for v in present):
        return pa.field(name, pa.bool_())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.field(name, pa.int64())
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pa.field(name, pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.field(name, pa.string())
    # Objects, arrays, or mixed kinds: the JSON text (a later reader parses it as it needs).
    return pa.field(name, pa.string())


def _typed(values: list[Any], t: pa.DataType) -> pa.Array:
    """JSON values as a column of type ``t``: read as what they are, then cast *safely* — a
    ``2.5`` never becomes a ``long`` 2, it is refused. Timestamps without a zone are UTC."""
    if all(v is None for v in values):
        return pa.nulls(len(values), t)
    array = pa.array(values)
    if pa.types.is_timestamp(t) and pa.types.is_string(array.type):
        try:
            return array.cast(t)
        except pa.ArrowInvalid:
            return array.cast(pa.timestamp(t.unit)).cast(t)  # no zone in the text: UTC
    return array.cast(t)


def json_column(values: list[Any], t: pa.DataType) -> list[Any]:
    """Values for a ``string`` column that received objects or arrays: their JSON text."""
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return values
    return [v if v is None or isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in values]


def mirror_changes(rows: pa.Table, keys: list[str]) -> tuple[pa.Table, list[str]]:
    """The last change of every key, in the order keys were last changed, and the namespaces a
    ``truncate`` emptied (changes of a namespace before its last truncate are dropped)."""
    missing = [k for k in keys if k not in rows.column_names]
    if missing:
        raise SchemaConflict(
            f"the key column {missing[0]!r} is not in the batch (columns: {', '.join(rows.column_names)})"
        )
    n = rows.num_rows
    ops = rows.column("op").to_pylist() if "op" in rows.column_names else [None] * n
    namespaces = rows.column("namespace").to_pylist() if "namespace" in rows.column_names else [None] * n
    truncated_at: dict[Any, int] = {}
    for i, op in enumerate(ops):
        if op == "truncate":
            truncated_at[namespaces[i]] = i
    key_columns = [rows.column(k).to_pylist() for k in keys]
    latest: dict[tuple[Any, ...], int] = {}
    for i in range(n):
        if ops[i] == "truncate" or i < truncated_at.get(namespaces[i], -1):
            continue
        k = tuple(c[i] for c in key_columns)
        latest.pop(k, None)  # re-insert: the dict's order follows each key's last change
        latest[k] = i
    changes = rows.take(pa.array(list(latest.values()), pa.int64()))
    return changes, [ns for ns in truncated_at if ns is not None]


def evolve(table: pa.Schema, batch: pa.Schema) -> list[pa.Field]:
    """The batch's columns the table lacks (to add, nullable); :class:`SchemaConflict` when a
    column the table has arrives with another type (widening ``int`` to ``long`` is allowed)."""
    added = []
    for f in batch:
        if f.name not in table.names:
            if not pa.types.is_null(f.type):
                added.append(f.with_nullable(True))
            continue
        have = table.field(f.name).type
        if _plain_type(have) == _plain_type(f.type) or pa.types.is_null(f.type) or _widens(f.type, have):
            continue
        raise SchemaConflict(f"column {f.name!r} is {have} in the table but {f.type} in the batch")
    return added


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with large (64-bit offset) strings, binaries and lists as the plain ones: the same
    column to a table format (Iceberg's reader gives the large ones)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    return t


def _widens(narrow: pa.DataType, wide: pa.DataType) -> bool:
    return bool(pa.types.is_integer(narrow) and pa.types.is_int64(wide)) or bool(
        pa.types.is_float32(narrow) and pa.types.is_float64(wide)
    )


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with the table's columns, in its order (missing ones null), cast to its types."""
    arrays = []
    for f in schema:
        if f.name in rows.column_names:
            arrays.append(rows.column(f.name).cast(f.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, f.type))
    # Columns the table lacks (added by the write's schema merge) — but not one with no value
    # yet, which :func:`evolve` leaves out.
    extra = [
        c
        for c in rows.column_names
        if c not in schema.names and not pa.types.is_null(rows.schema.field(c).type)
    ]
    table = pa.Table.from_arrays(arrays, schema=pa.schema([f.with_nullable(True) for f in schema]))
    for c in extra:
        table = table.append_column(c, rows.column(c))
    return table
