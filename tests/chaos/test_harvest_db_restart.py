"""The harvester with the database lease through database restarts, on a private PostgreSQL (the
shared server is never restarted) and into a journal: a producer stashes steadily while the
server is restarted twice — ``pg_ctl restart -m fast`` (a fraction of a second), then stopped for
longer than the lease (so the lease lapses and must be won again).

What must hold:

* nothing lost, per-key order kept (repeats collapsed: a re-mark after a failed call may re-send);
* the lease is re-acquired after it lapsed, and the harvester drains the outbox;
* each of the harvester's threads that meets an outage (marker, purger, lease) warns once per
  outage, not once per attempt (they retried every 200 ms and logged every retry); the lapse of
  the lease, and a purge given up as a fenced term ends, are one line more each.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, HarvestConfig, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.errors import SluicewayError
from sluiceway.harvest import LeaderAcquired
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.testing import PrivatePostgres, wait_until
from tests.support.harvest import Recorder, started
from tests.support.order import check_per_key_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KEYS = 20
LEASE = 2.0  # the harvester fences itself 1.6 s into an outage (safety 0.8)
DOWN = 3.0  # the second outage: longer than the lease


class Producer(threading.Thread):
    """Stashes one record per transaction over ``KEYS`` keys, each carrying its key's sequence
    number, through the outages. A failed commit may have committed: the same record is stashed
    again, so a key's stream may hold a repeat (``3 3``, collapsed by the order check) but no gap."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True, name="producer")
        self.dsn = dsn
        self.sent: dict[str, int] = defaultdict(int)
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[object] | None = None
        n = 0
        while not self.stopping.is_set():
            key = f"key-{n % KEYS}"
            record = OutboxRecord("orders", key, json.dumps({"seq": self.sent[key] + 1}))
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, connect_timeout=2)
                Stasher().prepare(conn).stash(record)
                conn.commit()
            except (SluicewayError, psycopg.Error):
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stopping.wait(0.05)
                continue
            self.sent[key] += 1
            n += 1
            self.stopping.wait(0.002)
        if conn is not None:
            conn.close()


def outbox_rows(dsn: str) -> int:
    with Database(dsn) as db:
        row = db.fetchone("SELECT count(*) FROM outbox")
        return int(row[0]) if row else -1


def test_harvester_rides_through_two_restarts(
    server: PrivatePostgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway")
    dsn = server.dsn()
    with Database(dsn) as db:
        init_outbox(db)
    journal = tmp_path / "journal"
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": dsn,
                "journal": {"path": str(journal)},
                "election": {"kind": "database", "leaseTimeout": f"{LEASE:g}s"},
                "limits": {"ioErrorBackoff": "200ms", "minMetricsInterval": "600s"},
            }
        }
    )
    recorder = Recorder()
    harvest = started(Harvest(config), recorder)
    producer = Producer(dsn)
    outages: list[tuple[float, float]] = []  # wall-clock start, and how long the restart took
    try:
        wait_until(lambda: recorder.of(LeaderAcquired), timeout=30, message="leadership")
        producer.start()
        wait_until(lambda: sum(producer.sent.values()) > 300, timeout=30, message="the producer to get going")
        for down in (0.0, DOWN):
            acquired = len(recorder.of(LeaderAcquired))
            started_at = time.time()
            server.restart("fast", down=down)
            outages.append((started_at, time.time() - started_at))
            sent = sum(producer.sent.values())
            wait_until(
                lambda s=sent: sum(producer.sent.values()) > s + 300, timeout=30, message="producing again"
            )
            if down > LEASE:
                wait_until(
                    lambda a=acquired: len(recorder.of(LeaderAcquired)) > a,
                    timeout=30,
                    message="the lease to be won again",
                )
        producer.stopping.set()
        producer.join(30)
        wait_until(lambda: outbox_rows(dsn) == 0, timeout=60, message="the outbox to drain")
        assert harvest.is_leader
    finally:
        producer.stopping.set()
        harvest.stop()

    with Journal.open(journal, read_only=True) as reader:
        records = [(r.key, json.loads(r.value)["seq"]) for r in reader.read()]  # type: ignore[arg-type]
    duplicates = check_per_key_order(records, producer.sent)  # nothing lost, per-key order
    total = sum(producer.sent.values())

    bounds = [start for start, _ in outages] + [float("inf")]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("sluiceway")]
    assert all(r.created >= bounds[0] for r in warnings), [r.getMessage() for r in warnings]
    lines: dict[tuple[int, str], list[str]] = defaultdict(list)
    for record in warnings:
        outage = next(i for i in range(len(outages)) if bounds[i] <= record.created < bounds[i + 1])
        # Two more events an outage may cause, one line each: the lease lapsing, and a term that
        # ends (fenced) with a purge still failing, leaving its rows marked for the next term.
        message = record.getMessage()
        what = (
            "lease lost"
            if " lost by this process " in message
            else "purge given up"
            if message.startswith("giving up purging")
            else record.threadName
        )
        lines[(outage, what)].append(record.getMessage())
    assert all(len(said) == 1 for said in lines.values()), dict(lines)
    assert {outage for outage, _ in lines} == {0, 1}, "every outage is reported"
    assert (1, "lease lost") in lines, "the long outage outlasted the lease"
    per_outage = {i: sum(len(v) for (o, _), v in lines.items() if o == i) for i in (0, 1)}
    print(
        f"\noutages {[f'{took:.2f}s' for _, took in outages]}; {total} records, {sum(duplicates.values())} "
        f"repeats; producer retries {producer.failures}; {len(recorder.of(LeaderAcquired))} terms; "
        f"warnings per outage {per_outage}: {sorted({what for _, what in lines})}"
    )
