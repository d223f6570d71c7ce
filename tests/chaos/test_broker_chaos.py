"""Three harvesters on PostgreSQL publishing to NATS JetStream, RabbitMQ or Redis; the leader killed
with kill -9 twice while records flow. Read back with the broker's own client: per key, after
collapsing immediate repeats, exactly 1..n; nothing lost; the outbox ends empty.

JetStream also de-duplicates by message id (the outbox id): a killed leader's in-flight records,
re-sent by its successor within the duplicate window, are dropped by the server, so the stream
holds no duplicate at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.testing import wait_until
from tests.support.brokers import Place, seqs
from tests.support.order import check_per_key_order
from tests.support.outbox import Writers, outbox_count, prepare_outbox
from tests.support.reaper import Reaper, the_leader, write_config

pytestmark = [pytest.mark.slow, pytest.mark.brokers, pytest.mark.timeout(240)]

TOTAL, KEYS = 10_000, 100


@pytest.mark.parametrize("place", ["nats", "rabbitmq", "redis"], indirect=True)
def test_three_harvesters_leader_killed_twice(postgres_dsn: str, place: Place, tmp_path: Path) -> None:
    prepare_outbox(postgres_dsn)
    topic = place.topic("orders")
    config = write_config(
        tmp_path / "reaper.yaml",
        {
            "name": f"chaos-{place.prefix}",
            "dataSource": postgres_dsn,
            "target": place.target(),
            "limits": {"heartbeatTimeout": "2s", "minMetricsInterval": "1s", "markQueryRecords": 200},
        },
    )
    reapers = [Reaper(config, tmp_path / f"reaper-{i}.log", seed=i) for i in range(3)]
    kills: list[bool] = []  # whether the writers were still writing at each kill
    try:
        # Writers that go on until both kills are done, so that both land while records flow
        # (with a fixed total, a slow machine's second election could come after the last write).
        writers = Writers(
            postgres_dsn, TOTAL, KEYS, threads=4, topic=topic, batch=10, pause=0.02, until_stopped=True
        ).start()
        for _ in range(2):
            leader = the_leader(reapers)
            before = place.count()
            wait_until(lambda b=before: place.count() > b + 200, timeout=30, message="the leader to publish")
            leader.kill()
            kills.append(writers.writing())
            reapers.append(Reaper(config, tmp_path / f"reaper-{len(reapers)}.log", seed=len(reapers)))
        writers.stop()
        writers.join()
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=120, message="the outbox to drain")
    finally:
        for r in reapers:
            r.terminate()
    total = writers.written
    assert total >= TOTAL
    seen = place.read(expected=total)
    dups = check_per_key_order(seqs(seen), writers.expected)
    duplicates = sum(dups.values())
    print(
        f"\n{place.broker}: {len(seen)} messages for {total} records, {duplicates} duplicates, kills {kills}"
    )
    assert len(seen) >= total
    assert all(kills), "a kill happened after the writers had finished"
    if place.broker == "nats":
        assert duplicates == 0, "JetStream should drop re-sends with a known Nats-Msg-Id"
    assert outbox_count(postgres_dsn) == 0
