"""Ordering & completeness under leader kills and injected producer faults (real broker, real DBs).

Per key, the sequence read back from the topic — after collapsing immediate repeats — must be
exactly 1..n: duplicates only as re-sends, never reordering, nothing lost. The outbox ends empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.testing import Broker, wait_until
from tests.support.order import check_per_key_order, read_topic
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
        assert len(messages) >= total
        assert sum(writers.expected.values()) == total
        print(
            f"\n{election}, faults={faults}, kills={kills}: {len(messages)} messages for {total} records, "
            f"{sum(dups.values())} duplicates"
        )
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
