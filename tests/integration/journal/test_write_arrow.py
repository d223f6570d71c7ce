"""``tx.write_arrow``: records in as Arrow columns store exactly what ``tx.write`` stores."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluiceway.journal import InvalidJournalRecord, Journal

HEADER = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))
T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal.open(str(tmp_path / "journal")) as j:
        yield j


def fields(journal: Journal, start: int = 0) -> list[tuple[Any, ...]]:
    return [(r.namespace, r.key, r.value, r.headers, r.timestamp_us) for r in journal.read(start)]


ROWS: list[dict[str, Any]] = [
    {
        "namespace": "orders",
        "key": "k1",
        "value": b"one",
        "headers": [{"key": "h", "value": "v"}],
        "timestamp": T0,
    },
    {"namespace": None, "key": "k2", "value": None, "headers": None, "timestamp": T0},  # a tombstone
    {"namespace": "orders", "key": "k1", "value": b"", "headers": [], "timestamp": T0},
    {
        "namespace": "payments",
        "key": "k3",
        "value": b"three",
        "headers": [{"key": "a", "value": "1"}, {"key": "b", "value": None}, {"key": "a", "value": "2"}],
        "timestamp": datetime(2020, 1, 1, tzinfo=UTC),
    },
    {
        "namespace": "orders",
        "key": "k1",
        "value": b"four",
        "headers": [{"key": "h", "value": "v"}],
        "timestamp": T0,
    },
]
SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("namespace", pa.string()),
        ("key", pa.string()),
        ("value", pa.binary()),
        ("headers", HEADER),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def write_each(journal: Journal, rows: list[dict[str, Any]]) -> None:
    """``rows`` as one append written record by record (the reference for write_arrow)."""
    with journal.append() as tx:
        for r in rows:
            headers = [(h["key"], h["value"] or "") for h in r["headers"] or []]
            tx.write(
                r["key"], r["value"], headers=headers or None, namespace=r["namespace"] or "",
                timestamp=r["timestamp"],
            )  # fmt: skip


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([{"offset": i, **r} for i, r in enumerate(rows)], schema=SCHEMA)


def test_the_same_records_as_write_one_by_one(journal: Journal, tmp_path: Path) -> None:
    with journal.append() as tx:
        assert tx.write_arrow(table(ROWS)) == len(ROWS)
    with Journal.open(str(tmp_path / "by-record")) as reference:
        write_each(reference, ROWS)
        assert fields(journal) == fields(reference)
    assert fields(journal)[3][3] == [("a", "1"), ("b", ""), ("a", "2")]


def test_slices_chunks_and_other_column_types(journal: Journal) -> None:
    chunked = pa.concat_tables([table(ROWS[:2]), table(ROWS[2:])])
    assert chunked.column("key").num_chunks == 2
    sliced = table(ROWS).slice(2, 2).to_batches()[0]  # a record batch whose arrays start at 2
    other = pa.table(
        {
            "key": pa.array(["x", "y"], pa.large_string()),
            "value": pa.array(["text", None], pa.string()),  # str values are stored as UTF-8
            "timestamp": pa.array([1_000_000, None], pa.int64()),  # µs; null is now
        }
    )
    before = time.time_ns() // 1000
    with journal.append() as tx:
        tx.write_arrow(chunked)
        tx.write_arrow(sliced)
        tx.write_arrow(other)
    got = fields(journal)
    assert [g[1] for g in got] == ["k1", "k2", "k1", "k3", "k1", "k1", "k3", "x", "y"]
    assert got[5:7] == got[2:4]
    assert got[7] == ("", "x", b"text", [], 1_000_000)
    assert got[8][2] is None and got[8][4] >= before


@pytest.mark.parametrize(
    ("columns", "field", "problem"),
    [
        ({"value": pa.array([b"v"])}, "key", "no 'key' column"),
        ({"key": pa.array(["k", None]), "value": pa.array([b"v", b"w"])}, "key", "must not be null"),
        ({"key": pa.array([1]), "value": pa.array([b"v"])}, "key", "string or binary"),
        (
            {
                "key": pa.array(["k"]),
                "value": pa.array([b"v"]),
                "timestamp": pa.array([datetime(2026, 1, 1)]),
            },
            "timestamp",
            "without a time zone",
        ),
        (
            {"key": pa.array(["k"]), "value": pa.array([b"v"]), "headers": pa.array([["h"]])},
            "headers",
            "list of struct",
        ),
        (
            {"key": pa.array(["k"]), "value": pa.array([b"v"]), "namespace": pa.array(["n" * 70_000])},
            "namespace",
            "longer than",
        ),
    ],
)
def test_a_bad_table_is_refused_whole_and_named(
    journal: Journal, columns: dict[str, pa.Array], field: str, problem: str
) -> None:
    with journal.append() as tx:
        tx.write("kept", b"before")
        with pytest.raises(InvalidJournalRecord, match=problem) as err:
            tx.write_arrow(pa.table(columns))
        assert err.value.field == field
        assert tx.count == 1  # nothing of the refused table was added
    assert [g[1] for g in fields(journal)] == ["kept"]


def test_big_arrow_appends_mixed_with_write_store_the_same_records(journal: Journal, tmp_path: Path) -> None:
    """Appends of more than a few records are encoded straight from the columns; a write() in the
    same append turns them back into records first. Either way the journal holds the same."""
    many = ROWS * 20  # 100 records: the column path
    with journal.append() as tx:
        tx.write_arrow(table(many))
        tx.write("solo", b"s", namespace="orders", timestamp=T0)
        tx.write_arrow(table(many))
    with journal.append() as tx:
        tx.write_arrow(table(many))
        assert tx.count == len(many)
    with Journal.open(str(tmp_path / "by-record")) as reference:
        solo = {"namespace": "orders", "key": "solo", "value": b"s", "headers": [], "timestamp": T0}
        write_each(reference, [*many, solo, *many])
        write_each(reference, many)
        assert fields(journal) == fields(reference)
    assert len(fields(journal)) == 3 * len(many) + 1
