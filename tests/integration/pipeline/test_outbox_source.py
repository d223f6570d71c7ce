"""The outbox source's MP/R bookkeeping on every dialect, driven the way Spark drives it.

No JVM here: the reader's methods are called directly (Spark only ever calls them in this
order), which lets the test "restart the driver" between any two calls.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.errors import LeadershipError
from sluiceway.outbox import init_outbox
from sluiceway.pipeline.sources.outbox import OutboxStreamReader
from tests.support.outbox import user_connection


def stash(dsn: str, records: list[tuple[str, int]]) -> None:
    conn = user_connection(dsn)
    stasher = Stasher().prepare(conn)
    for key, seq in records:
        stasher.stash(OutboxRecord("orders", key, json.dumps({"seq": seq}), [("h", "v")]))
    conn.commit()
    conn.close()


@pytest.fixture
def outbox(any_dsn: str) -> str:
    with Database(any_dsn) as db:
        init_outbox(db)
        for t in ("outbox", "outbox_dead", "outbox_spark_claims", "outbox_spark_cursor", "sluiceway_leases"):
            with contextlib.suppress(Exception):  # not created yet
                db.execute(f"DELETE FROM {t}")
    return any_dsn


def reader(dsn: str, **opts: Any) -> OutboxStreamReader:
    return OutboxStreamReader({"dsn": dsn, "leaseTtl": "2", "leaseTimeout": "10", **opts})


def rows_of(r: OutboxStreamReader, start: dict[str, int], end: dict[str, int]) -> list[tuple[str, int]]:
    out = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            out.extend(
                (k, json.loads(v)["seq"])
                for k, v in zip(
                    batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True
                )
            )
    return out


def count(dsn: str, table: str) -> int:
    with Database(dsn) as db:
        row = db.fetchone(f"SELECT count(*) FROM {table}")
    return int(row[0]) if row else -1


def test_batches_replay_identically_until_committed_then_purge(outbox: str) -> None:
    stash(outbox, [(f"k{i % 3}", i) for i in range(10)])
    r = reader(outbox, numPartitions="2")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(4))
        assert end == {"batch": start["batch"] + 1}
        first = rows_of(r, start, end)
        assert sorted(s for _, s in first) == [0, 1, 2, 3]
        # Spark asks again for the same start (say it crashed before logging the batch): same batch.
        assert r.latestOffset(start, ReadMaxRows(4)) == end
        assert rows_of(r, start, end) == first
        schema_ok = next(b for part in r.partitions(start, end) for b in r.read(part))
        assert schema_ok.column("namespace").to_pylist()[0] == "orders"
        assert schema_ok.column("headers").to_pylist()[0] == [{"key": "h", "value": "v"}]
    finally:
        r.stop()

    # A new driver (fresh reader, same checkpoint start): still the same rows for that batch.
    r2 = reader(outbox, numPartitions="2")
    try:
        assert r2.latestOffset(start, ReadMaxRows(4)) == end
        assert sorted(rows_of(r2, start, end)) == sorted(first)
        r2.commit(end)
        assert count(outbox, "outbox") == 6
        nxt = r2.latestOffset(end, ReadAllAvailable())
        rest = rows_of(r2, end, nxt)
        assert sorted(s for _, s in rest) == list(range(4, 10))
        r2.commit(nxt)
        assert count(outbox, "outbox") == 0 and count(outbox, "outbox_spark_claims") == 0
        assert r2.latestOffset(nxt, ReadMaxRows(4)) == nxt  # nothing new
    finally:
        r2.stop()


def test_per_key_order_within_and_across_batches(outbox: str) -> None:
    stash(outbox, [(f"k{i % 5}", i // 5) for i in range(60)])
    r = reader(outbox, numPartitions="3")
    seen: dict[str, list[int]] = {}
    try:
        start = r.initialOffset()
        while True:
            end = r.latestOffset(start, ReadMaxRows(7))
            if end == start:
                break
            for key, seq in rows_of(r, start, end):
                seen.setdefault(key, []).append(seq)
            r.commit(end)
            start = end
    finally:
        r.stop()
    assert seen == {f"k{k}": list(range(12)) for k in range(5)}


def test_a_fresh_checkpoint_replays_claims_left_behind(outbox: str) -> None:
    stash(outbox, [("a", 1), ("a", 2), ("b", 1)])
    r = reader(outbox)
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(2))  # claimed, then the checkpoint is lost
    finally:
        r.stop()
    fresh = reader(outbox)
    try:
        begin = fresh.initialOffset()  # from the database's cursor, not from Spark
        assert begin == start
        assert fresh.latestOffset(begin, ReadMaxRows(100)) == end  # the orphaned claim first
        assert sorted(rows_of(fresh, begin, end)) == [("a", 1), ("a", 2)]
    finally:
        fresh.stop()


def test_available_now_stops_at_the_rows_present_when_it_started(outbox: str) -> None:
    stash(outbox, [("a", 1), ("a", 2)])
    r = reader(outbox)
    try:
        r.prepareForTriggerAvailableNow()
        start = r.initialOffset()
        stash(outbox, [("a", 3)])  # arrives after the run began
        end = r.latestOffset(start, ReadAllAvailable())
        assert [s for _, s in rows_of(r, start, end)] == [1, 2]
        r.commit(end)
        assert r.latestOffset(end, ReadAllAvailable()) == end
    finally:
        r.stop()


def test_only_one_query_claims_from_an_outbox(outbox: str) -> None:
    stash(outbox, [("a", 1)])
    leader = reader(outbox)
    other = reader(outbox, leaseTimeout="0.5")
    try:
        start = leader.initialOffset()
        end = leader.latestOffset(start, ReadMaxRows(10))
        assert end != start
        stash(outbox, [("a", 2)])
        # the other query sees the claimed batch (a replay is harmless) but may not claim more
        assert other.latestOffset(end, ReadMaxRows(10)) == end
        other.prepareForTriggerAvailableNow()
        with pytest.raises(LeadershipError, match="another query holds the lease"):
            other.latestOffset(end, ReadMaxRows(10))
    finally:
        other.stop()
        leader.stop()
