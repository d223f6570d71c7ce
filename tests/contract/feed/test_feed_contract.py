"""The feed on every database (SQLite, PostgreSQL, MariaDB): one suite, same behaviour."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from sluiceway.feed import (
    Feed,
    FeedError,
    FeedWorker,
    GateError,
    Item,
    NewPartition,
    PartitionClosedError,
    PartitionExistsError,
    PartitionNotFoundError,
    ProcessorResult,
    Status,
)

FAST = {"lease": 2.0, "poll_interval": 0.02, "backoff": 0.05, "max_backoff": 0.2}


def worker(dsn: str, prefix: str, fn, **kwargs: object) -> FeedWorker:  # type: ignore[no-untyped-def]
    return FeedWorker(dsn, fn, prefix=prefix, **{**FAST, **kwargs})  # type: ignore[arg-type]


def all_items(feed: Feed, partition: str) -> list:  # type: ignore[type-arg]
    rows, after = [], 0
    while True:
        page = feed.items(partition, after=after, limit=2)
        rows += page.rows
        if page.next_after is None:
            return rows
        after = page.next_after


def test_migration_is_idempotent(any_dsn: str, prefix: str) -> None:
    for _ in range(2):
        with Feed(any_dsn, prefix=prefix) as f:
            f.migrate()
    with Feed(any_dsn, prefix=prefix, migrate=False) as f:
        assert f.status().items == {}


def test_add_creates_a_partition_with_its_items(feed: Feed) -> None:
    pid = feed.add("folder", [b"a", "b", {"c": 1}], gate=1, attributes={"team": "x"})
    p = feed.partition("folder")
    assert p is not None and p.id == pid
    assert (p.status, p.gate, p.owner, p.lease_until, dict(p.attributes)) == (
        Status.AVAILABLE, 1, None, None, {"team": "x"}
    )  # fmt: skip
    items = all_items(feed, "folder")
    assert [i.data for i in items] == [b"a", b"b", b'{"c":1}']
    assert {(i.gate, i.status, i.attempts, i.version) for i in items} == {(1, Status.AVAILABLE, 0, 0)}


def test_add_many_is_all_or_nothing(feed: Feed) -> None:
    feed.add("taken", [b"x"])
    with pytest.raises(PartitionExistsError):
        feed.add_many([NewPartition("first", [b"1"]), ("taken", [b"2"])])
    assert feed.partition("first") is None
    assert len(all_items(feed, "taken")) == 1
    with pytest.raises(FeedError):
        feed.add_many([("dup", []), ("dup", [])])


def test_if_exists_skip_and_append(feed: Feed) -> None:
    first = feed.add("p", [b"1"])
    assert feed.add("p", [b"2"], if_exists="skip") == first
    assert feed.add("p", [b"3"], gate=2, if_exists="append") == first
    assert [(i.data, i.gate) for i in all_items(feed, "p")] == [(b"1", 0), (b"3", 2)]


def test_add_items_respects_the_gate(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"g0"])
    assert feed.add_items("p", [b"more"]) == 1  # default: the current gate
    assert feed.add_items("p", [b"later"], 3) == 1
    with pytest.raises(PartitionNotFoundError):
        feed.add_items("nope", [b"x"], 0)
    worker(any_dsn, prefix, lambda item: {"done": True}, manual_checkpoint=True).run_until_idle(timeout=30)
    assert feed.checkpoint("p").gate == 3  # the next gate that has items
    with pytest.raises(GateError) as info:
        feed.add_items("p", [b"too late"], 1)
    assert (info.value.partition, info.value.gate) == ("p", 1)
    assert feed.partition("p").gate == 3  # type: ignore[union-attr]
    feed.resolve("p")  # nothing failed: no-op
    stats = worker(any_dsn, prefix, lambda item: {"done": True}).run_until_idle(timeout=30)
    assert stats.partitions_completed == 1
    with pytest.raises(PartitionClosedError):
        feed.add_items("p", [b"x"], 9)


def test_gates_fan_in_in_order(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("a", [b"a0-1", b"a0-2", b"a0-3"])
    feed.add_items("a", [b"a1-1", b"a1-2"], 1)
    feed.add("b", [b"b0-1"], gate=4)
    calls: list[tuple[str, int, bytes]] = []

    def fn(item: Item) -> object:
        calls.append((item.partition, item.gate, item.data))
        if item.data == b"a0-1":  # one item fans out to a later step
            return ProcessorResult(gate=2, done=False, data=b"a0-1 step 2")
        return {"done": True, "data": item.data + b" done"}

    stats = worker(any_dsn, prefix, fn, batch_size=2).run_until_idle(timeout=30)
    gates_of_a = [g for p, g, _ in calls if p == "a"]
    assert gates_of_a == sorted(gates_of_a) == [0, 0, 0, 1, 1, 2]
    assert (stats.completed, stats.moved, stats.partitions_completed, stats.gates_advanced) == (6, 1, 2, 2)
    a = feed.partition("a")
    assert a is not None and (a.status, a.gate, a.owner) == (Status.COMPLETE, 2, None)
    done = {i.data for i in all_items(feed, "a")}
    assert b"a0-1 step 2 done" in done and b"a1-2 done" in done
    assert feed.status().items == {"complete": 6}


def test_failures_retry_with_backoff_then_block_until_retried(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"ok", b"bad"])
    feed.add_items("p", [b"next"], 1)
    attempts: dict[bytes, list[int]] = defaultdict(list)
    healthy = threading.Event()

    def fn(item: Item) -> object:
        attempts[item.data].append(item.attempt)
        if item.data == b"bad" and not healthy.is_set():
            raise RuntimeError("downstream unavailable")
        return {"done": True}

    stats = worker(any_dsn, prefix, fn, max_attempts=3).run_until_idle(timeout=30)
    assert attempts[b"bad"] == [1, 2, 3] and b"next" not in attempts  # the gate stays shut
    assert (stats.retried, stats.failed, stats.partitions_failed) == (2, 1, 1)
    p = feed.partition("p")
    assert p is not None and (p.status, p.gate) == (Status.FAILED, 0)
    bad = next(i for i in all_items(feed, "p") if i.data == b"bad")
    assert bad.status is Status.FAILED and "downstream unavailable" in (bad.last_error or "")
    with pytest.raises(GateError):
        feed.checkpoint("p")

    healthy.set()
    assert feed.retry("p") == 1
    assert feed.partition("p").status is Status.AVAILABLE  # type: ignore[union-attr]
    worker(any_dsn, prefix, fn, max_attempts=3).run_until_idle(timeout=30)
    assert attempts[b"bad"] == [1, 2, 3, 1] and attempts[b"next"] == [1]
    assert feed.partition("p").status is Status.COMPLETE  # type: ignore[union-attr]


def test_resolve_unblocks_the_gate(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"poison"])
    feed.add_items("p", [b"after"], 1)
    seen: list[bytes] = []

    def fn(item: Item) -> object:
        seen.append(item.data)
        if item.data == b"poison":
            raise ValueError("cannot parse")
        return {"done": True}

    worker(any_dsn, prefix, fn, max_attempts=1).run_until_idle(timeout=30)
    item_id = all_items(feed, "p")[0].id
    assert feed.resolve(item=item_id) == 1
    assert feed.resolve(item=item_id) == 0
    worker(any_dsn, prefix, fn, max_attempts=1).run_until_idle(timeout=30)
    assert seen == [b"poison", b"after"]
    results = {i.data: i.result for i in all_items(feed, "p")}
    assert results == {b"poison": "resolved", b"after": "done"}


def test_manual_checkpoint_leaves_gates_to_the_caller(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"x"])
    feed.add_items("p", [b"y"], 1)
    fn = lambda item: {"done": True}  # noqa: E731
    stats = worker(any_dsn, prefix, fn, manual_checkpoint=True).run_until_idle(timeout=30)
    assert stats.completed == 1 and stats.gates_advanced == 0
    assert feed.partition("p").gate == 0  # type: ignore[union-attr]
    assert feed.checkpoint("p").gate == 1
    with pytest.raises(GateError, match="still has items"):
        feed.checkpoint("p")
    worker(any_dsn, prefix, fn, manual_checkpoint=True).run_until_idle(timeout=30)
    # Nothing after gate 1: checkpointing closes the partition; a later one is a no-op.
    assert feed.checkpoint("p").status is Status.COMPLETE
    assert feed.checkpoint("p").status is Status.COMPLETE


def test_claims_are_versioned_and_leased(any_dsn: str, prefix: str, feed: Feed) -> None:
    store = feed.store
    feed.add("p", [b"1", b"2", b"3"])
    got = store.acquire("w1", store.free_partitions(10), lease=30)
    assert [h.name for h in got] == ["p"]
    assert store.acquire("w2", [(got[0].id, 0)], lease=30) == []  # stale version: lost the race
    batch = store.claim("w1", 2, lease=30)
    assert len(batch) == 2 and {c.attempts for c in batch} == {1}
    assert store.claim("w2", 10, lease=30) == []  # w2 holds no partition
    # Items claimed by w1 are hidden from w1's next claim too, until the claim lease lapses.
    rest = store.claim("w1", 10, lease=30)
    assert [c.data for c in rest] == [b"3"]

    from sluiceway.feed.core import ProcessorResult as R
    from sluiceway.feed.core import requeue_outcome, success_outcome

    outcome = success_outcome(batch[0], R(done=True))
    stale = outcome._replace(version=outcome.version - 1)
    assert store.complete([stale]) == 0
    assert store.complete([outcome, outcome]) == 1  # the second write sees the bumped version
    assert store.complete([requeue_outcome(batch[1])]) == 1
    again = store.claim("w1", 10, lease=30)
    assert [(c.id, c.attempts) for c in again] == [(batch[1].id, 1)]


def test_leases_expire_by_the_database_clock_and_can_be_stolen(any_dsn: str, prefix: str, feed: Feed) -> None:
    from sluiceway.testing import wait_until

    store = feed.store
    for name in ("p1", "p2", "p3"):
        feed.add(name, [b"x"])
    held = store.acquire("w1", store.free_partitions(2), lease=0.3)
    assert len(held) == 2 and store.census().owners == {"w1": 2}
    assert store.renew("w1", 0.3) == {h.id for h in held}
    wait_until(lambda: store.census().owners == {}, timeout=10, message="leases to expire")
    assert len(store.free_partitions(10)) == 3
    # Expired but not yet taken: the owner may still renew them.
    assert store.renew("w1", 30) == {h.id for h in held}
    victim = store.victim_partition("w1")
    assert victim is not None
    assert store.steal("w2", victim[0], victim[1] - 1, lease=30) == []
    assert [h.id for h in store.steal("w2", victim[0], victim[1], lease=30)] == [victim[0]]
    assert store.renew("w1", 30) == {h.id for h in held} - {victim[0]}
    assert store.release("w1", [h.id for h in held]) == 1  # only what it still owns
    assert store.census().owners == {"w2": 1}


def test_two_workers_share_the_work(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add_many([NewPartition(f"p{i}", [f"{i}-{j}".encode() for j in range(5)]) for i in range(6)])
    lock = threading.Lock()
    active: set[int] = set()
    done: list[int] = []
    overlaps: list[int] = []

    def fn(item: Item) -> object:
        with lock:
            if item.id in active:
                overlaps.append(item.id)
            active.add(item.id)
        with lock:
            active.discard(item.id)
            done.append(item.id)
        return {"done": True}

    w1 = worker(any_dsn, prefix, fn, batch_size=3).start()
    w2 = worker(any_dsn, prefix, fn, batch_size=3, concurrency=3).start()
    try:
        from sluiceway.testing import wait_until

        wait_until(lambda: feed.status().items.get("complete") == 30, timeout=30, message="all items")
    finally:
        w1.stop()
        w2.stop()
    assert sorted(done) == sorted(set(done)) and len(done) == 30 and overlaps == []
    assert w1.stats.completed + w2.stats.completed == 30
    assert feed.status().workers == []  # both released their leases on stop


def test_listings_are_paged(feed: Feed) -> None:
    feed.add_many([(f"p{i}", [b"x"]) for i in range(5)])
    page = feed.partitions(limit=2)
    names = [p.name for p in page.rows]
    while page.next_after is not None:
        page = feed.partitions(after=page.next_after, limit=2)
        names += [p.name for p in page.rows]
    assert names == [f"p{i}" for i in range(5)]
    assert [p.name for p in feed.partitions("available", limit=10).rows] == names
    assert feed.partitions(Status.COMPLETE).rows == []
    with pytest.raises(FeedError):
        feed.partitions(limit=100_000)


def test_status_counts_lag_and_workers(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"1", b"2"])
    feed.add("q", [b"3"], gate=2)
    s = feed.status()
    assert sorted(s.partitions) == [("available", 0, 1), ("available", 2, 1)]
    assert s.items == {"available": 3} and s.ready_items == 3
    assert s.items_by_gate == [("available", 0, 2), ("available", 2, 1)]
    assert s.oldest_available_age is not None and s.oldest_available_age >= 0
    feed.store.acquire("w9", feed.store.free_partitions(1), lease=30)
    (w,) = feed.status().workers
    assert (w.owner, w.partitions, w.live, w.expired) == ("w9", 1, True, 0)


def test_status_counts_expired_leases_per_worker(any_dsn: str, prefix: str, feed: Feed) -> None:
    from sluiceway.testing import wait_until

    feed.add_many([("p1", [b"x"]), ("p2", [b"x"]), ("p3", [b"x"])])
    feed.store.acquire("gone", feed.store.free_partitions(2), lease=0.3)
    feed.store.acquire("alive", feed.store.free_partitions(1), lease=30)

    def expired() -> dict[str, tuple[int, int, bool]]:
        return {w.owner: (w.partitions, w.expired, w.live) for w in feed.status().workers}

    wait_until(
        lambda: expired().get("gone") == (2, 2, False), timeout=10, message="the short leases to lapse"
    )
    assert expired()["alive"] == (1, 0, True)


class SteppedClock:
    """A monotonic clock the test moves by hand (the worker only measures intervals with it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_items_not_started_in_time_are_handed_back(any_dsn: str, prefix: str, feed: Feed) -> None:
    feed.add("p", [b"1", b"2", b"3"])
    clock = SteppedClock()
    seen: list[bytes] = []

    def slow(item: Item) -> object:
        seen.append(item.data)
        clock.now += 1.5  # more than half the 2 s claim lease: the rest of the batch must not start
        return {"done": True}

    w = worker(any_dsn, prefix, slow, clock=clock)
    stats = w.run_until_idle(timeout=60)
    # Each claim ran one item and handed the others back unstarted, without counting an attempt.
    assert sorted(seen) == [b"1", b"2", b"3"] and len(seen) == 3
    assert stats.completed == 3 and stats.requeued >= 2
    assert {i.attempts for i in all_items(feed, "p")} == {1}


def test_stop_hands_back_queued_items(any_dsn: str, prefix: str, feed: Feed) -> None:
    from sluiceway.testing import wait_until

    feed.add("p", [str(i).encode() for i in range(8)])
    gate = threading.Event()
    started: list[int] = []

    def blocking(item: Item) -> object:
        started.append(item.id)
        gate.wait(10)
        return {"done": True}

    w = worker(any_dsn, prefix, blocking, concurrency=2, batch_size=8).start()
    wait_until(lambda: len(started) == 2, timeout=10, message="two items in the processors")
    w.request_stop()
    gate.set()
    w.stop()
    stats = w.stats
    assert stats.completed == 2 and stats.requeued == 6 and len(started) == 2
    items = all_items(feed, "p")
    assert sum(i.status is Status.COMPLETE for i in items) == 2
    # Handed back: claimable again at once, the claim's attempt undone.
    assert {i.attempts for i in items if i.status is Status.AVAILABLE} == {0}
    assert feed.status().ready_items == 6
    assert feed.status().workers == []


def test_run_until_idle_times_out_while_work_keeps_failing(any_dsn: str, prefix: str, feed: Feed) -> None:
    from sluiceway.feed import FeedTimeout

    feed.add("p", [b"x"])

    def always_fails(item: Item) -> object:
        raise RuntimeError("no")

    with pytest.raises(FeedTimeout):
        worker(any_dsn, prefix, always_fails, max_attempts=1000).run_until_idle(timeout=0.5)
    assert feed.status().workers == []  # leases released even so


def test_concurrent_takes_never_deadlock_and_never_share_a_partition(any_dsn: str, prefix: str) -> None:
    """Workers take random, overlapping parts of the free page at the same moment (as balancing
    does). Each partition goes to exactly one of them, and no take fails: takes lock rows in id
    order and skip rows another take holds, so they cannot wait on each other in a cycle."""
    import random

    from sluiceway.db import Database
    from sluiceway.errors import DatabaseError
    from sluiceway.feed.store import FeedStore

    with Feed(any_dsn, prefix=prefix) as f:
        f.add_many(NewPartition(f"p{i:03d}", [b"x"]) for i in range(60))
    rounds, takers = 15, 6
    errors: list[BaseException] = []
    won: dict[int, list[str]] = defaultdict(list)
    barrier = threading.Barrier(takers)

    def take(n: int) -> None:
        rng = random.Random(n)
        owner = f"taker-{n}"
        with Database(any_dsn) as db:
            store = FeedStore(db, prefix)
            for r in range(rounds):
                barrier.wait()
                try:
                    free = store.free_partitions(60)
                    got = store.acquire(owner, rng.sample(free, min(len(free), 20)), 30.0)
                    for held in got:
                        won[held.id].append(f"{owner}#{r}")
                except DatabaseError as exc:
                    errors.append(exc)
                barrier.wait()
                if n == 0:  # between rounds, everything is handed back
                    with Database(any_dsn) as admin:
                        admin.execute(
                            f"UPDATE {store.partitions_table} SET owner = NULL, "
                            "lease_until = '1970-01-01 00:00:00', version = version + 1"
                        )
                barrier.wait()

    threads = [threading.Thread(target=take, args=(n,)) for n in range(takers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    for pid, owners in won.items():
        per_round = defaultdict(list)
        for o in owners:
            per_round[o.split("#")[1]].append(o)
        assert all(len(v) == 1 for v in per_round.values()), (pid, owners)
