"""Priorities on every database: items by priority within a gate, partitions by priority when a
worker chooses what to lease, no starvation of a lower priority, older tables migrated, and (on
PostgreSQL) the claim and the free-partition scan read their indexes in order, sorting nothing.

Each test makes tables of its own (the ``prefix`` fixture) in a database the module drops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from sluiceway.cli.feed import app
from sluiceway.db import Database, Dialect
from sluiceway.feed import Feed, FeedError, FeedWorker, Item, NewPartition
from sluiceway.testing import wait_until

pytestmark = pytest.mark.timeout(120)

FAST = {"lease": 2.0, "poll_interval": 0.02, "backoff": 0.05, "max_backoff": 0.2}


def names_of(claimed: list[Any]) -> set[bytes]:
    return {c.data for c in claimed}


def test_items_are_claimed_highest_priority_first_then_in_order_within_a_gate(
    any_dsn: str, prefix: str, feed: Feed
) -> None:
    feed.add("p", [b"a0", b"b0"])
    feed.add_items("p", [b"c5", b"d5"], item_priority=5)
    feed.add_items("p", [b"e-1"], item_priority=-1)
    feed.add_items("p", [b"f5"], item_priority=5)
    feed.add_items("p", [b"g9 at gate 1"], gate=1, item_priority=9)  # a priority never jumps a gate
    store = feed.store
    assert [h.name for h in store.acquire("w1", store.free_partitions(10), lease=30)] == ["p"]
    # Two at a time: which items each claim takes is the order (RETURNING promises no row order).
    assert names_of(store.claim("w1", 2, lease=30)) == {b"c5", b"d5"}
    assert names_of(store.claim("w1", 2, lease=30)) == {b"f5", b"a0"}
    assert names_of(store.claim("w1", 2, lease=30)) == {b"b0", b"e-1"}
    assert store.claim("w1", 2, lease=30) == []  # gate 1 waits for gate 0
    assert [i.priority for i in feed.items("p").rows] == [0, 0, 5, 5, -1, 5, 9]


def test_a_worker_processes_items_by_priority_within_each_gate(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"low-1", b"low-2"], item_priority=-3)
    feed.add_items("p", [b"mid"])
    feed.add_items("p", [b"high"], item_priority=7)
    feed.add_items("p", [b"next gate"], gate=1, item_priority=100)
    seen: list[bytes] = []

    def record(item: Item) -> dict[str, Any]:
        seen.append(item.data)
        return {"done": True}

    # batch_size=1: each claim takes one item, so the processor sees the claims' order.
    FeedWorker(any_dsn, record, prefix=prefix, batch_size=1, **FAST).run_until_idle(timeout=30)  # type: ignore[arg-type]
    assert seen == [b"high", b"mid", b"low-1", b"low-2", b"next gate"]


def test_free_partitions_come_highest_priority_first_expired_leases_among_them(
    any_dsn: str, prefix: str, feed: Feed
) -> None:
    feed.add_many([("low-1", [b"x"]), ("low-2", [b"x"]), ("orphan", [b"x"], 0, None, None, 2)])
    feed.add("high", [b"x"], priority=3)
    feed.add("mid", [b"x"], priority=1)
    store = feed.store
    orphan = next(p for p in store.free_partitions(10) if p.priority == 2)
    store.acquire("gone", [orphan], lease=0.2)  # a worker that then died
    wait_until(lambda: any(p.id == orphan.id for p in store.free_partitions(10)), timeout=10)
    order = {p.id: p for p in (feed.partition(n) for n in ("low-1", "low-2", "orphan", "high", "mid")) if p}
    free = store.free_partitions(10)
    assert [order[p.id].name for p in free] == ["high", "orphan", "mid", "low-1", "low-2"]
    assert [p.priority for p in free] == [3, 2, 1, 0, 0]
    assert [order[p.id].name for p in store.free_partitions(2)] == ["high", "orphan"]


def test_a_worker_choosing_partitions_leases_the_higher_priority_ones_first(
    any_dsn: str, prefix: str, feed: Feed
) -> None:
    # Six other live workers hold one partition each, so this worker's fair share (target) is
    # ceil(13 / 7) = 2 of the 7 free partitions: it must choose, and must choose the two high ones
    # (added last: without priorities they would be the last of a FIFO, or a 1-in-21 random pick).
    for n in range(6):
        feed.add(f"held-{n}")
        store = feed.store
        store.acquire(f"other-{n}", [p for p in store.free_partitions(10) if p.priority == 0][:1], lease=60)
    feed.add_many([NewPartition(f"low-{n}", [b"x"]) for n in range(5)])
    feed.add_many([NewPartition(f"high-{n}", [b"x"], priority=5) for n in range(2)])
    seen: list[str] = []

    def record(item: Item) -> dict[str, Any]:
        seen.append(item.partition)
        return {"done": True}

    FeedWorker(any_dsn, record, prefix=prefix, **FAST).run_until_idle(timeout=30)  # type: ignore[arg-type]
    assert sorted(seen[:2]) == ["high-0", "high-1"], seen
    assert sorted(seen[2:]) == [f"low-{n}" for n in range(5)]


def test_a_low_priority_partition_is_not_starved_by_higher_ones_that_keep_coming(
    any_dsn: str, prefix: str, feed: Feed
) -> None:
    # Overload: a producer adds a high-priority partition every 10 ms (two items each) while the
    # worker manages about one item per 10 ms, so high-priority work is always waiting. A strict
    # priority would never get to the low one while that lasts; the feed leases every free
    # partition up to the workers' fair shares (priority orders, it does not exclude), and takes
    # items partition by partition in the order it leased them, so the low one runs within its
    # first lease. Bound: one lease after it was added.
    lease = 1.5
    stop = threading.Event()
    low_added = threading.Event()
    added_after_low = 0
    processed: dict[str, float] = {}
    lock = threading.Lock()

    def produce() -> None:
        nonlocal added_after_low
        with Feed(any_dsn, prefix=prefix, migrate=False) as producer:
            n = 0
            while not stop.is_set():
                producer.add(f"high-{n}", [b"1", b"2"], priority=10)
                n += 1
                if low_added.is_set():
                    added_after_low += 1
                stop.wait(0.01)

    def slow(item: Item) -> dict[str, Any]:
        time.sleep(0.01)  # the work itself
        with lock:
            processed.setdefault(item.partition, time.monotonic())
        return {"done": True}

    producer = threading.Thread(target=produce, daemon=True)
    options = {**FAST, "lease": lease, "batch_size": 4}
    with FeedWorker(any_dsn, slow, prefix=prefix, **options):  # type: ignore[arg-type]
        producer.start()
        try:
            wait_until(lambda: len(processed) >= 3, timeout=20, message="the worker to be busy")
            added = time.monotonic()
            feed.add("low", [b"patient"], priority=0)
            low_added.set()
            wait_until(lambda: "low" in processed, timeout=10 * lease, message="the low-priority partition")
            waited = processed["low"] - added
        finally:
            stop.set()
            producer.join(timeout=30)
        open_highs = feed.status().items.get("available", 0)
    print(f"waited {waited:.3f}s, {added_after_low} high partitions added after it, {open_highs} open")
    assert waited <= lease, f"the low-priority partition waited {waited:.2f}s (lease {lease}s)"
    # The pressure was real: high-priority work kept coming and was still waiting (else the low
    # one would have run in a lull, and the test would show nothing).
    assert added_after_low >= 5 and open_highs > 0, (added_after_low, open_highs)


def test_priorities_are_validated(feed: Feed) -> None:
    for bad in (1.5, "1", True, 2**31, -(2**31) - 1):
        with pytest.raises(FeedError):
            feed.add("p", [b"x"], priority=bad)  # type: ignore[arg-type]
        with pytest.raises(FeedError):
            feed.add("p", [b"x"], item_priority=bad)  # type: ignore[arg-type]
    assert feed.partition("p") is None
    feed.add("p", [b"x"], priority=2**31 - 1, item_priority=-(2**31))
    p = feed.partition("p")
    assert p is not None and p.priority == 2**31 - 1
    assert [i.priority for i in feed.items("p").rows] == [-(2**31)]


# -- older tables ------------------------------------------------------------------------------
#: Make tables look as they did before priorities: no priority columns, the open index back.
_UNDO = {
    Dialect.POSTGRES: [
        "ALTER TABLE {p}partitions DROP COLUMN priority",
        "ALTER TABLE {p}items DROP COLUMN priority",
        "CREATE INDEX {p}items_open_idx ON {p}items (partition_id, gate, id) WHERE status = 'available'",
    ],
    Dialect.SQLITE: [
        "DROP INDEX {p}partitions_ready_idx",
        "DROP INDEX {p}items_claim_idx",
        "ALTER TABLE {p}partitions DROP COLUMN priority",
        "ALTER TABLE {p}items DROP COLUMN priority",
        "CREATE INDEX {p}items_open_idx ON {p}items (partition_id, gate, id) WHERE status = 'available'",
    ],
    Dialect.MYSQL: [
        "ALTER TABLE {p}partitions DROP INDEX {p}partitions_ready_idx, DROP COLUMN priority",
        "ALTER TABLE {p}items ADD INDEX {p}items_open_idx (partition_id, status, gate, id),"
        " DROP INDEX {p}items_claim_idx, DROP COLUMN priority",
    ],
}


def _indexes(db: Database, prefix: str) -> set[str]:
    if db.dialect is Dialect.POSTGRES:
        sql = "SELECT indexname FROM pg_indexes WHERE tablename LIKE %(t)s"
    elif db.dialect is Dialect.SQLITE:
        sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name LIKE :t"
    else:
        sql = (
            "SELECT DISTINCT index_name FROM information_schema.statistics"
            " WHERE table_schema = DATABASE() AND table_name LIKE %(t)s"
        )
    return {str(r[0]) for r in db.fetchall(sql, {"t": f"{prefix}%"})}


def test_tables_from_before_priorities_get_them_with_default_0(any_dsn: str, prefix: str) -> None:
    with Feed(any_dsn, prefix=prefix) as feed:
        feed.add("old", [b"first", b"second"])
        for statement in _UNDO[feed.db.dialect]:
            feed.db.execute(statement.format(p=prefix))
        assert f"{prefix}items_claim_idx" not in _indexes(feed.db, prefix)
    with Feed(any_dsn, prefix=prefix) as feed:  # migrates
        indexes = _indexes(feed.db, prefix)
        assert {f"{prefix}items_claim_idx", f"{prefix}partitions_ready_idx"} <= indexes, indexes
        assert f"{prefix}items_open_idx" not in indexes
        old = feed.partition("old")
        assert old is not None and old.priority == 0
        assert [(i.data, i.priority) for i in feed.items("old").rows] == [(b"first", 0), (b"second", 0)]
        feed.add_items("old", [b"urgent"], item_priority=1)
        feed.migrate()  # and again: idempotent
        seen: list[bytes] = []

        def record(item: Item) -> dict[str, Any]:
            seen.append(item.data)
            return {"done": True}

        FeedWorker(any_dsn, record, prefix=prefix, batch_size=1, **FAST).run_until_idle(timeout=30)  # type: ignore[arg-type]
        assert seen == [b"urgent", b"first", b"second"]


# -- the CLI -----------------------------------------------------------------------------------
def test_cli_add_priority_and_item_priority(any_dsn: str, prefix: str, feed: Feed) -> None:
    runner = CliRunner()
    base = ["add", "--dsn", any_dsn, "--prefix", prefix, "-p", "urgent"]
    result = runner.invoke(app, [*base, "-i", "a", "--priority", "10", "--item-priority", "5"])
    assert result.exit_code == 0, result.output
    assert "priority 10, item priority 5" in result.output
    result = runner.invoke(app, [*base, "-i", "b", "--item-priority", "-2"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, [*base, "-i", "c", "--priority", "3"])
    assert result.exit_code == 1 and "--priority only applies when creating it" in result.output
    p = feed.partition("urgent")
    assert p is not None and p.priority == 10
    assert [(i.data, i.priority) for i in feed.items("urgent").rows] == [(b"a", 5), (b"b", -2)]
    listing = runner.invoke(app, ["partitions", "--dsn", any_dsn, "--prefix", prefix])
    assert listing.exit_code == 0 and "priority" in listing.output, listing.output
    status = runner.invoke(app, ["status", "--dsn", any_dsn, "--prefix", prefix])
    assert status.exit_code == 0 and "open work by priority" in status.output, status.output


# -- the plans (PostgreSQL) ---------------------------------------------------------------------
def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plan(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> dict[str, Any]:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def test_the_claim_and_the_free_scan_read_priority_indexes_in_order_on_postgres(
    postgres_dsn: str, prefix: str
) -> None:
    with Feed(postgres_dsn, prefix=prefix) as feed:
        parts, items = feed.store.partitions_table, feed.store.items_table
        claim, free = feed.store.q["claim"], feed.store.q["free_partitions"]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        # 2,000 partitions (20 held by "w", the rest free, five priorities), 200 of them with 200
        # items each (three item priorities, a quarter finished): enough rows that a sort or a
        # sequential scan would be the planner's choice if the indexes could not give the order.
        # (With a handful of open items per partition the planner may rather fetch one partition's
        # few items and sort them: cheaper, and bounded by that partition, not the table.)
        conn.execute(
            f"INSERT INTO {parts} (name, priority, owner, lease_until)"
            " SELECT 'p' || g, g % 5, CASE WHEN g <= 20 THEN 'w' END,"
            "        CASE WHEN g <= 20 THEN now() + interval '1 hour' ELSE 'epoch' END"
            " FROM generate_series(1, 2000) AS g"
        )
        conn.execute(
            f"INSERT INTO {items} (partition_id, data, priority, status)"
            f" SELECT p.id, '\\x00', g % 3, CASE WHEN g % 4 = 0 THEN 'complete' ELSE 'available' END"
            f" FROM {parts} AS p, generate_series(1, 200) AS g WHERE p.id <= 200"
        )
        conn.execute(f"ANALYZE {parts}")
        conn.execute(f"ANALYZE {items}")
        claim_plan = _plan(conn, claim, {"owner": "w", "limit": 100, "lease": 30.0})
        free_plan = _plan(conn, free, {"limit": 100})
    nodes = list(_nodes(claim_plan))
    scans = {
        (n["Node Type"], n.get("Index Name"), n.get("Relation Name")) for n in nodes if "Relation Name" in n
    }
    assert ("Index Scan", f"{prefix}items_claim_idx", f"{prefix}items") in scans, scans
    unwanted = ("Sort", "Incremental Sort", "Seq Scan", "Bitmap Heap Scan")
    assert not [n["Node Type"] for n in nodes if n["Node Type"] in unwanted], claim_plan
    # The free scan: the ready index in order; the only sort merges two LIMITed branches.
    nodes = list(_nodes(free_plan))
    used = {n.get("Index Name") for n in nodes}
    assert f"{prefix}partitions_ready_idx" in used, used
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")], free_plan
    for sort in (n for n in nodes if n["Node Type"] == "Sort"):
        assert [c["Node Type"] for c in sort["Plans"]] == ["Limit"], free_plan
