"""Ordering & completeness under leader kills and injected producer faults (real broker, real DBs).

Per key, the sequence read back from the topic — after collapsing immediate repeats — must be
exactly 1..n: duplicates only as re-sends, never reordering, nothing lost. The outbox ends empty.
With ``perKeyInFlight`` > 1: per key 1..n with only re-sent suffixes, and exactly 1..n once the
``Deduplicator`` has dropped what is not above the last ``sluice-id`` passed. A dead letter parks
its key across failovers until an operator retries it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluiceway import Deduplicator
from sluiceway.db import Database
from sluiceway.outbox import discover, list_dead_letters, retry_dead_letter
from sluiceway.testing import Broker, wait_until
from tests.support.order import check_per_key_order, check_resent_suffixes, read_topic, read_topic_ids
from tests.support.outbox import Writers, outbox_count, prepare_outbox
from tests.support.reaper import Reaper, the_leader, write_config

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(600)]


def run_scenario(
    dsn: str,
    kafka: Broker,
    topic: str,
    tmp_path: Path,
    *,
    election: str,
    faults: float,
    kills: int,
    total: int = 20_000,
    keys: int = 200,
) -> None:
    prepare_outbox(dsn)
    config = write_config(
        tmp_path / "reaper.yaml",
        {
            "name": f"chaos-{topic}",
            "baseKafkaConfig": {"bootstrap.servers": kafka.bootstrap},
            "producerKafkaConfig": {"delivery.timeout.ms": 10000},
            "leaderTopic": f"{topic}-leader",
            "leaderGroupID": f"{topic}-group",
            "dataSource": dsn,
            "election": {"kind": election},
            "limits": {"heartbeatTimeout": "2s", "minMetricsInterval": "1s", "markQueryRecords": 200},
        },
    )
    reapers = [Reaper(config, tmp_path / f"reaper-{i}.log", faults=faults, seed=i) for i in range(3)]
    try:
        writers = Writers(dsn, total, keys, threads=4, topic=topic, batch=10, pause=0.004).start()
        for _ in range(kills):
            leader = the_leader(reapers)
            # Let it publish for a while, then kill it mid-run with records in flight.
            before = outbox_count(dsn)
            wait_until(lambda b=before: outbox_count(dsn) != b, timeout=30, message="progress")
            leader.kill()
            reapers.append(
                Reaper(config, tmp_path / f"reaper-{len(reapers)}.log", faults=faults, seed=len(reapers))
            )
        writers.join()
        wait_until(lambda: outbox_count(dsn) == 0, timeout=180, message="the outbox to drain")
        messages = read_topic(kafka.bootstrap, topic, total)
        dups = check_per_key_order([(k, s) for k, s, _ in messages], writers.expected)
        assert len(messages) == total + sum(dups.values())
        assert sum(writers.expected.values()) == total
        # What at-least-once allows here: a new leader re-sends what its predecessor had in flight
        # and not yet purged — with perKeyInFlight 1, at most one record per key, and never more
        # than maxInFlightRecords (1000 by default) — and a lost acknowledgement re-sends its record
        # once. Failovers are counted from the events (a lease lost under load is one too).
        failovers = sum(r.acquisitions() for r in reapers) - 1
        acks_lost = sum(r.acks_lost() for r in reapers)
        bound = failovers * min(keys, 1000) + acks_lost
        print(
            f"\n{election}, faults={faults}, kills={kills}: {len(messages)} messages for {total} records, "
            f"{sum(dups.values())} duplicates (bound {bound}: {failovers} failovers, {acks_lost} acks lost)"
        )
        assert failovers >= kills
        assert sum(dups.values()) <= bound
        # Each key stayed in one partition (keyed partitioning): per-key order is the topic's order.
        assert all(len({p for k2, _, p in messages if k2 == k}) == 1 for k in list(writers.expected)[:20])
    finally:
        for r in reapers:
            r.terminate()
    assert outbox_count(dsn) == 0


def test_three_reapers_leader_killed_twice_postgres_neli(
    postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    run_scenario(postgres_dsn, kafka, topic, tmp_path, election="kafka", faults=0.0, kills=2)


@pytest.mark.parametrize("dialect", ["postgres", "sqlite", "mysql"])
def test_two_percent_producer_faults_with_a_leader_kill(
    dialect: str, request: pytest.FixtureRequest, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    dsn = str(request.getfixturevalue(f"{dialect}_dsn"))
    run_scenario(
        dsn, kafka, topic, tmp_path, election="database", faults=0.02, kills=1, total=10_000, keys=100
    )


def pipelined_config(dsn: str, kafka: Broker, topic: str, tmp_path: Path, election: str) -> Path:
    return write_config(
        tmp_path / "reaper.yaml",
        {
            "name": f"chaos-{topic}",
            "baseKafkaConfig": {"bootstrap.servers": kafka.bootstrap},
            "leaderTopic": f"{topic}-leader",
            "leaderGroupID": f"{topic}-group",
            "dataSource": dsn,
            "election": {"kind": election},
            "limits": {
                "heartbeatTimeout": "2s",
                "minMetricsInterval": "1s",
                "markQueryRecords": 200,
                "perKeyInFlight": 8,
            },
        },
    )


def kill_leader_while_publishing(
    reapers: list[Reaper], dsn: str, config: Path, tmp_path: Path, faults: float
) -> None:
    leader = the_leader(reapers)
    before = outbox_count(dsn)
    wait_until(lambda: outbox_count(dsn) != before, timeout=30, message="progress")
    leader.kill()
    n = len(reapers)
    reapers.append(Reaper(config, tmp_path / f"reaper-{n}.log", faults=faults, seed=n))


@pytest.mark.parametrize(("dialect", "election"), [("postgres", "kafka"), ("mysql", "database")])
def test_eight_in_flight_per_key_faults_and_two_leader_kills(
    dialect: str, election: str, request: pytest.FixtureRequest, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    dsn = str(request.getfixturevalue(f"{dialect}_dsn"))
    total, keys, faults = 20_000, 50, 0.02
    prepare_outbox(dsn)
    config = pipelined_config(dsn, kafka, topic, tmp_path, election)
    reapers = [Reaper(config, tmp_path / f"reaper-{i}.log", faults=faults, seed=i) for i in range(3)]
    try:
        writers = Writers(dsn, total, keys, threads=4, topic=topic, batch=10, pause=0.002).start()
        for _ in range(2):
            kill_leader_while_publishing(reapers, dsn, config, tmp_path, faults)
        writers.join()
        wait_until(lambda: outbox_count(dsn) == 0, timeout=180, message="the outbox to drain")
        messages = read_topic_ids(kafka.bootstrap, topic, total)
    finally:
        for r in reapers:
            r.terminate()
    resent = check_resent_suffixes([(k, s) for k, s, _, _ in messages], writers.expected)
    dedup = Deduplicator()
    passed = [(k, s) for k, s, _, sid in messages if dedup.admit_id(k, sid or 0)]
    assert all(sid is not None for *_, sid in messages)
    dups = check_per_key_order(passed, writers.expected)
    assert sum(dups.values()) == 0 and len(passed) == total  # exactly 1..n per key
    print(f"\n{dialect}/{election}, perKeyInFlight 8: {len(messages)} messages, {resent} re-sent")
    assert outbox_count(dsn) == 0


def test_a_poison_record_parks_its_key_across_a_failover_until_retried(
    postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, total, keys, poisoned, at = postgres_dsn, 4000, 20, "key-7", 50
    flag = tmp_path / "poison-on"
    flag.touch()
    monkeypatch.setenv("SLUICE_CHAOS_POISON", f"{poisoned}:{at}:{flag}")
    prepare_outbox(dsn)
    config = pipelined_config(dsn, kafka, topic, tmp_path, "database")
    reapers = [Reaper(config, tmp_path / f"reaper-{i}.log", seed=i) for i in range(3)]
    try:
        writers = Writers(dsn, total, keys, threads=4, topic=topic, batch=10).start()
        writers.join()
        behind = writers.expected[poisoned] - at  # rows of the key after the poison record
        wait_until(lambda: outbox_count(dsn) == behind, timeout=120, message="every other key to complete")
        with Database(dsn) as db:
            layout = discover(db)
            (letter,) = list_dead_letters(db, layout)
            assert (letter.key, letter.parked) == (poisoned, True)
            assert {r[0] for r in db.fetchall("SELECT DISTINCT kafka_key FROM outbox")} == {poisoned}
        # A new leader sees the parked key too (the dead-letter table tells it).
        the_leader(reapers).kill()
        reapers.append(Reaper(config, tmp_path / "reaper-3.log", seed=3))
        wait_until(lambda: sum(r.leading() for r in reapers) == 1, timeout=60, message="a new leader")
        # Give it time to mark (it marks every 10 ms when idle): the parked rows must stay put.
        assert not wait_until_or_false(lambda: outbox_count(dsn) != behind, 3.0)
        early = read_topic_ids(kafka.bootstrap, topic, total - behind - 1)
        assert max(s for k, s, _, _ in early if k == poisoned) == at - 1  # nothing past the poison
        others = {k: n for k, n in writers.expected.items() if k != poisoned}
        check_per_key_order([(k, s) for k, s, _, _ in early if k != poisoned], others)
        flag.unlink()  # the fault is gone
        with Database(dsn) as db:
            assert retry_dead_letter(db, layout, letter.id)
        wait_until(lambda: outbox_count(dsn) == 0, timeout=60, message="the parked key to drain")
        messages = read_topic_ids(kafka.bootstrap, topic, total)
    finally:
        for r in reapers:
            r.terminate()
    dedup = Deduplicator()
    passed = [(k, s) for k, s, _, sid in messages if dedup.admit_id(k, sid or 0)]
    dups = check_per_key_order(passed, writers.expected)
    assert sum(dups.values()) == 0  # after retry, the key is exactly 1..n
    check_resent_suffixes([(k, s) for k, s, _, _ in messages], writers.expected)


def wait_until_or_false(check: Callable[[], bool], timeout: float) -> bool:
    try:
        return bool(wait_until(check, timeout=timeout))
    except TimeoutError:
        return False
