"""Fencing: a leader that cannot confirm its leadership stops marking within the deadline, and
harvesting resumes once it can again — for the Kafka (NELI) and the database-lease elections.

Timing on a loaded machine (CI runs Spark beside this suite on 2 cores): a fence is timed from the
harvester's own thread (the event handler stamps arrival), not from this test's polling, and its
bound is the deadline that matters plus room for a slow scheduler. Waits that only end a failing
test (leadership, draining) are generous: they cost nothing when things work.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.harvest import LeaderAcquired, LeaderFenced
from sluiceway.outbox import init_outbox
from sluiceway.testing import Broker, free_port, wait_until
from tests.support.harvest import Recorder, kafka_config, started
from tests.support.outbox import outbox_count

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HEARTBEAT_TIMEOUT = 2.0  # kafka_config's heartbeatTimeout; also the lease ttl below
#: NELI's consumer defaults for that heartbeat timeout (election/neli.py): the group coordinator
#: drops a silent member session.timeout.ms after its last heartbeat, which was sent at most
#: heartbeat.interval.ms before the broker went; only then can a rival be given partition 0.
SESSION_TIMEOUT, CONSUMER_HEARTBEAT = 6.0, 1.0
#: Scheduling delays on a loaded 2-core machine between the deadline passing and the fence event.
SLOW_SCHEDULER = 2.0


def stash(dsn: str, topic: str, n: int, start: int = 0) -> None:
    with psycopg.connect(dsn) as conn:
        st = Stasher().prepare(conn)
        for i in range(start, start + n):
            st.stash(OutboxRecord(topic, f"k{i % 5}", str(i)))


def unmarked(dsn: str) -> int:
    with Database(dsn) as db:
        return int(db.fetchone("SELECT count(*) FROM outbox WHERE leader_id IS NULL")[0])  # type: ignore[index]


def quiet_period(seconds: float) -> None:
    """Observe that nothing happens for a while (the one place a test must simply wait)."""
    time.sleep(seconds)


def test_neli_leader_fences_when_the_broker_goes_and_resumes_when_it_returns(
    postgres_dsn: str, tmp_path: Path
) -> None:
    with Database(postgres_dsn) as db:
        init_outbox(db)
        db.execute("DELETE FROM outbox")
    port = free_port()
    broker = Broker(port=port, log_path=str(tmp_path / "broker.log")).start()
    broker.create_topic("fence-data", 1)
    cfg = kafka_config(
        postgres_dsn,
        broker.bootstrap,
        "fence",
        election={"kind": "kafka"},
        leaderTopic="fence-leader",
        leaderGroupID="fence-group",
        producerKafkaConfig={"delivery.timeout.ms": 3000},
    )
    recorder = Recorder()
    harvest = started(Harvest(cfg), recorder)
    try:
        wait_until(lambda: recorder.of(LeaderAcquired), timeout=60, message="leadership")
        stash(postgres_dsn, "fence-data", 50)
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=60)
        broker.stop()
        stopped_at = time.monotonic()
        wait_until(lambda: recorder.of(LeaderFenced), timeout=20, message="the leader to fence itself")
        fenced_after = recorder.first_arrival(LeaderFenced) - stopped_at
        # NELI fences heartbeatTimeout after its last own heartbeat (2 s): it must do so before a
        # rival could be assigned partition 0 — the safety bound, with 3 s of room left for load.
        rival_possible = SESSION_TIMEOUT - CONSUMER_HEARTBEAT
        assert fenced_after < rival_possible, (
            f"fenced only after {fenced_after:.1f}s; a rival could lead after {rival_possible:.0f}s"
        )
        assert not harvest.is_leader
        stash(postgres_dsn, "fence-data", 20, start=50)
        quiet_period(1.5)
        assert unmarked(postgres_dsn) == 20, "a fenced leader must not mark"
        # The broker returns (empty: memory storage); the harvester leads again and drains.
        broker = Broker(port=port, log_path=str(tmp_path / "broker2.log")).start()
        broker.create_topic("fence-data", 1)
        wait_until(lambda: len(recorder.of(LeaderAcquired)) >= 2, timeout=90, message="leadership again")
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=60, message="drain after return")
    finally:
        harvest.stop()
        broker.stop()


def test_database_lease_fences_when_renewals_cannot_complete(
    postgres_dsn: str, kafka: Broker, topic: str
) -> None:
    with Database(postgres_dsn) as db:
        init_outbox(db)
        db.execute("DELETE FROM outbox")
    cfg = kafka_config(
        postgres_dsn,
        kafka.bootstrap,
        f"lease-{topic}",
        election={"kind": "database", "leaseTimeout": f"{HEARTBEAT_TIMEOUT:g}s"},
    )
    recorder = Recorder()
    harvest = started(Harvest(cfg), recorder)
    blocker = psycopg.connect(postgres_dsn)
    try:
        wait_until(lambda: recorder.of(LeaderAcquired), timeout=60, message="leadership")
        stash(postgres_dsn, topic, 30)
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=60)
        # Hold the lease row locked: every renewal now hangs, as with a database that stopped answering.
        blocker.execute("SELECT * FROM sluiceway_leases WHERE name = %s FOR UPDATE", (f"lease-{topic}",))
        locked_at = time.monotonic()
        wait_until(lambda: recorder.of(LeaderFenced), timeout=20, message="the leader to fence itself")
        fenced_after = recorder.first_arrival(LeaderFenced) - locked_at
        # The hung renewal never returns: only the local deadline (last renewal start + 0.8 x ttl,
        # so at most 1.6 s after the lock) can end leadership. The event follows the term's
        # shutdown (threads joined, Kafka client closed), hence the room beyond the ttl.
        assert fenced_after <= HEARTBEAT_TIMEOUT + SLOW_SCHEDULER, (
            f"fenced only after {fenced_after:.1f}s (lease ttl {HEARTBEAT_TIMEOUT:.0f}s)"
        )
        assert not harvest.is_leader
        stash(postgres_dsn, topic, 10, start=30)
        quiet_period(1.0)
        assert unmarked(postgres_dsn) == 10, "a fenced leader must not mark"
        blocker.rollback()
        wait_until(lambda: len(recorder.of(LeaderAcquired)) >= 2, timeout=60, message="leadership again")
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=60, message="drain after renewal")
    finally:
        blocker.close()
        harvest.stop()
