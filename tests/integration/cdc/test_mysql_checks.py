"""The MariaDB capture's set-up checks: each refusal is one line naming the setting or grant that
mends it, raised before anything is created; a position the server purged is never skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.cdc.errors import CdcError, LostChangesError
from sluiceway.cdc.mysql import BinlogCapture, BinlogOptions
from sluiceway.cdc.mysql.server import WATERMARKS
from sluiceway.cdc.target import JournalTarget
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import capture_records
from tests.support.cli import sluice

pytestmark = pytest.mark.timeout(120)


def capture(dsn: str, tmp: Path, tables: tuple[str, ...] = ("orders",)) -> BinlogCapture:
    return BinlogCapture(
        BinlogOptions(dsn, tables, 4401, str(tmp / "state")), JournalTarget(str(tmp / "log"))
    )


@pytest.fixture()
def orders(binlog_mariadb: PrivateMariaDB, binlog_db: str) -> Iterator[str]:
    binlog_mariadb.execute(
        "CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY, v INT)", database=binlog_db
    )
    yield binlog_mariadb.dsn(binlog_db)


def refusal(dsn: str, tmp: Path, tables: tuple[str, ...] = ("orders",)) -> str:
    cap = capture(dsn, tmp, tables)
    try:
        with pytest.raises(CdcError) as info:
            cap.check()
    finally:
        cap.close()
        cap.target.close()
    text = str(info.value)
    assert "\n" not in text
    return text


def test_a_server_without_a_binlog_is_refused_in_one_line(tmp_path: Path) -> None:
    with PrivateMariaDB({"log-bin": None}) as db:
        db.execute("CREATE TABLE test.orders (id INT PRIMARY KEY)")
        assert "binary log is off" in refusal(db.dsn(), tmp_path)


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("binlog_format", "MIXED", "binlog_format=ROW"),
        ("binlog_row_image", "MINIMAL", "binlog_row_image=FULL"),
        ("binlog_row_metadata", "MINIMAL", "binlog_row_metadata = 'FULL'"),
    ],
)
def test_binlog_settings_other_than_full_rows_are_refused(
    binlog_mariadb: PrivateMariaDB, orders: str, tmp_path: Path, variable: str, value: str, named: str
) -> None:
    was = binlog_mariadb.execute(f"SELECT @@GLOBAL.{variable}")[0][0]
    binlog_mariadb.execute(f"SET GLOBAL {variable} = '{value}'")
    try:
        assert named in refusal(orders, tmp_path)
    finally:
        binlog_mariadb.execute(f"SET GLOBAL {variable} = '{was}'")


def test_a_user_without_replication_grants_is_refused_and_one_with_them_passes(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, orders: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute("CREATE USER IF NOT EXISTS 'reader'@'%' IDENTIFIED BY 'pw'")
    binlog_mariadb.execute(f"GRANT SELECT, INSERT, CREATE ON `{binlog_db}`.* TO 'reader'@'%'")
    dsn = f"mysql://reader:pw@127.0.0.1:{binlog_mariadb.port}/{binlog_db}"
    text = refusal(dsn, tmp_path)
    assert "REPLICATION SLAVE and REPLICATION CLIENT" in text
    binlog_mariadb.execute("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'reader'@'%'")
    cap = capture(dsn, tmp_path / "granted")
    try:
        cap.check()  # passes
    finally:
        cap.close()
        cap.target.close()


def test_a_table_without_a_primary_key_or_that_does_not_exist_is_refused(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, orders: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute("CREATE TABLE IF NOT EXISTS events (at INT, what TEXT)", database=binlog_db)
    assert f"table {binlog_db}.events has no primary key" in refusal(orders, tmp_path, ("orders", "events"))
    assert f"table {binlog_db}.nope does not exist" in refusal(orders, tmp_path, ("nope",))
    tables = binlog_mariadb.execute(f"SHOW TABLES FROM `{binlog_db}` LIKE '{WATERMARKS}'")
    assert tables == []  # nothing was created by a check that refused


def test_a_position_the_server_purged_is_lost_changes_never_a_skip(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, orders: str, tmp_path: Path
) -> None:
    first = capture(orders, tmp_path)
    first.prepare()  # the journal now holds the binlog's current position
    first.close()
    first.target.close()
    binlog_mariadb.execute("INSERT INTO orders VALUES (1, 1)", database=binlog_db)
    binlog_mariadb.execute("FLUSH BINARY LOGS")
    newest = binlog_mariadb.execute("SHOW MASTER STATUS")[0][0]

    def purged() -> bool:
        # The server purges a binlog only once its binlog checkpoint passed it: ask until it has.
        binlog_mariadb.execute(f"PURGE BINARY LOGS TO '{newest}'")
        return [r[0] for r in binlog_mariadb.execute("SHOW BINARY LOGS")] == [newest]

    wait_until(purged, timeout=20, interval=0.2, message="the old binary logs to be purged")
    again = capture(orders, tmp_path)
    try:
        with pytest.raises(LostChangesError, match="no longer has that binary log") as info:
            again.prepare()
        assert "purged" in str(info.value) and "\n" not in str(info.value)
    finally:
        again.close()
        again.target.close()


def test_the_pipeline_refuses_a_table_without_a_key_in_one_line_before_spark(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, orders: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute("CREATE TABLE IF NOT EXISTS events (at INT, what TEXT)", database=binlog_db)
    (tmp_path / "p.yaml").write_text(
        "pipeline:\n  name: mcheck\n  source:\n    type: mysql-cdc\n"
        f"    dsn: {orders}\n    tables: [events]\n    server_id: 9\n"
        f"  sinks:\n    - {{name: out, type: console}}\n  checkpoint: {tmp_path / 'cp'}\n"
    )
    done = sluice("pipeline", "run", "p.yaml", "--once", cwd=tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "has no primary key" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture()
def read_only(binlog_mariadb: PrivateMariaDB, binlog_db: str) -> Iterator[str]:
    """The server as a replica is: ``read_only`` on (root, with SUPER, still writes — so what the
    capture writes would land: the test sees it). A database of the test's own."""
    database = f"{binlog_db}_ro"[:64]
    binlog_mariadb.execute(f"CREATE DATABASE `{database}`")
    binlog_mariadb.execute("CREATE TABLE items (id INT PRIMARY KEY, v INT)", database=database)
    binlog_mariadb.execute("SET GLOBAL read_only = 1")
    try:
        yield database
    finally:
        binlog_mariadb.execute("SET GLOBAL read_only = 0")
        binlog_mariadb.execute(f"DROP DATABASE IF EXISTS `{database}`")


