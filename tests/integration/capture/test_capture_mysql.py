"""``sluice capture`` from a MariaDB binlog into a real Kafka-protocol broker: the copy, then every
change per key in order, the messages in the PostgreSQL capture's shape with the binlog's
``source`` (GTID, file, offset), and a published position that never runs ahead of the topic."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sluiceway.capture import Capture, UndeliverableChange
from sluiceway.capture.refusals import RefusalLog
from sluiceway.capture.target import PositionFile
from sluiceway.cdc.mysql.capture import CheckpointFile, parse_position
from sluiceway.cdc.mysql.gtid import Checkpoint
from sluiceway.overview import Workspace, collect
from sluiceway.testing import Broker, PrivateMariaDB, wait_until
from sluiceway.ui import Console, create_app
from tests.support.brokers import make_place
from tests.support.capture import parse, read_kafka
from tests.support.cli import sluice
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


def test_a_binlog_change_nats_refuses_is_shown_and_skipped_by_its_binlog_position(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    """The failure protocol in the binlog's own terms: the stuck change, ``inspect``, ``sluice
    status`` (GTID checkpoint, bytes of binlog behind) and ``skip`` name it ``binlog.NNNNNN:pos``,
    not as a PostgreSQL LSN; ``skip`` of another position is one line; after the skip exactly that
    change is missing."""
    database = f"{binlog_db}_r"[:64]
    binlog_mariadb.execute(f"CREATE DATABASE `{database}`")
    binlog_mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, version BIGINT NOT NULL, note LONGTEXT)", database=database
    )
    binlog_mariadb.execute(
        "INSERT INTO items VALUES (1, 0, 's'), (2, 0, 's'), (3, 0, 's')", database=database
    )
    place = make_place("nats")
    try:
        _refused_in_binlog_terms(binlog_mariadb, database, place, tmp_path)
    finally:
        place.cleanup()
        binlog_mariadb.execute(f"DROP DATABASE IF EXISTS `{database}`")


def console_page(workspace: Path, path: str) -> str:
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(Console(Workspace.from_file(workspace))))
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            return await client.get(path)

    response = asyncio.run(get())
    assert response.status_code == 200, response.text
    return response.text


def _refused_in_binlog_terms(db: PrivateMariaDB, database: str, place: Any, tmp_path: Path) -> None:
    big = 2 * 1024 * 1024  # over NATS's 1 MB payload limit
    state = tmp_path / "state"
    file = tmp_path / "capture.yaml"
    capture_cfg = {
        "name": "mrefuse",
        "dsn": db.dsn(database),
        "tables": ["items"],
        "serverId": 6102,
        "stateDir": str(state),
        "snapshot": "never",
        "topic": f"{place.prefix}.{{table}}",
        "election": {"leaseTimeout": "2s"},
        "target": place.target(),
        "retryBackoff": "200ms",
    }
    file.write_text(yaml.safe_dump({"capture": capture_cfg}))
    published = PositionFile(state / "published.lsn")

    def write(*statements: str) -> None:
        conn = db.connect(database)
        try:
            conn.begin()  # one transaction
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
            conn.commit()
        finally:
            conn.close()

    capture = Capture(file)
    with capture:
        wait_until(lambda: published.read() is not None, timeout=60, message="the capture to start")
        write(
            "UPDATE items SET version = 1 WHERE id = 1",
            f"INSERT INTO items VALUES (4, 1, REPEAT('x', {big}))",  # (an update's binlog image has both)
            "UPDATE items SET version = 1 WHERE id = 3",
        )
        with pytest.raises(UndeliverableChange, match=r"sluice capture skip --lsn binlog\.\d{6}:\d+ "):
            capture.wait(timeout=60)
    stuck = RefusalLog(state).read().stuck
    assert stuck is not None and (stuck.table, stuck.key, stuck.index) == (f"{database}.items", "4", 1)
    assert re.fullmatch(r"binlog\.\d{6}:\d+", stuck.where), stuck.where
    assert parse_position(stuck.where) == stuck.lsn

    shown = sluice("capture", "inspect", "-f", str(file), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"position {stuck.where} (change 2 of its transaction)" in shown.stdout, shown.stdout
    assert f"--lsn {stuck.where}" in shown.stdout and "/" not in stuck.where
    as_json = json.loads(
        sluice("capture", "inspect", "-f", str(file), "--format", "json", cwd=tmp_path).stdout
    )
    assert as_json["stuck"]["lsn"] == stuck.where == as_json["stuck"]["position"]

    workspace = tmp_path / "sluice.yaml"
    workspace.write_text(yaml.safe_dump({"captures": [str(file)]}))
    entry = collect(Workspace.from_file(workspace)).to_json()["captures"][0]
    held = published.read()
    assert held is not None and held < stuck.lsn
    assert re.fullmatch(r"binlog\.\d{6}:\d+", entry["published_lsn"]), entry["published_lsn"]
    assert parse_position(entry["published_lsn"]) == held
    binlog = entry["binlog"]
    server_id = int(db.execute("SELECT @@server_id")[0][0])
    assert binlog["server_id"] == server_id == binlog["checkpoint_server_id"], binlog
    assert re.fullmatch(r"0-\d+-\d+", binlog["gtids"]), binlog
    assert binlog["behind_bytes"] > big, binlog  # the refused transaction is not published
    assert [p for p in entry["problems"] if "refuses" in p and stuck.where in p], entry["problems"]
    assert not any("slot" in p for p in entry["problems"]), entry["problems"]
    page = console_page(workspace, "/capture/mrefuse")
    for expected in ("GTIDs confirmed", binlog["gtids"], "binlog behind", f"binlog at {binlog['end']}"):
        assert expected in page, expected
    assert "does not exist" not in page
    table = sluice("status", "-c", str(workspace), cwd=tmp_path)
    assert binlog["gtids"] in table.stdout and f"{binlog['behind_bytes']:,} behind" in table.stdout, (
        table.stdout
    )

    other = f"{stuck.where.rpartition(':')[0]}:4"
    wrong = sluice("capture", "skip", "-f", str(file), "--lsn", other, cwd=tmp_path)
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.strip().splitlines() == [
        f"error: the stuck change is at {stuck.where} ({database}.items key '4'), not {other}: nothing "
        "skipped (sluice capture inspect shows it)"
    ]
    bad = sluice("capture", "skip", "-f", str(file), "--lsn", "0/1A2B", cwd=tmp_path)
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1
    assert "is not a position (binlog.000003:1234" in bad.stderr, bad.stderr
    skipped = sluice("capture", "skip", "-f", str(file), "--position", stuck.where, cwd=tmp_path)
    assert skipped.returncode == 0 and f"at {stuck.where}" in skipped.stdout, skipped.stdout + skipped.stderr

    with Capture(file) as capture:
        write("UPDATE items SET version = 2 WHERE id = 2")
        end = binlog_end(db, database)
        wait_until(lambda: (published.read() or 0) >= end, timeout=60, message="the capture to catch up")
        assert capture.meter.skips == 1
    changes = [parse(k, v, h) for k, v, h in place.read()]
    # Exactly the refused change is missing: its neighbours and the key's next change arrived.
    assert [(c.key, c.version) for c in changes] == [("1", 1), ("3", 1), ("2", 2)]
