"""``sluice capture`` on a real PostgreSQL with logical decoding, into a real Kafka-protocol broker
and NATS JetStream: copy, then changes, per key in order, the message format, tombstones, and a
broker that goes away under load."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sluiceway.capture import Capture
from sluiceway.testing import Broker, free_port, wait_until
from tests.support.brokers import CuttableProxy, make_place
from tests.support.capture import (
    ItemsWriter,
    check_changes,
    config,
    parse,
    read_kafka,
    seed_items,
    source_rows,
)
from tests.support.cdc import journal_records, slot_confirmed, wal_now

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def items(cdc_dsn: str) -> str:
    return seed_items(cdc_dsn, 150)


def caught_up(dsn: str, slot: str, timeout: float = 60) -> None:
    """Wait until the slot's confirmed position passes everything committed so far."""
    target = wal_now(dsn)
    wait_until(
        lambda: slot_confirmed(dsn, slot) >= target, timeout=timeout, message=f"slot {slot} to catch up"
    )


def test_kafka_gets_the_copy_then_every_change_in_order_with_its_format_and_tombstones(
    items: str, kafka: Broker, tmp_path: Path
) -> None:
    topic = kafka.create_topic(f"cdc-items-{time.time_ns()}", partitions=3)
    cfg = config(items, "cap_kafka", tmp_path / "state", kafka={"bootstrap.servers": kafka.bootstrap})
    cfg["capture"].update(topic=topic, tombstones=True)
    writer = ItemsWriter(items, pace=0.002)
    with Capture(cfg) as capture:
        # Changes from the slot's creation on are captured one by one (earlier ones: by the copy).
        wait_until(lambda: slot_confirmed(items, "cap_kafka") > 0, timeout=30, message="the slot")
        writer.start()
        wait_until(lambda: writer.ops >= 1500, timeout=60, message="1500 writes")
        writer.finish()
        caught_up(items, "cap_kafka")
        assert capture.is_leader and capture.meter.changes > 1500
    changes = read_kafka(kafka.bootstrap, topic)
    resent = check_changes(changes, writer, source_rows(items))
    assert resent == 0  # no failure, no failover: every change once
    copied = [c for c in changes if c.op == "insert" and c.version is not None and c.version <= 150]
    assert len({c.key for c in copied}) >= 100  # the copy reached the topic too
    # Each delete is followed, under its key, by a tombstone (for compacted topics).
    by_key: dict[str, list[str]] = {}
    for change in changes:
        by_key.setdefault(change.key, []).append(change.op)
    for key, ops in by_key.items():
        for i, op in enumerate(ops):
            if op == "delete":
                assert ops[i + 1 : i + 2] == ["tombstone"], f"key {key}: {ops}"
    assert all(c.key for c in changes)


def test_a_message_carries_op_after_and_source_with_the_commit(
    items: str, kafka: Broker, tmp_path: Path
) -> None:
    topic = kafka.create_topic(f"cdc-fmt-{time.time_ns()}", partitions=1)
    cfg = config(items, "cap_fmt", tmp_path / "state", kafka={"bootstrap.servers": kafka.bootstrap})
    # Elected through Kafka (NELI) this time, and serving its metrics.
    port = free_port()
    cfg["capture"].update(
        topic=topic, snapshot="never", election={"kind": "kafka", "leaseTimeout": "3s"},
        metricsAddr=f"127.0.0.1:{port}",
    )  # fmt: skip
    from confluent_kafka import Consumer, TopicPartition

    with psycopg.connect(items, autocommit=True) as conn:
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # old rows whole: `before`

    def series(name: str) -> float:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text.splitlines():
            if line.startswith(f'{name}{{capture="cap_fmt"}}'):
                return float(line.rsplit(" ", 1)[1])
        return -1.0

    with Capture(cfg):
        wait_until(lambda: slot_confirmed(items, "cap_fmt") > 0, timeout=60, message="the slot")
        with psycopg.connect(items, autocommit=True) as conn:
            conn.execute("UPDATE items SET version = 9001, note = 'x\"y' WHERE id = 7")
            xid = conn.execute("SELECT txid_current()").fetchone()
            conn.execute("DELETE FROM items WHERE id = 8")
        caught_up(items, "cap_fmt")
        wait_until(
            lambda: series("sluice_capture_confirmed_lsn") >= slot_confirmed(items, "cap_fmt"), timeout=10
        )
        assert series("sluice_capture_changes_total") == 2.0 and series("sluice_capture_leader") == 1.0
        assert series("sluice_capture_bytes_total") > 100 and series("sluice_capture_lag_bytes") >= 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"f{time.time_ns()}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    msgs: list[Any] = []
    wait_until(lambda: msgs.extend(m for m in consumer.consume(10, 0.5) if not m.error()) or len(msgs) >= 2)
    consumer.close()
    assert xid is not None
    update, delete = (json.loads(m.value()) for m in msgs[:2])
    assert [m.key() for m in msgs[:2]] == [b"7", b"8"]
    assert update["op"] == "update" and update["after"] == {"id": 7, "version": 9001, "note": 'x"y'}
    assert update["before"] == {"id": 7, "version": 7, "note": "seed"}
    assert update["source"]["table"] == "public.items" and update["source"]["mode"] == "sync"
    assert update["source"]["lsn"].count("/") == 1 and update["source"]["commit_time"].endswith("+00:00")
    before = {"id": 8, "version": 8, "note": "seed"}
    assert delete == {"op": "delete", "before": before, "after": None, "source": delete["source"]}
    headers = dict((k, v.decode()) for k, v in msgs[0].headers())
    assert headers["sluice.op"] == "update" and headers["pg.lsn"] == update["source"]["lsn"]
    assert "pg.before" not in headers  # in the value, not repeated in a header
    assert int(headers["sluice-id"]) >> 32 > 0


