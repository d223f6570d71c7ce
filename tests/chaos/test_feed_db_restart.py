"""The feed through database restarts: three worker threads process items on a private PostgreSQL
while a producer keeps adding partitions; the server is restarted twice (``pg_ctl restart -m
fast``, then a stop with the server down for two seconds before it starts again).

What must hold (the feed's guarantee is at-least-once, never two workers at once):

* the workers reconnect on their own and do not die; each logs at most one warning per outage
  (a worker retrying every 0.1 → 1 s used to log a line per attempt);
* nothing is lost: every item the producer added is complete, and was processed;
* no item is ever in two processors at once, and gates hold (nothing at gate 1 of a partition
  starts before its gate-0 items have all ended).

The server is the module's own (:class:`~sluiceway.testing.PrivatePostgres`): restarting the
shared one would cut every other test's connections.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict

import pytest

from sluiceway.errors import SluicewayError
from sluiceway.feed import Feed, FeedWorker, Item
from sluiceway.testing import PrivatePostgres, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WORKERS = 3
ITEMS = 6  # per partition, at gate 0; every third moves on to gate 1
LEASE = 3.0
DOWN = 2.0  # seconds the server stays stopped in the second outage


class Runs:
    """What the processors actually ran: (item, partition, gate, start, end, thread), in-process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[int, str, int, int, int, str]] = []

    def __call__(self, item: Item) -> dict[str, object]:
        start = time.monotonic_ns()
        time.sleep(0.002)
        end = time.monotonic_ns()
        with self.lock:
            self.runs.append(
                (item.id, item.partition, item.gate, start, end, threading.current_thread().name)
            )
        if item.gate == 0 and item.id % 3 == 0:
            return {"gate": 1, "done": False}
        return {"done": True}


class Producer(threading.Thread):
    """Adds a partition of ``ITEMS`` items every few milliseconds until stopped, through the
    outages: a failed add is retried with ``if_exists="skip"`` (it may have committed), so each
    partition is created exactly once whatever the server did."""

    def __init__(self, feed: Feed) -> None:
        super().__init__(daemon=True, name="producer")
        self.feed = feed
        self.added: list[str] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        for n in itertools.count():
            if self.stopping.is_set():
                return
            name = f"p{n:05d}"
            while True:
                try:
                    self.feed.add(name, [f"{name}/{i}".encode() for i in range(ITEMS)], if_exists="skip")
                    break
                except SluicewayError:
                    self.failures += 1
                    self.stopping.wait(0.05)
            self.added.append(name)
            self.stopping.wait(0.02)


def count(feed: Feed, sql: str) -> int:
    row = feed.db.fetchone(sql.format(p=feed.store.partitions_table, i=feed.store.items_table))
    assert row is not None
    return int(row[0])


def test_workers_ride_through_two_restarts(server: PrivatePostgres, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway")
    dsn = server.dsn()
    feed = Feed(dsn, prefix="restart_")
    runs = Runs()
    workers = [
        FeedWorker(dsn, runs, prefix="restart_", lease=LEASE, batch_size=20, poll_interval=0.05)
        for _ in range(WORKERS)
    ]
    producer = Producer(feed)
    outages: list[tuple[float, float]] = []  # wall-clock start, and how long the restart took
    try:
        for worker in workers:
            worker.start()
        producer.start()
        wait_until(lambda: len(runs.runs) > 200, timeout=30, message="the workers to get going")

        for down in (0.0, DOWN):
            started = time.time()
            server.restart("fast", down=down)
            outages.append((started, time.time() - started))
            before = len(runs.runs)
            wait_until(
                lambda b=before: len(runs.runs) > b + 200, timeout=30, message="work after the restart"
            )
            assert all(w.running for w in workers), "a worker died in the outage"

        producer.stopping.set()
        producer.join(30)
        total = len(producer.added)

        wait_until(
            lambda: count(feed, "SELECT count(*) FROM {p} WHERE status = 'complete'") == total,
            timeout=60,
            message="every partition to complete",
        )
        assert count(feed, "SELECT count(*) FROM {p}") == total
        assert count(feed, "SELECT count(*) FROM {i} WHERE status = 'complete'") == total * ITEMS
        assert count(feed, "SELECT count(*) FROM {i}") == total * ITEMS
        assert all(w.running for w in workers), "a worker died"
    finally:
        producer.stopping.set()
        for worker in workers:
            worker.stop()  # raises what killed a worker, if anything did
        feed.close()

    # Nothing lost: every item of every partition added ran, and ended complete.
    ran = {(item, partition) for item, partition, *_ in runs.runs}
    items_by_partition: dict[str, set[int]] = defaultdict(set)
    for item, partition in ran:
        items_by_partition[partition].add(item)
    assert sorted(items_by_partition) == sorted(producer.added)
    assert all(len(ids) == ITEMS for ids in items_by_partition.values())

    # Never two processors at once on one item; gates hold within each partition.
    by_item: dict[int, list[tuple[int, str, int, int, int, str]]] = defaultdict(list)
    by_partition: dict[str, list[tuple[int, str, int, int, int, str]]] = defaultdict(list)
    for run in runs.runs:
        by_item[run[0]].append(run)
        by_partition[run[1]].append(run)
    repeats = 0
    for item_runs in by_item.values():
        item_runs.sort(key=lambda r: r[3])
        for before, after in itertools.pairwise(item_runs):
            assert after[3] >= before[4], ("overlap", before, after)
            repeats += before[2] == after[2]  # the same gate again: a claim that lapsed
    for part_runs in by_partition.values():
        last_gate0_end = max(r[4] for r in part_runs if r[2] == 0)
        assert all(r[3] >= last_gate0_end for r in part_runs if r[2] == 1), part_runs

    # One warning per outage per worker, at most; and the outages were seen (the test can fail).
    bounds = [start for start, _ in outages] + [float("inf")]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("sluiceway")]
    assert all(r.created >= bounds[0] for r in warnings), [r.getMessage() for r in warnings]
    per_outage_worker: dict[tuple[int, str], list[str]] = defaultdict(list)
    for record in warnings:
        outage = next(i for i in range(len(outages)) if bounds[i] <= record.created < bounds[i + 1])
        owner = next((w.owner for w in workers if w.owner in record.getMessage()), "?")
        per_outage_worker[(outage, owner)].append(record.getMessage())
    assert "?" not in {owner for _, owner in per_outage_worker}, per_outage_worker
    assert all(len(lines) == 1 for lines in per_outage_worker.values()), per_outage_worker
    assert {outage for outage, _ in per_outage_worker} == {0, 1}, "every outage is reported"
    lines = {outage: sum(1 for o, _ in per_outage_worker if o == outage) for outage in (0, 1)}
    print(
        f"\noutages {[f'{took:.2f}s' for _, took in outages]}; {total} partitions, {len(runs.runs)} runs "
        f"({repeats} repeated); producer retries {producer.failures}; workers warning per outage {lines}"
    )
