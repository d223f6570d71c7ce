"""``sluice capture`` from a MariaDB binlog into a real Kafka-protocol broker: the copy, then every
change per key in order, the messages in the PostgreSQL capture's shape with the binlog's
``source`` (GTID, file, offset), and a published position that never runs ahead of the topic."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sluiceway.capture import Capture
from sluiceway.capture.target import PositionFile
from sluiceway.testing import Broker, PrivateMariaDB, wait_until
from tests.support.capture import read_kafka
from tests.support.mysql_cdc import Writer, binlog_end, create_tables, source_state

pytestmark = pytest.mark.timeout(240)


def test_kafka_gets_the_copy_then_every_change_in_order_in_the_shared_format(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, kafka: Broker, tmp_path: Path
) -> None:
    create_tables(binlog_mariadb, binlog_db, orders=800, lines=300)
    topic = kafka.create_topic(f"mcdc-{time.time_ns()}", partitions=3)
    cfg: dict[str, Any] = {
        "capture": {
            "name": "mcap",
            "dsn": binlog_mariadb.dsn(binlog_db),
            "tables": ["orders"],
            "serverId": 6100,
            "stateDir": str(tmp_path / "state"),
            "chunkSize": 200,
            "topic": topic,
            "election": {"leaseTimeout": "2s"},
            "kafka": {"bootstrap.servers": kafka.bootstrap},
        }
    }
    published = PositionFile(tmp_path / "state" / "published.lsn")
    writer = Writer(binlog_mariadb, binlog_db, pace=0.002)
    with Capture(cfg) as capture:
        wait_until(lambda: published.read() is not None, timeout=60, message="the capture to start")
        writer.start()
        wait_until(lambda: writer.ops >= 600, timeout=60, message="600 writes")
        writer.stop()
        conn = binlog_mariadb.connect(binlog_db)
        with conn.cursor() as cur:
            cur.execute("UPDATE orders SET version = 9000001, note = 'x\"y' WHERE id = 7")
        conn.close()
        end = binlog_end(binlog_mariadb, binlog_db)
        # Once the capture says it published up to the binlog's end, the topic holds all of it.
        wait_until(lambda: (published.read() or 0) >= end, timeout=60, message="the capture to catch up")
        assert capture.is_leader
        changes = read_kafka(kafka.bootstrap, topic, quiet=0.5)

    namespace = f"{binlog_db}.orders"
    expected = {k[1]: v for k, v in source_state(binlog_mariadb, binlog_db).items() if k[0] == namespace}
    last: dict[str, int | None] = {}
    top: dict[str, int] = {}
    for change in changes:
        assert change.sid > top.get(change.key, -1), f"key {change.key} out of order"
        top[change.key] = change.sid
        last[change.key] = change.version
    assert {k: v for k, v in last.items() if v is not None} == {k: v["version"] for k, v in expected.items()}
    missing = [v for k, vs in writer.committed.items() for v in vs if v not in {c.version for c in changes}]
    assert missing == []
    assert {c.op for c in changes} >= {"insert", "update", "delete"}

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"f{time.time_ns()}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    found: list[Any] = []

    def the_update() -> bool:
        found.extend(m for m in consumer.consume(500, 0.3) if not m.error() and m.key() == b"7")
        return any(json.loads(m.value())["after"]["version"] == 9000001 for m in found if m.value())

    wait_until(the_update, timeout=30, message="the last update of key 7")
    consumer.close()
    message = next(m for m in found if m.value() and json.loads(m.value())["after"]["version"] == 9000001)
    body = json.loads(message.value())
    assert body["op"] == "update" and body["after"]["note"] == 'x"y'
    assert body["before"]["id"] == 7 and body["before"]["version"] != 9000001  # the full before image
    source = body["source"]
    assert source["table"] == namespace and source["mode"] == "sync"
    assert source["file"].startswith("binlog.") and source["pos"] > 0
    assert source["gtid"].count("-") == 2 and source["commit_time"].endswith("+00:00")
    headers = {k: v.decode() for k, v in message.headers()}
    assert headers["mysql.file"] == source["file"] and headers["mysql.pos"] == str(source["pos"])
    assert headers["sluice.op"] == "update" and "mysql.before" not in headers
