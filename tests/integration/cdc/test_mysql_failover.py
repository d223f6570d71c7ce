"""The binlog capture across a failover: a primary and a GTID replica (two private MariaDB
servers), the capture reading the primary; the primary crashes, the replica is promoted and takes
writes, and the capture — pointed at it with the same log and state — resumes from its GTID
checkpoint: every change once, in order, the log's positions still growing. A server that never
had the capture's transactions is refused in one line before anything is made, never read from a
wrong place."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.cdc.errors import LostChangesError
from sluiceway.cdc.mysql import BinlogOptions
from sluiceway.cdc.mysql.capture import BinlogCapture, CheckpointFile, describe_position
from sluiceway.cdc.mysql.gtid import epoch_of
from sluiceway.cdc.mysql.server import WATERMARKS, BinlogSession
from sluiceway.cdc.target import JournalTarget
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import Running, Sink, capture_records, version_regressions
from tests.support.mysql_cdc import Writer, create_tables, source_state

pytestmark = pytest.mark.timeout(300)

DATABASE = "shop"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PrivateMariaDB, PrivateMariaDB]]:
    """A primary (server id 1) and its replica (server id 2, its own GTID domain for what it
    writes itself, the primary's transactions in its binlog under their GTIDs)."""
    primary = PrivateMariaDB().start()
    replica = PrivateMariaDB({"server-id": "2", "gtid-domain-id": "2", "log-slave-updates": ""})
    try:
        replica.start()
        replica.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, MASTER_USER='root', "
            "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos"
        )
        replica.execute("START SLAVE")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def options(db: PrivateMariaDB, tmp: Path) -> BinlogOptions:
    return BinlogOptions(
        dsn=db.dsn(DATABASE),
        tables=("orders", "order_lines"),
        server_id=4711,
        state_dir=str(tmp / "state"),
        chunk_size=300,
    )


def replicated(primary: PrivateMariaDB, replica: PrivateMariaDB) -> None:
    want = primary.execute("SELECT @@gtid_binlog_pos")[0][0]
    wait_until(
        lambda: replica.execute("SELECT @@gtid_slave_pos")[0][0] == want,
        timeout=60,
        message="the replica to apply everything",
    )


def test_the_session_reads_server_identity_and_gtid_state(
    pair: tuple[PrivateMariaDB, PrivateMariaDB],
) -> None:
    _primary, replica = pair
    session = BinlogSession(replica.dsn("test"))
    try:
        assert session.server_id() == 2 and session.is_mariadb()
        files = session.binary_logs()
        first = files[min(files)]
        assert session.gtid_at(first, 4) == ""  # before any transaction of the binlog
    finally:
        session.close()


def test_a_server_without_the_captured_transactions_is_refused_in_one_line(
    pair: tuple[PrivateMariaDB, PrivateMariaDB], tmp_path: Path
) -> None:
    primary, _replica = pair
    with PrivateMariaDB({"server-id": "3"}) as stranger:
        for db in (primary, stranger):
            db.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
            db.execute(f"CREATE TABLE IF NOT EXISTS {DATABASE}.t (id INT PRIMARY KEY, v INT)")
        opts = BinlogOptions(primary.dsn(DATABASE), ("t",), 4712, str(tmp_path / "state"), snapshot="never")
        first = Running(opts, tmp_path / "log")
        for i in range(30):
            primary.execute(f"INSERT INTO {DATABASE}.t VALUES ({i}, {i}) ON DUPLICATE KEY UPDATE v = v + 1")
        first.caught_up()
        first.close()
        # The stranger's binlog also has a binlog.000001 and offsets like the primary's; file and
        # offset would read its bytes as if they were the primary's.
        moved = BinlogOptions(stranger.dsn(DATABASE), ("t",), 4712, str(tmp_path / "state"), snapshot="never")
        target = JournalTarget(str(tmp_path / "log"))
        second = BinlogCapture(moved, target)
        try:
            with pytest.raises(LostChangesError) as refused:
                second.prepare()
        finally:
            second.close()
            target.close()
        text = str(refused.value)
        assert "\n" not in text, text
        assert "server id 3 has not written every transaction" in text and "lacks 0-1-" in text
        assert "start a fresh log" in text
        # Refused before anything was made: no watermark table on the stranger, the checkpoint
        # still the primary's, the log as it was.
        made = "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_NAME = %s"
        assert stranger.execute(made, (WATERMARKS,))[0][0] == 0
        kept = CheckpointFile(str(tmp_path / "state")).load()
        assert kept is not None and kept.server_id == 1
        assert len(capture_records(tmp_path / "log")) == 30


