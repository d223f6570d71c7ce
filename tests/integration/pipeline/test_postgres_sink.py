"""The postgres sink's writer on a real PostgreSQL, without Spark: upsert by key, a replayed
write is a no-op, deletes and truncates in their place, and what it blames (a record, or the
destination)."""

from __future__ import annotations

from typing import Any

import psycopg
import pyarrow as pa
import pytest

from sluiceway.errors import DatabaseError
from sluiceway.pipeline.errors import DestinationUnreachable, RecordRefused
from sluiceway.pipeline.sinks.postgres import PostgresSink


def rows(*records: tuple[str, str, bytes | None, str]) -> pa.Table:
    return pa.table(
        {
            "namespace": [r[0] for r in records],
            "key": [r[1] for r in records],
            "value": pa.array([r[2] for r in records], pa.binary()),
            "op": [r[3] for r in records],
        }
    )


def table(dsn: str, name: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT namespace, key, value FROM {name} ORDER BY namespace, key").fetchall()


def test_upsert_delete_truncate_and_a_replay_that_writes_nothing(postgres_dsn: str) -> None:
    sink = PostgresSink(postgres_dsn, "pg_sink_view", ["namespace", "key"], "p.s")
    try:
        sink.write(
            rows(("a", "1", b"x", "insert"), ("a", "2", b"y", "insert"), ("b", "1", b"z", "insert")), "t1"
        )
        sink.write(rows(("a", "1", b"x2", "update"), ("a", "2", None, "delete")), "t2")
        assert table(postgres_dsn, "pg_sink_view") == [("a", "1", b"x2"), ("b", "1", b"z")]
        sink.write(rows(("a", "3", b"new", "insert")), "t2")  # the same token: a replay, not written
        assert table(postgres_dsn, "pg_sink_view") == [("a", "1", b"x2"), ("b", "1", b"z")]
        sink.write(
            rows(("b", "2", b"w", "insert"), ("b", "", None, "truncate"), ("b", "3", b"v", "insert")), "t3"
        )
        assert table(postgres_dsn, "pg_sink_view") == [("a", "1", b"x2"), ("b", "3", b"v")]
    finally:
        sink.close()


def test_a_record_the_table_refuses_is_the_records_fault(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pg_sink_checked (key TEXT PRIMARY KEY, value BYTEA, CHECK (key <> 'bad'))")
    sink = PostgresSink(postgres_dsn, "pg_sink_checked", "key", "p.c", create=False)
    try:
        with pytest.raises(DatabaseError, match="check constraint") as caught:
            sink.write(rows(("n", "bad", b"x", "insert")), "t1")
        assert caught.value.code == "23514"  # mapped by SQLSTATE, in the SluicewayError tree
        with pytest.raises(RecordRefused, match="no namespace column"):
            sink.write(rows(("n", "", None, "truncate")), "t2")
        sink.write(rows(("n", "good", b"x", "insert")), "t3")  # the sink goes on after a refusal
    finally:
        sink.close()


def test_a_table_without_the_key_column_stops_the_sink_at_once(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pg_sink_keyless (id TEXT PRIMARY KEY, value BYTEA)")
    sink = PostgresSink(postgres_dsn, "pg_sink_keyless", "key", "p.k", create=False)
    with pytest.raises(DestinationUnreachable, match="no column 'key' to upsert on") as caught:
        sink.write(rows(("n", "k", b"x", "insert")), "t1")
    assert caught.value.permanent


def test_parts_that_create_the_table_at_once_all_write(postgres_dsn: str) -> None:
    """A first run's parts (Spark tasks) each prepare the destination on their own connection at
    the same moment: CREATE TABLE IF NOT EXISTS is not safe against itself (both see no table,
    one fails on the catalog's unique index), so the creation is serialised."""
    import threading

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA race")  # a schema of its own: neither table exists yet
    params = conninfo_to_dict(postgres_dsn)
    params["options"] = "-c search_path=race"
    dsn = make_conninfo(**params)  # type: ignore[arg-type]
    parts = 8
    start = threading.Barrier(parts)
    errors: list[BaseException] = []

    def part(i: int) -> None:
        sink = PostgresSink(dsn, "orders", ["namespace", "key"], f"race.{i}")
        try:
            start.wait()
            sink.write(rows(("n", str(i), b"x", "insert")), "t1")
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)
        finally:
            sink.close()

    threads = [threading.Thread(target=part, args=(i,)) for i in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [r[1] for r in table(dsn, "orders")] == sorted(str(i) for i in range(parts))
