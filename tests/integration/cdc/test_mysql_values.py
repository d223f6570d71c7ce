"""Every MariaDB column type reads the same in a copied row and in a streamed change, and as
docs/cdc.md's table says (the copy reads through PyMySQL, the stream decodes the binlog)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from sluiceway.cdc.mysql import BinlogCapture, BinlogOptions
from sluiceway.cdc.target import JournalTarget
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import capture_records

TABLE = (
    "CREATE TABLE typed (id INT PRIMARY KEY, ti TINYINT, si SMALLINT UNSIGNED, bi BIGINT, "
    "f FLOAT, d DOUBLE, n DECIMAL(12, 3), b TINYINT(1), c CHAR(3), v VARCHAR(20), t TEXT, "
    "bin VARBINARY(8), bl BLOB, dt DATETIME(6), ts TIMESTAMP(3) NULL, da DATE, tm TIME(2), "
    "e ENUM('red', 'green'), s SET('a', 'b', 'c'), j JSON, y YEAR, nul INT)"
)
ROW = (
    "(%s, -5, 65000, -9007199254740993, 1.5, 2.25, -1234.567, 1, 'ab', 'é \"q\"', 'long text', "
    "X'00ff10', X'0102', '2024-05-01 12:00:00.5', '2024-05-01 12:00:01.250', '2024-05-01', "
    "'-01:30:00.25', 'green', 'a,c', '{\"k\": [1, 2]}', 2024, NULL)"
)
EXPECTED = {
    "ti": -5, "si": 65000, "bi": -9007199254740993, "f": 1.5, "d": 2.25, "n": -1234.567, "b": 1,
    "c": "ab", "v": 'é "q"', "t": "long text", "bin": "\\x00ff10", "bl": "\\x0102",
    "dt": "2024-05-01T12:00:00.5", "ts": "2024-05-01T12:00:01.25", "da": "2024-05-01",
    "tm": "-01:30:00.25", "e": "green", "s": "a,c", "j": '{"k": [1, 2]}', "y": 2024, "nul": None,
}  # fmt: skip


def test_each_type_reads_the_same_copied_and_streamed(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute(TABLE, database=binlog_db)
    binlog_mariadb.execute(f"INSERT INTO typed VALUES {ROW % 1}", database=binlog_db)
    target = JournalTarget(str(tmp_path / "log"))
    capture = BinlogCapture(
        BinlogOptions(binlog_mariadb.dsn(binlog_db), ("typed",), 3301, str(tmp_path / "state")), target
    )
    capture.prepare()
    capture.start()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            capture.run()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until(capture.copy_done.is_set, timeout=30, message="the copy")
        binlog_mariadb.execute(f"INSERT INTO typed VALUES {ROW % 2}", database=binlog_db)
        point = capture.sync_point()
        wait_until(lambda: capture.durable >= point or failed, timeout=30, message="the insert")
    finally:
        capture.stop()
        thread.join(10)
        capture.close()
        target.close()
    assert failed == []
    rows = {r["key"]: r for r in capture_records(tmp_path / "log")}
    copied, streamed = json.loads(rows["1"]["value"]), json.loads(rows["2"]["value"])
    modes = {k: {h["value"] for h in r["headers"] if h["key"] == "sluice.mode"} for k, r in rows.items()}
    assert modes == {"1": {"copy"}, "2": {"sync"}}
    assert (copied["tm"], streamed["tm"]) == (EXPECTED["tm"],) * 2
    assert {k: v for k, v in copied.items() if k != "id"} == EXPECTED
    assert {k: v for k, v in streamed.items() if k != "id"} == EXPECTED


TIMES = ("-01:30:00.25", "-00:00:00.25", "-12:34:56.789", "-00:00:01.5", "-838:59:59.999999",
         "-00:00:00.000001", "01:30:00.25", "-00:00:07")  # fmt: skip


def test_negative_times_with_fractions_read_as_the_server_prints_them(
    binlog_mariadb: PrivateMariaDB, binlog_db: str, tmp_path: Path
) -> None:
    binlog_mariadb.execute(
        "CREATE TABLE times (id INT PRIMARY KEY, a TIME(1), b TIME(2), c TIME(3), d TIME(6), e TIME)",
        database=binlog_db,
    )
    target = JournalTarget(str(tmp_path / "log"))
    options = BinlogOptions(
        binlog_mariadb.dsn(binlog_db), ("times",), 3302, str(tmp_path / "s"), snapshot="never"
    )
    capture = BinlogCapture(options, target)
    capture.prepare()
    capture.start()
    for i, value in enumerate(TIMES):
        binlog_mariadb.execute(
            "INSERT INTO times VALUES (%s, %s, %s, %s, %s, %s)", (i, *[value] * 5), database=binlog_db
        )
    capture.catch_up(timeout=30)
    capture.close()
    target.close()
    streamed = {r["key"]: json.loads(r["value"]) for r in capture_records(tmp_path / "log")}
    server = binlog_mariadb.execute(
        "SELECT id, " + ", ".join(f"CAST({c} AS CHAR)" for c in "abcde") + " FROM times",
        database=binlog_db,
    )
    for row in server:
        got = streamed[str(row[0])]
        for column, text in zip("abcde", row[1:], strict=True):
            # The server pads the fraction to the column's digits; the records trim trailing zeros.
            whole, _, fraction = text.partition(".")
            expected = whole + ("." + fraction.rstrip("0") if fraction.rstrip("0") else "")
            assert got[column] == expected, (row[0], column, got[column], text)