@pytest.mark.parametrize("broker", ["nats"])
def test_a_broker_away_under_load_holds_wal_on_the_server_and_loses_nothing(
    items: str, tmp_path: Path, broker: str
) -> None:
    place = make_place(broker)
    proxy = CuttableProxy(4222)
    try:
        target = place.target(proxy.url(broker), deliveryTimeout="2s", connectTimeout="1s")
        cfg = config(items, "cap_down", tmp_path / "state", target=target)
        cfg["capture"].update(topic=f"{place.prefix}.{{table}}")
        writer = ItemsWriter(items, pace=0.002)
        with Capture(cfg):
            wait_until(lambda: slot_confirmed(items, "cap_down") > 0, timeout=30, message="the slot")
            writer.start()
            wait_until(lambda: writer.ops > 300, timeout=60)
            proxy.cut()
            time.sleep(3)  # what was in flight fails; from here the capture does not move
            held = slot_confirmed(items, "cap_down")
            time.sleep(OUTAGE)
            assert slot_confirmed(items, "cap_down") == held  # nothing confirmed while away
            assert wal_now(items) - held > 100_000  # and the server kept the WAL since
            proxy.restore()
            writer.finish()
            caught_up(items, "cap_down", timeout=120)
        seen = [parse(k, v, h) for k, v, h in place.read()]
        check_changes(seen, writer, source_rows(items))
        # JetStream dropped every re-send of the unacknowledged tail by its message id.
        assert len({c.sid for c in seen}) == len(seen)
    finally:
        proxy.close()
        place.cleanup()


#: Seconds the broker stays away (the mechanism does not depend on how long; the issue asks for 30:
#: SLUICE_BROKER_OUTAGE_SECONDS=30).
OUTAGE = float(os.environ.get("SLUICE_BROKER_OUTAGE_SECONDS", "10"))


@pytest.mark.parametrize("destination", ["rabbitmq", "redis", "journal"])
def test_rabbitmq_redis_and_a_journal_get_the_copy_and_every_change_in_order(
    items: str, tmp_path: Path, destination: str
) -> None:
    slot = f"cap_{destination}"
    place = None if destination == "journal" else make_place(destination)
    try:
        if place is None:
            more: dict[str, Any] = {"journal": {"path": str(tmp_path / "j"), "fsync": False}}
        else:
            more = {"target": place.target(), "topic": f"{place.prefix}.{{table}}"}
        writer = ItemsWriter(items, pace=0.003)
        with Capture(config(items, slot, tmp_path / "state", **more)):
            wait_until(lambda: slot_confirmed(items, slot) > 0, timeout=30, message="the slot")
            writer.start()
            wait_until(lambda: writer.ops >= 400, timeout=60, message="400 writes")
            writer.finish()
            caught_up(items, slot)
        if place is None:
            seen = [parse(r["key"], r["value"], r["headers"]) for r in journal_records(tmp_path / "j")]
        else:
            expected = 150 + sum(len(v) for v in writer.committed.values())
            seen = [parse(k, v, h) for k, v, h in place.read(expected=expected)]
        assert check_changes(seen, writer, source_rows(items)) == 0
    finally:
        if place is not None:
            place.cleanup()
