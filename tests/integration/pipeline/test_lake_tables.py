"""The table adapters without Spark, on real Delta and Iceberg tables: the edges a review found —
a mirror keyed on a null key, a first batch that died leaving files, a mirror batch that changes
nothing and still records its batch."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from sluiceway.pipeline.sinks.lakehouse.delta import DeltaLake
from sluiceway.pipeline.sinks.lakehouse.iceberg import IcebergLake
from tests.support.lake import read_delta, read_iceberg


def changes(*rows: tuple[str, str | None, str, int | None]) -> pa.Table:
    return pa.table(
        {
            "namespace": [r[0] for r in rows],
            "key": pa.array([r[1] for r in rows], pa.string()),
            "op": [r[2] for r in rows],
            "n": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def test_a_delta_mirror_keeps_one_row_for_a_null_key(tmp_path: Path) -> None:
    lake = DeltaLake(str(tmp_path / "m"))
    keys = ["namespace", "key"]
    lake.mirror(changes(("a", None, "insert", 1), ("a", "1", "insert", 1)), [], keys, "app", 0)
    lake.mirror(changes(("a", None, "update", 2)), [], keys, "app", 1)
    assert sorted((r["key"] or "", r["n"]) for r in read_delta(tmp_path / "m")) == [("", 2), ("1", 1)]
    lake.mirror(changes(("a", None, "delete", None)), [], keys, "app", 2)
    assert [(r["key"], r["n"]) for r in read_delta(tmp_path / "m")] == [("1", 1)]
    assert lake.committed("app") == 2


def test_what_a_dead_first_batch_left_does_not_make_the_directory_foreign(tmp_path: Path) -> None:
    path = tmp_path / "t"
    (path / ".sluice-staging" / "run-0000000000").mkdir(parents=True)
    (path / "namespace=a").mkdir()
    (path / "part-abc-0000000000-1234abcd-p0000.parquet").write_bytes(b"PAR1")
    DeltaLake(str(path)).check()  # no error: the next attempt makes the table here


def test_an_iceberg_mirror_batch_that_changes_nothing_still_records_its_batch(tmp_path: Path) -> None:
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    lake = IcebergLake(catalog, "lake.m")
    keys = ["namespace", "key"]
    lake.mirror(changes(("a", "1", "insert", 1)), [], keys, "app", 0)
    lake.mirror(changes(("a", "9", "delete", None)), [], keys, "app", 1)  # deletes a row not there
    assert lake.committed("app") == 1
    assert [(r["key"], r["n"]) for r in read_iceberg(catalog, "lake.m")] == [("1", 1)]


def test_an_iceberg_namespace_another_sink_creates_in_the_same_moment_is_taken_as_created(
    tmp_path: Path,
) -> None:
    """The race a fresh-clone run met: two sinks of one run create one namespace; the catalog
    looks (not there), the other sink inserts it, the catalog's insert hits the unique key."""
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    lake, other = IcebergLake(catalog, "lake.a"), IcebergLake(catalog, "lake.b")
    looked = lake.catalog.namespace_exists
    raced: list[bool] = []

    def look_then_lose_the_race(namespace: object) -> bool:
        there = looked(namespace)
        if not raced:
            raced.append(True)
            other.catalog.create_namespace("lake")  # the other sink, between the look and the insert
            return bool(there)
        return bool(looked(namespace))

    lake.catalog.namespace_exists = look_then_lose_the_race
    lake.append(changes(("a", "1", "insert", 1)), "app", 0)
    assert raced
    assert lake.committed("app") == 0
    assert [r["key"] for r in read_iceberg(catalog, "lake.a")] == ["1"]
