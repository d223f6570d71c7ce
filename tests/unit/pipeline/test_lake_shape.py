"""The table sinks' pure core: a batch in the table's shape, the mirror's last change per key,
and how a table's schema takes a batch's."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from sluiceway.pipeline.sinks.lakehouse.shape import SchemaConflict, evolve, lake_rows, mirror_changes
from sluiceway.pipeline.sinks.part import batch_of_token, token_of


def batch(*rows: tuple[str, str, str, object]) -> pa.Table:
    return pa.table(
        {
            "offset": pa.array(range(len(rows)), pa.int64()),
            "namespace": [r[0] for r in rows],
            "op": [r[1] for r in rows],
            "key": [r[2] for r in rows],
            "value": pa.array(
                [None if r[3] is None else json.dumps(r[3]).encode() for r in rows], pa.binary()
            ),
        }
    )


def test_json_columns_typed_by_the_table_the_spec_then_inferred() -> None:
    records = batch(
        ("t", "insert", "1", {"id": 1, "price": 2, "at": "2026-01-02T03:04:05+00:00", "tags": [1, 2]}),
        ("t", "insert", "2", {"id": 2, "price": 2.5, "note": None}),
        ("t", "delete", "1", None),
    )
    known = pa.schema([pa.field("id", pa.int32())])
    rows = lake_rows(records, "json", known, {"at": "timestamp"})
    assert rows.schema.field("id").type == pa.int32()  # the table's type wins
    assert rows.schema.field("price").type == pa.float64()  # ints and floats: double
    assert rows.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert rows.column("tags").to_pylist() == ["[1,2]", None, None]  # arrays as JSON text
    assert "note" not in rows.column_names  # never a value yet: no column until it has one
    assert rows.column("op").to_pylist() == ["insert", "insert", "delete"]
    assert lake_rows(records, "record", None, {}) is records


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (b"[1]", "is a JSON list, not an object"),
        (b"{nope", "is not JSON"),
        (b'{"key": 1}', "field 'key', which is a record column"),
        (b'{"id": "x"}', "column 'id': values no longer fit its type int64"),
        (b'{"id": 2.5}', "column 'id': values no longer fit its type int64"),  # never truncated to 2
    ],
)
def test_a_batch_that_does_not_fit_says_why(value: bytes, words: str) -> None:
    records = batch(("t", "insert", "1", {"id": 1}))
    records = records.set_column(4, "value", pa.array([value], pa.binary()))
    with pytest.raises(SchemaConflict, match=words):
        lake_rows(records, "json", pa.schema([pa.field("id", pa.int64())]), {})


def test_mirror_keeps_the_last_change_of_each_key_and_drops_what_a_truncate_emptied() -> None:
    rows = batch(
        ("a", "insert", "1", {}),
        ("b", "insert", "1", {}),
        ("a", "update", "2", {}),
        ("a", "truncate", "", None),
        ("a", "insert", "3", {}),
        ("b", "delete", "1", None),
        ("a", "update", "3", {}),
    )
    changes, truncated = mirror_changes(rows, ["namespace", "key"])
    assert changes.column("offset").to_pylist() == [5, 6]  # b/1's delete, then a/3's last update
    assert truncated == ["a"]
    with pytest.raises(SchemaConflict, match="key column 'id' is not in the batch"):
        mirror_changes(rows, ["id"])


def test_evolve_adds_nullable_columns_and_refuses_a_changed_type() -> None:
    table = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.large_string())])
    added = evolve(
        table, pa.schema([("id", pa.int32()), ("name", pa.string()), ("new", pa.float64()), ("z", pa.null())])
    )
    assert added == [pa.field("new", pa.float64(), nullable=True)]  # int32 widens; a null column waits
    with pytest.raises(
        SchemaConflict, match="column 'name' is large_string in the table but int64 in the batch"
    ):
        evolve(table, pa.schema([("name", pa.int64())]))


def test_a_token_names_its_checkpoints_life_and_batch() -> None:
    assert batch_of_token(token_of("abc123", 42, 0, 7, 10)) == ("abc123", 42)
    assert batch_of_token(token_of("abc123", 3, None, 0, 1)) == ("abc123", 3)


def test_typed_columns_are_always_there_and_zoneless_timestamps_are_utc() -> None:
    records = batch(("t", "delete", "1", None), ("t", "insert", "2", {"at": "2026-01-02T03:04:05"}))
    rows = lake_rows(records, "json", None, {"id": "long", "at": "timestamp"})
    assert rows.column("id").to_pylist() == [None, None]  # typed in schema: there, even all null
    assert rows.column("at").to_pylist()[1].isoformat() == "2026-01-02T03:04:05+00:00"
    known = pa.schema([pa.field("doc", pa.large_string())])  # how Iceberg's schema reads strings
    rows = lake_rows(batch(("t", "insert", "1", {"doc": {"a": [1]}})), "json", known, {})
    assert rows.column("doc").to_pylist() == ['{"a":[1]}']
