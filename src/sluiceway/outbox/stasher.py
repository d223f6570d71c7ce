"""The stasher: writes outbox rows inside the caller's own transaction.

It never begins, commits or rolls back: the row becomes visible exactly when the caller's
transaction commits, together with the business change it belongs to.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sluiceway.db import Dialect, map_db_error
from sluiceway.db.identifiers import check_identifier
from sluiceway.errors import InvalidRecordError, SluicewayError
from sluiceway.outbox.record import (
    DEFAULT_MAX_KEY_LENGTH,
    DEFAULT_MAX_VALUE_BYTES,
    OutboxRecord,
    validate_record,
)
from sluiceway.outbox.table import OutboxLayout, encode_headers, queries
from sluiceway.tracing import TRACEPARENT, trace_headers


def _connection_kind(conn: Any) -> tuple[Dialect, str]:
    """Which dialect a user connection speaks, and how to run SQL on it ("dbapi" or "sqlalchemy")."""
    if isinstance(conn, sqlite3.Connection):
        return Dialect.SQLITE, "dbapi"
    module = type(conn).__module__
    if module.startswith("psycopg"):
        return Dialect.POSTGRES, "dbapi"
    if module.startswith("pymysql") or module.startswith("MySQLdb"):
        return Dialect.MYSQL, "dbapi"
    dialect = getattr(conn, "dialect", None)
    if dialect is not None and hasattr(conn, "exec_driver_sql"):
        name = getattr(dialect, "name", "")
        mapping = {
            "postgresql": Dialect.POSTGRES,
            "sqlite": Dialect.SQLITE,
            "mysql": Dialect.MYSQL,
            "mariadb": Dialect.MYSQL,
        }
        if name in mapping:
            return mapping[name], "sqlalchemy"
    raise SluicewayError(
        f"the stasher cannot write through a {type(conn).__module__}.{type(conn).__name__}: "
        "pass a psycopg 3, sqlite3, PyMySQL or SQLAlchemy Connection"
    )


class Stasher:
    """Writes :class:`OutboxRecord` rows to ``table`` in the caller's transaction."""

    def __init__(
        self,
        table: str = "outbox",
        *,
        max_key_length: int = DEFAULT_MAX_KEY_LENGTH,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        binary_value: bool = False,
    ) -> None:
        self.table = check_identifier(table)
        self.max_key_length = max_key_length
        self.max_value_bytes = max_value_bytes
        self.binary_value = binary_value

    def _params(self, dialect: Dialect, record: OutboxRecord) -> tuple[Any, ...]:
        raw = validate_record(
            record, max_key_length=self.max_key_length, max_value_bytes=self.max_value_bytes
        )
        value: Any = raw
        if raw is not None and not self.binary_value:
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidRecordError(
                    "is not UTF-8 text; the kafka_value column is text "
                    "(use binary_value=True with a binary column)",
                    field="value",
                ) from exc
        headers = record.headers
        traced = trace_headers()  # [] unless the caller is inside a recording span
        if traced and not any(name == TRACEPARENT for name, _ in headers):
            headers = [*headers, *traced]
        keys, values = encode_headers(dialect, headers)
        params: tuple[Any, ...] = (record.topic, record.key, value, keys, values)
        if record.partition is not None:
            params += (record.partition,)
        return params

    def stash(self, conn: Any, record: OutboxRecord) -> None:
        """Insert one record through ``conn`` inside its current transaction. Never commits."""
        self.prepare(conn).stash(record)

    def prepare(self, conn: Any) -> PreparedStash:
        """A stasher bound to ``conn`` that reuses one prepared statement for many records."""
        dialect, kind = _connection_kind(conn)
        return PreparedStash(self, conn, dialect, kind)


class PreparedStash:
    """Stashes many records through one connection, reusing the prepared INSERT."""

    def __init__(self, stasher: Stasher, conn: Any, dialect: Dialect, kind: str) -> None:
        self._stasher = stasher
        self._conn = conn
        self._dialect = dialect
        self._kind = kind
        q = queries(dialect, OutboxLayout(stasher.table))
        self._sql = q["stash"]
        self._sql_partition = q["stash_partition"]
        self._cursor: Any = None

    def stash(self, record: OutboxRecord) -> None:
        # Validation happens before any SQL runs: a bad record writes nothing.
        params = self._stasher._params(self._dialect, record)
        sql = self._sql if record.partition is None else self._sql_partition
        try:
            if self._kind == "sqlalchemy":
                self._conn.exec_driver_sql(sql, params)
                return
            if self._cursor is None:
                self._cursor = self._conn.cursor()
            if self._dialect is Dialect.POSTGRES:
                # psycopg 3 prepares the statement server-side and reuses it in this session.
                self._cursor.execute(sql, params, prepare=True)
            else:
                self._cursor.execute(sql, params)
        except SluicewayError:
            raise
        except Exception as exc:
            raise map_db_error(exc, f"stash into {self._stasher.table}") from exc

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def __enter__(self) -> PreparedStash:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
