"""Per-record and vectorised transforms, the record shape, and the SQL the source keeps."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from sluiceway.db import Dialect, load_queries
from sluiceway.journal import ARROW_SCHEMA
from sluiceway.pipeline import RECORD_DDL, RECORD_SCHEMA, Record, SpecError
from sluiceway.pipeline.record import coerce_record, records_from_arrow, records_to_arrow, with_delete_ops
from sluiceway.pipeline.transforms import apply_record_function, as_batches, bind_input, load_callable


def sample() -> pa.RecordBatch:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return records_to_arrow(
        [
            Record(offset=1, namespace="orders", key="a", value=b"1", headers=[("h", "x")], timestamp=ts),
            Record(offset=2, namespace="orders", key="b", value=None, op="delete", timestamp=ts),
            Record(offset=3, namespace="users", key="c", value=b"3", timestamp=ts),
        ]
    )


def test_records_round_trip_through_arrow() -> None:
    b = sample()
    assert b.schema.equals(RECORD_SCHEMA)
    back = records_from_arrow(b)
    assert back[0].headers == [("h", "x")] and back[0].header("h") == "x"
    assert back[1].value is None and back[1].op == "delete"


def test_the_record_shape_is_one_definition_in_three_forms() -> None:
    """Arrow is the definition; the Spark DDL and ``StructType`` are derived from it and agree."""
    from pyspark.sql import types as T

    from sluiceway.pipeline.sources.common import spark_record_schema

    assert RECORD_SCHEMA is ARROW_SCHEMA
    assert RECORD_DDL == (
        "offset BIGINT, namespace STRING, op STRING, key STRING, value BINARY, "
        "headers ARRAY<STRUCT<key: STRING, value: STRING>>, timestamp TIMESTAMP"
    )
    header = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.StringType())])
    assert spark_record_schema() == T.StructType(
        [
            T.StructField("offset", T.LongType()),
            T.StructField("namespace", T.StringType()),
            T.StructField("op", T.StringType()),
            T.StructField("key", T.StringType()),
            T.StructField("value", T.BinaryType()),
            T.StructField("headers", T.ArrayType(header)),
            T.StructField("timestamp", T.TimestampType()),
        ]
    )
    # The DDL as Spark itself would print it (no JVM: simpleString), field by field.
    spark = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in spark_record_schema())
    assert RECORD_DDL.replace(": ", ":").replace(", value:", ",value:").lower() == spark


def test_tombstones_get_the_delete_op() -> None:
    b = pa.RecordBatch.from_pylist(
        [{"offset": 1, "op": "insert", "value": None}, {"offset": 2, "op": "insert", "value": b"x"}],
        schema=RECORD_SCHEMA,
    )
    assert with_delete_ops(b).column("op").to_pylist() == ["delete", "insert"]
    ok = pa.RecordBatch.from_pylist([{"offset": 1, "op": "insert", "value": b"x"}], schema=RECORD_SCHEMA)
    assert with_delete_ops(ok) is ok


def enrich(r: Record) -> object:
    if r.namespace == "users":
        return None  # drop
    if r.key == "a":
        return [
            r.replace(key="a1"),
            {"offset": r.offset, "namespace": "orders", "key": "a2", "value": "text"},
        ]
    return r.replace(value=b"changed")


def test_per_record_function_drops_fans_out_and_keeps_order() -> None:
    out = apply_record_function(enrich, sample())
    assert out.column("key").to_pylist() == ["a1", "a2", "b"]
    assert out.column("offset").to_pylist() == [1, 1, 2]
    assert out.column("value").to_pylist() == [b"1", b"text", b"changed"]


def test_coerce_record_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="must return a Record"):
        coerce_record(42)


def test_as_batches_normalises_results() -> None:
    b = sample()
    assert list(as_batches(None, b.schema)) == []
    assert sum(x.num_rows for x in as_batches(pa.Table.from_batches([b]), b.schema)) == 3
    with pytest.raises(TypeError):
        list(as_batches([1], b.schema))


def test_bind_input_makes_input_a_cte() -> None:
    assert bind_input("SELECT * FROM input", "v1") == "WITH input AS (SELECT * FROM v1) SELECT * FROM input"
    assert (
        bind_input("with x as (select 1) SELECT * FROM input, x", "v1")
        == "WITH input AS (SELECT * FROM v1), x as (select 1) SELECT * FROM input, x"
    )


def test_load_callable_names_the_field() -> None:
    assert load_callable("tests.unit.pipeline.test_transforms_and_records:enrich") is enrich
    with pytest.raises(SpecError, match=r"transforms\[0\].python: cannot import 'no_such_module'") as raised:
        load_callable("no_such_module:f", path="transforms[0].python")
    assert "run from the directory that holds it, or add that directory to PYTHONPATH" in str(raised.value)
    with pytest.raises(SpecError, match="has no function 'nope'"):
        load_callable("json:nope")


def test_every_dialect_defines_the_same_source_queries() -> None:
    names = {d: set(load_queries("sluiceway.pipeline", d)) for d in Dialect}
    assert names[Dialect.POSTGRES] == names[Dialect.SQLITE] == names[Dialect.MYSQL]
    assert {"claim", "next_claimed", "purge", "batch_rows"} <= names[Dialect.POSTGRES]
