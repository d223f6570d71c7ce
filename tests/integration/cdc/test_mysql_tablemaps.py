"""Table-map events parsed once per distinct event: the rows decode exactly as the library's own
parse decodes them, across an ``ALTER TABLE`` (new bytes, parsed afresh), and the memo is hit."""

from __future__ import annotations

from typing import Any

from sluiceway.cdc.mysql import tablemaps
from sluiceway.testing import PrivateMariaDB


def rows(db: PrivateMariaDB, start: tuple[str, int], end: int, *, memo: dict[bytes, Any] | None) -> list[Any]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": db.port, "user": "root", "password": ""},
        server_id=7311 if memo is not None else 7310, blocking=True, resume_stream=True,
        log_file=start[0], log_pos=start[1],
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent], enable_logging=False,
    )  # fmt: skip
    if memo is not None:
        tablemaps.install()
        stream.table_map = tablemaps.TableMap(memo)
    out: list[Any] = []
    try:
        for event in stream:
            if isinstance(event, XidEvent):
                if event.packet.log_pos >= end:
                    break
                continue
            names = [
                (c.name, c.type, c.unsigned, getattr(c, "character_set_name", None)) for c in event.columns
            ]
            out.append((type(event).__name__, event.schema, event.table, names, event.rows))
    finally:
        stream.close()
    return out


def test_memoized_table_maps_decode_as_the_library_does_across_an_alter(
    binlog_mariadb: PrivateMariaDB, binlog_db: str
) -> None:
    db = binlog_mariadb
    db.execute(
        "CREATE TABLE memo (id INT UNSIGNED PRIMARY KEY, name VARCHAR(20) CHARACTER SET latin1, "
        "amount DECIMAL(8, 2), at DATETIME(3))",
        database=binlog_db,
    )
    db.execute("CREATE TABLE other (k VARCHAR(10) PRIMARY KEY, v BLOB)", database=binlog_db)
    name, pos = db.execute("SHOW MASTER STATUS")[0][:2]
    for i in range(40):
        db.execute(
            "INSERT INTO memo (id, name, amount, at) VALUES (%s, %s, %s, '2024-05-01 12:00:00.125')",
            (i, f"é{i}", i / 4),
            database=binlog_db,
        )
        db.execute("INSERT INTO other VALUES (%s, %s)", (f"k{i}", bytes([i, 255])), database=binlog_db)
        if i == 20:
            db.execute("ALTER TABLE memo ADD COLUMN extra INT NOT NULL DEFAULT 7", database=binlog_db)
        if i % 5 == 0:
            db.execute("UPDATE memo SET amount = amount + 1 WHERE id <= %s", (i,), database=binlog_db)
    db.execute("DELETE FROM other WHERE k = 'k3'", database=binlog_db)
    end = int(db.execute("SHOW MASTER STATUS")[0][1])

    plain = rows(db, (str(name), int(pos)), end, memo=None)
    memo: dict[bytes, Any] = {}
    memoized = rows(db, (str(name), int(pos)), end, memo=memo)
    assert len(plain) == 89 and memoized == plain  # 80 inserts, 8 updates, a delete
    assert any("extra" in [c[0] for c in r[3]] for r in memoized if r[2] == "memo")
    # Three distinct table maps (memo before and after the ALTER, other) parsed among 89: the
    # rest were the memo's.
    assert len(memo) == 3