def test_a_failover_to_the_promoted_replica_resumes_by_gtid_every_change_once(
    pair: tuple[PrivateMariaDB, PrivateMariaDB], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primary, replica = pair
    create_tables(primary, DATABASE, orders=2_000, lines=1_000)
    replicated(primary, replica)
    log = tmp_path / "log"
    running = Running(options(primary, tmp_path), log)
    writer = Writer(primary, DATABASE, pace=0.001)
    writer.start()
    try:
        wait_until(
            lambda: running.capture.copy_done.is_set() or running.error, timeout=120, message="the copy"
        )
        wait_until(lambda: writer.ops > 600, timeout=60, message="writes on the primary")
    finally:
        writer.stop()
    running.caught_up()
    replicated(primary, replica)
    before = running.capture.durable
    assert epoch_of(before) == 0

    # The primary's host dies under the capture; the replica is promoted and written to.
    primary.kill()
    wait_until(lambda: running.error is not None, timeout=30, message="the capture to lose its stream")
    with pytest.raises(Exception, match="binlog stream was cut"):
        running.close()
    # Closing wrote the checkpoint of what the log holds: the primary's GTID state there.
    saved = CheckpointFile(str(tmp_path / "state")).load()
    assert saved is not None and saved.server_id == 1 and saved.position == before
    assert saved.gtid.startswith("0-1-")
    replica.execute("STOP SLAVE")
    replica.execute("RESET SLAVE ALL")

    caplog.set_level(logging.WARNING, logger="sluiceway.cdc")
    again = Running(options(replica, tmp_path), log)
    assert again.capture.resume.gtid is not None and not again.capture.resume.behind
    said = [r.getMessage() for r in caplog.records if "GTID state" in r.getMessage()]
    assert said == [
        f"cdc: the binlog's positions are another server's (server id 1), this is server id 2: resuming "
        f"from the GTID state {saved.gtid} (positions of epoch 1)"
    ]
    writer = Writer(replica, DATABASE, seed=11, pace=0.001)
    writer._version = 5_000_000  # above every version the primary's writer gave
    writer.start()
    try:
        wait_until(lambda: writer.ops > 400, timeout=60, message="writes on the promoted replica")
    finally:
        writer.stop()
    again.caught_up()
    after = again.capture.position
    again.close()

    assert epoch_of(after) == 1 and after > before, describe_position(after)
    assert describe_position(after).endswith("(epoch 1)")
    moved = CheckpointFile(str(tmp_path / "state")).load()
    assert moved is not None and moved.server_id == 2 and moved.epoch == 1
    assert "2-2-" in moved.gtid  # the promoted server's own domain

    sink = Sink()
    records = capture_records(log)
    sink.apply(records)
    assert sink.state == source_state(replica, DATABASE)
    assert version_regressions(records) == []
    # Every version is written once: a change in the log twice was read twice.
    streamed = Counter(
        (r["namespace"], r["key"], json.loads(r["value"])["version"])
        for r in records
        if r["value"] is not None and _header(r, "sluice.mode") == "sync"
    )
    assert [k for k, n in streamed.items() if n > 1] == []


def _header(record: dict[str, Any], name: str) -> str | None:
    return next((h["value"] for h in record["headers"] if h["key"] == name), None)
