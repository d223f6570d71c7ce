"""The MariaDB/MySQL edge of change data capture: the set-up checks, the tables, the copy's
chunks and watermarks, the binary logs. One :class:`BinlogSession` is one PyMySQL connection
(autocommit, ``time_zone = '+00:00'`` so TIMESTAMP values read the same as in the binlog).

The copy's watermarks are rows of a small table of ours, ``sluice_cdc_watermarks`` in the DSN's
database: an ``INSERT`` commits in its own transaction, so it takes its place in the binlog
between the application's transactions, where the capture's reader sees it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.model import Snapshot
from sluiceway.cdc.mysql.assemble import position
from sluiceway.cdc.mysql.values import json_value, key_text, parse_time, row_json
from sluiceway.db.connection import map_db_error
from sluiceway.db.dsn import Dialect, parse_dsn

#: The table of the copy's watermarks, in the DSN's database.
WATERMARKS = "sluice_cdc_watermarks"
_BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
#: No snapshot: the binlog's copy drops by keys seen in the window alone (see ``assemble``).
NO_SNAPSHOT = Snapshot(0, 0, frozenset())


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True, slots=True)
class BinlogTable:
    schema: str
    name: str
    #: Every column, in table order, with its ``DATA_TYPE``.
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    @property
    def namespace(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}"


@dataclass(frozen=True, slots=True)
class ChunkRead:
    snapshot: Snapshot
    read_time: int
    keys: pa.Array
    values: pa.Array
    #: Where the next chunk starts: the last row's key values as JSON texts.
    last: list[str] | None
    done: bool


def binlog_number(name: str) -> int:
    """``binlog.000042`` → 42."""
    suffix = name.rpartition(".")[2]
    if not suffix.isdigit():
        raise CdcError(f"binary log {name!r} has no sequence number")
    return int(suffix)


class BinlogSession:
    """One connection of the capture (not shared between threads)."""

    def __init__(self, dsn: str, epoch: int = 0) -> None:
        source = parse_dsn(dsn)
        if source.dialect is not Dialect.MYSQL:
            raise CdcError(f"not a MariaDB/MySQL DSN: {source.redacted()} (mysql://user:pass@host:port/db)")
        self.dsn = dsn
        self.database = str(dict(source.mysql_kwargs)["database"])
        self.kwargs = dict(source.mysql_kwargs)
        #: The epoch of the positions this session gives (:mod:`~sluiceway.cdc.mysql.gtid`).
        self.epoch = epoch
        self._conn: Any = None

    @property
    def settings(self) -> dict[str, Any]:
        """Connection settings for the binlog reader."""
        k = self.kwargs
        return {"host": k["host"], "port": int(str(k["port"])), "user": k["user"], "password": k["password"]}

    def _connection(self) -> Any:
        if self._conn is None:
            import pymysql

            try:
                self._conn = pymysql.connect(
                    autocommit=True, connect_timeout=5, init_command="SET time_zone = '+00:00'", **self.kwargs
                )
            except pymysql.err.Error as exc:
                raise map_db_error(exc, "MariaDB/MySQL") from None
        return self._conn

    def rows(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        import pymysql

        try:
            with self._connection().cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        except pymysql.err.Error as exc:
            self.close()
            raise map_db_error(exc, "MariaDB/MySQL") from None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a connection the server already cut
                self._conn.close()
            self._conn = None

    # -- the server --------------------------------------------------------------------------------
    def variables(self) -> dict[str, str]:
        names = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "server_id")
        found = self.rows("SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s, %s, %s, %s, %s)", names)
        return {str(k).lower(): str(v) for k, v in found}

    def check_server(self) -> None:
        """The binary log as row events with full images and column names, and our grants: one
        line naming the first thing missing and the setting that mends it."""
        found = self.variables()
        if found.get("log_bin", "OFF").upper() != "ON":
            raise CdcError(
                "the server's binary log is off: start it with log_bin (and binlog_format=ROW, "
                "binlog_row_image=FULL, binlog_row_metadata=FULL) to capture changes"
            )
        for name, wanted in (("binlog_format", "ROW"), ("binlog_row_image", "FULL")):
            if found.get(name, "").upper() != wanted:
                raise CdcError(
                    f"{name} is {found.get(name)!r}: the capture needs {name}={wanted} "
                    f"(SET GLOBAL {name} = '{wanted}')"
                )
        metadata = found.get("binlog_row_metadata")
        if metadata is None:
            raise CdcError(
                "this server has no binlog_row_metadata: the capture needs MariaDB 10.5+ or MySQL 8.0+"
            )
        if metadata.upper() != "FULL":
            raise CdcError(
                f"binlog_row_metadata is {metadata!r}: the capture needs FULL, so that each row event "
                "names its columns (SET GLOBAL binlog_row_metadata = 'FULL')"
            )
        self.check_grants()

    def check_grants(self) -> None:
        grants = " ".join(str(r[0]).upper() for r in self.rows("SHOW GRANTS"))
        if "ALL PRIVILEGES ON *.*" in grants:
            return
        globals_ = " ".join(g for g in re.findall(r"GRANT (.*?) ON \*\.\*", grants))
        missing = [p for p in ("REPLICATION SLAVE", "REPLICATION CLIENT") if p not in globals_]
        if "REPLICATION CLIENT" in missing and "BINLOG MONITOR" in globals_:
            missing.remove("REPLICATION CLIENT")  # MariaDB 10.5+'s name for it
        if missing:
            raise CdcError(
                f"this user lacks {' and '.join(missing)}: GRANT REPLICATION SLAVE, REPLICATION CLIENT "
                "ON *.* TO <the user> (reading the binlog as a replica needs both)"
            )

    def binary_logs(self) -> dict[int, str]:
        """The binary logs the server still has, by sequence number."""
        return {number: name for number, (name, _size) in self.binary_log_sizes().items()}

    def binary_log_sizes(self) -> dict[int, tuple[str, int]]:
        """The binary logs the server still has, by sequence number: name and size in bytes."""
        return {binlog_number(str(r[0])): (str(r[0]), int(r[1])) for r in self.rows("SHOW BINARY LOGS")}

    def current(self) -> int:
        """The end of the binlog now (``SHOW MASTER STATUS``), as a position."""
        found = self.rows("SHOW MASTER STATUS")
        if not found:
            raise CdcError("SHOW MASTER STATUS returned nothing: is the binary log on?")
        return position(binlog_number(str(found[0][0])), int(found[0][1]), self.epoch)

    def server_id(self) -> int:
        return int(self.rows("SELECT @@server_id")[0][0])

    def read_only(self) -> bool:
        """``read_only`` is on (a replica, as a rule): the capture must write nothing there."""
        return str(self.rows("SELECT @@read_only")[0][0]).upper() not in ("0", "OFF")

    def gtid_binlog_pos(self) -> str:
        """The last GTID of each domain in this server's binlog (MariaDB)."""
        return str(self.rows("SELECT @@gtid_binlog_pos")[0][0] or "")

    def is_mariadb(self) -> bool:
        return "mariadb" in str(self.rows("SELECT VERSION()")[0][0]).lower()

    def gtid_binlog_state(self) -> str:
        """The last GTID of each domain and server in this server's binlog (MariaDB)."""
        return str(self.rows("SELECT @@gtid_binlog_state")[0][0] or "")

    def gtid_at(self, file: str, pos: int) -> str:
        """MariaDB's GTID state at ``file``:``pos`` (an event boundary of this server's binlog;
        the server reads the file up to there): the last GTID per domain, ``""`` for none."""
        found = self.rows("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))[0][0]
        return "" if found is None else str(found)

    # -- tables ------------------------------------------------------------------------------------
    def resolve_tables(self, tables: Sequence[str] | str) -> list[BinlogTable]:
        """The captured tables (``db.table`` names, a bare name in the DSN's database, or one
        regular expression over ``db.table``): each must exist and have a primary key."""
        found = self.rows(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
            "AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')"
        )
        known = {f"{s}.{t}": (str(s), str(t)) for s, t in found}
        if isinstance(tables, str):
            pattern = re.compile(tables)
            names = sorted(n for n in known if pattern.fullmatch(n) and not n.endswith(f".{WATERMARKS}"))
            if not names:
                raise CdcError(f"no table matches {tables!r}")
        else:
            names = [t if "." in t else f"{self.database}.{t}" for t in tables]
        out, seen = [], set()
        for name in names:
            if name in seen:
                raise CdcError(f"table {name} is listed twice")
            seen.add(name)
            if name not in known:
                raise CdcError(f"table {name} does not exist (or this user may not see it)")
            out.append(self.describe(*known[name]))
        return out

    def describe(self, schema: str, name: str) -> BinlogTable:
        columns = self.rows(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (schema, name),
        )
        key = self.rows(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (schema, name),
        )
        if not key:
            raise CdcError(
                f"table {schema}.{name} has no primary key: the capture keys every change by it "
                f"(ALTER TABLE {quote(schema)}.{quote(name)} ADD PRIMARY KEY (…))"
            )
        return BinlogTable(
            schema, name, tuple((str(c), str(t).lower()) for c, t in columns), tuple(str(k[0]) for k in key)
        )

    # -- the copy ----------------------------------------------------------------------------------
    def ensure_watermarks(self, prefix: str) -> None:
        """The watermark table, emptied of ``prefix``'s rows: a watermark counts where the binlog
        has it, its row is never read back, so the rows of earlier runs are only clutter."""
        table = f"{quote(self.database)}.{quote(WATERMARKS)}"
        self.rows(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "id BIGINT AUTO_INCREMENT PRIMARY KEY, capture VARCHAR(100) NOT NULL, "
            "mark VARCHAR(400) NOT NULL, at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB"
        )
        self.rows(f"DELETE FROM {table} WHERE capture = %s", (prefix,))

    def emit(self, prefix: str, content: str) -> int:
        """Write a watermark (its own transaction); a position at or past its end in the binlog."""
        self.rows(
            f"INSERT INTO {quote(self.database)}.{quote(WATERMARKS)} (capture, mark) VALUES (%s, %s)",
            (prefix, content),
        )
        return self.current()

    def read_chunk(self, table: BinlogTable, after: list[str] | None, size: int) -> ChunkRead:
        """The next ``size`` rows of ``table`` after the key ``after`` (key order)."""
        names = [c for c, _t in table.columns]
        types = dict(table.columns)
        # TIME as text, parsed here (PyMySQL decodes a negative TIME with a fraction wrongly).
        times = [i for i, (_c, t) in enumerate(table.columns) if t == "time"]
        select = ", ".join(f"CAST({quote(c)} AS CHAR)" if types[c] == "time" else quote(c) for c in names)
        keys = ", ".join(quote(k) for k in table.key)
        where, args = "", None
        if after:
            where = f"WHERE ({keys}) > ({', '.join(['%s'] * len(after))})"
            args = [_parameter(text, types[k]) for text, k in zip(after, table.key, strict=True)]
        read_time = int(time.time() * 1_000_000)
        rows = self.rows(
            f"SELECT {select} FROM {table.sql_name} {where} ORDER BY {keys} LIMIT %s", [*(args or []), size]
        )
        if times:
            rows = [
                tuple(parse_time(v) if i in times and v is not None else v for i, v in enumerate(row))
                for row in rows
            ]
        at = [names.index(k) for k in table.key]
        key_texts = [key_text([row[i] for i in at]) for row in rows]
        values = [row_json(names, dict(zip(names, row, strict=True))) for row in rows]
        last = [json_value(rows[-1][i]) for i in at] if rows else after
        return ChunkRead(
            NO_SNAPSHOT,
            read_time,
            pa.array(key_texts, pa.string()),
            pa.array(values, pa.binary()),
            last,
            len(rows) < size,
        )


def _parameter(text: str, data_type: str) -> Any:
    """A saved key value (its JSON text) as a query parameter of its column's type."""
    if not text.startswith('"'):
        return text  # a number: compared as the column's type
    import json

    value = json.loads(text)
    if data_type in _BINARY and value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return value
