"""``sluice capture`` from a MariaDB binlog into a real Kafka-protocol broker: the copy, then every
change per key in order, the messages in the PostgreSQL capture's shape with the binlog's
``source`` (GTID, file, offset), and a published position that never runs ahead of the topic."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.capture import Capture
from sluiceway.capture.target import PositionFile
from sluiceway.cdc.mysql.capture import CheckpointFile
from sluiceway.cdc.mysql.gtid import Checkpoint
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


def test_a_server_the_saved_positions_are_not_of_is_refused_before_the_campaign(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    """A capture that published from a server whose transactions this one never had (pointed at
    the wrong server: its GTID checkpoint names server id 77): `sluice capture` says so in one
    line and exits 1 before it takes a lease or makes its watermark table."""
    database = f"{binlog_db}_s"[:64]
    create_tables(binlog_mariadb, database, orders=10, lines=10)
    try:
        _refused_before_the_campaign(binlog_mariadb, database, tmp_path)
    finally:
        binlog_mariadb.execute(f"DROP DATABASE IF EXISTS `{database}`")


def _refused_before_the_campaign(binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    held = binlog_end(binlog_mariadb, binlog_db)
    PositionFile(state / "published.lsn").write(held)
    CheckpointFile(str(state)).save(Checkpoint(server_id=77, epoch=0, position=held, gtid="0-77-5000"))
    spec = tmp_path / "capture.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "capture": {
                    "name": "mstranger",
                    "dsn": binlog_mariadb.dsn(binlog_db),
                    "tables": ["orders"],
                    "serverId": 6101,
                    "stateDir": str(state),
                    "journal": {"path": str(tmp_path / "journal")},
                    "startupTimeout": "1s",
                }
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(spec)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "lacks 0-77-5000" in lines[0], done.stderr
    conn = binlog_mariadb.connect(binlog_db)
    with conn.cursor() as cur:
        cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (binlog_db,))
        made = {str(row[0]) for row in cur.fetchall()}
    conn.close()
    assert made == {"orders", "order_lines"}, made
