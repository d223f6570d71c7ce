"""The capture from MariaDB's binlog on a real private server: copy, then follow the changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.mysql import BinlogOptions
from sluiceway.cdc.mysql.server import WATERMARKS
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import Running, Sink, capture_records, version_regressions
from tests.support.mysql_cdc import Writer, create_tables, source_state

pytestmark = pytest.mark.timeout(240)


def options(db: PrivateMariaDB, database: str, tmp: Path, server_id: int, **extra: Any) -> BinlogOptions:
    return BinlogOptions(
        dsn=db.dsn(database),
        tables=(f"{database}.orders", f"{database}.order_lines"),
        server_id=server_id,
        state_dir=str(tmp / "state"),
        **extra,
    )


def test_copy_under_a_writer_then_sync_equals_the_source(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    create_tables(binlog_mariadb, binlog_db, orders=4_000, lines=3_000)
    writer = Writer(binlog_mariadb, binlog_db)
    writer.start()
    running = Running(options(binlog_mariadb, binlog_db, tmp_path, 101, chunk_size=500), tmp_path / "log")
    try:
        wait_until(
            lambda: running.capture.copy_done.is_set() or running.error, timeout=120, message="the copy"
        )
        # A column added under load: the next row events carry it, the capture keeps going.
        binlog_mariadb.execute(
            "ALTER TABLE orders ADD COLUMN extra INT NOT NULL DEFAULT 5", database=binlog_db
        )
        # Writes after the ALTER (the copy may take longer than any fixed number of writes).
        altered_at = writer.ops
        wait_until(lambda: writer.ops > altered_at + 1_500, timeout=60, message="more writes")
    finally:
        writer.stop()
    assert running.error is None
    point = running.capture.sync_point()
    wait_until(lambda: running.capture.durable >= point or running.error, timeout=60, message="catching up")
    running.close()
    marks = f"SELECT COUNT(*) FROM {WATERMARKS} WHERE capture = %s"
    prefix = running.capture.prefix
    assert binlog_mariadb.execute(marks, (prefix,), database=binlog_db)[0][0] > 0
    # Resumed: the earlier runs' watermark rows are deleted (the binlog holds them; nothing reads
    # the rows), and the deletes are no watermarks to the capture.
    again = Running(options(binlog_mariadb, binlog_db, tmp_path, 101, chunk_size=500), tmp_path / "log")
    try:
        assert binlog_mariadb.execute(marks, (prefix,), database=binlog_db)[0][0] == 0
        again.caught_up()
        assert again.error is None
    finally:
        again.close()
    sink = Sink()
    sink.apply(capture_records(tmp_path / "log"))
    # Rows last changed before the ALTER have no `extra` in their records (the server rewrote them
    # without a row event): a mirror gives them the column's default, as a reader of the records would.
    orders = f"{binlog_db}.orders"
    assert any("extra" in row for (ns, _k), row in sink.state.items() if ns == orders)
    mirrored = {
        k: ({**row, "extra": row.get("extra", 5)} if k[0] == orders else row) for k, row in sink.state.items()
    }
    assert mirrored == source_state(binlog_mariadb, binlog_db)
    assert version_regressions(sink.records) == []
    assert sink.modes() == {"copy", "sync"}


def test_a_column_that_changes_type_stops_the_capture_with_one_line(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute("CREATE TABLE retyped (id INT PRIMARY KEY, v INT)", database=binlog_db)
    opts = BinlogOptions(
        binlog_mariadb.dsn(binlog_db), ("retyped",), 102, str(tmp_path / "state"), snapshot="never"
    )
    running = Running(opts, tmp_path / "log")
    binlog_mariadb.execute("INSERT INTO retyped VALUES (1, 1)", database=binlog_db)
    binlog_mariadb.execute("ALTER TABLE retyped MODIFY v VARCHAR(20)", database=binlog_db)
    binlog_mariadb.execute("INSERT INTO retyped VALUES (2, 'two')", database=binlog_db)
    wait_until(lambda: running.error is not None, timeout=30, message="the capture to stop")
    text = str(running.error)
    assert isinstance(running.error, CdcError) and "\n" not in text
    assert f"column v of {binlog_db}.retyped changed type" in text
    with pytest.raises(CdcError):
        running.close()
    # What came before the change is in the journal; nothing after it.
    assert [r["key"] for r in capture_records(tmp_path / "log")] == ["1"]