def test_a_read_only_replica_streams_changes_and_writes_nothing_there(
    binlog_mariadb: PrivateMariaDB, read_only: str, tmp_path: Path
) -> None:
    """With ``snapshot: never`` a capture of a read-only server makes no watermark table and
    writes no heartbeat; catching up (as ``--once`` does) still ends, a binlog rotated after the
    last transaction included, with every change in the log."""
    dsn = binlog_mariadb.dsn(read_only)
    target = JournalTarget(str(tmp_path / "log"))
    options = BinlogOptions(dsn, ("items",), 4402, str(tmp_path / "state"), snapshot="never")
    cap = BinlogCapture(options, target)
    try:
        cap.prepare()
        cap.start()
        for i in range(1, 41):
            binlog_mariadb.execute("INSERT INTO items VALUES (%s, %s)", (i, i), database=read_only)
        binlog_mariadb.execute("UPDATE items SET v = v + 100 WHERE id <= 10", database=read_only)
        binlog_mariadb.execute("FLUSH BINARY LOGS")  # the binlog's end now past any transaction
        cap.catch_up(timeout=60)
    finally:
        cap.close()
        target.close()
    records = capture_records(tmp_path / "log")
    assert len(records) == 50, len(records)
    tables = binlog_mariadb.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (read_only,)
    )
    assert [str(t[0]) for t in tables] == ["items"], tables  # no watermark table


def test_a_copy_on_a_read_only_replica_is_refused_in_one_line_before_anything_is_made(
    binlog_mariadb: PrivateMariaDB, read_only: str, tmp_path: Path
) -> None:
    text = refusal(binlog_mariadb.dsn(read_only), tmp_path, ("items",))
    assert "read-only" in text and "snapshot: never" in text and WATERMARKS in text, text
    tables = binlog_mariadb.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (read_only,)
    )
    assert [str(t[0]) for t in tables] == ["items"]
