"""The database adapter edge: open connections for each dialect, run SQL, map driver errors.

Our own connections run in autocommit mode and take explicit transactions through
:meth:`Database.transaction`, so every statement's transactional scope is visible in code.
(User connections handed to the stasher are never touched this way.)
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from sluiceway.db.dsn import DataSource, Dialect, parse_dsn
from sluiceway.errors import DatabaseError, DatabaseUnavailableError, SluicewayError

Params = dict[str, Any] | Sequence[Any] | None


def _driver_errors() -> tuple[type[BaseException], ...]:
    import psycopg
    import pymysql

    return (psycopg.Error, pymysql.err.Error, sqlite3.Error)


def _is_unavailable(exc: BaseException) -> bool:
    import psycopg
    import pymysql

    if isinstance(exc, psycopg.OperationalError | pymysql.err.OperationalError | pymysql.err.InterfaceError):
        return True
    return isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc)


def map_db_error(exc: BaseException, what: str) -> SluicewayError:
    """Translate a driver exception into our tree; the one place that knows driver types."""
    if isinstance(exc, SluicewayError):
        return exc
    cls = DatabaseUnavailableError if _is_unavailable(exc) else DatabaseError
    return cls(f"{what}: {type(exc).__name__}: {str(exc).strip()}")


def open_raw(source: DataSource, *, connect_timeout: float = 5.0) -> Any:
    """Open a driver connection in autocommit mode."""
    try:
        if source.dialect is Dialect.POSTGRES:
            import psycopg

            return psycopg.connect(
                source.target, autocommit=True, connect_timeout=max(1, int(connect_timeout))
            )
        if source.dialect is Dialect.SQLITE:
            conn = sqlite3.connect(
                source.target, isolation_level=None, timeout=connect_timeout, check_same_thread=False
            )
            # WAL lets the harvester read while application threads write; busy_timeout makes
            # writers wait for each other instead of failing with "database is locked".
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(connect_timeout * 1000)}")
            return conn
        import pymysql

        kwargs = dict(source.mysql_kwargs)
        return pymysql.connect(
            autocommit=True,
            connect_timeout=connect_timeout,
            charset="utf8mb4",
            **kwargs,
        )
    except _driver_errors() as exc:
        raise DatabaseUnavailableError(f"cannot connect to {source.redacted()}: {str(exc).strip()}") from exc


class Database:
    """One connection of ours, with reconnect and error mapping. Not shared across threads.

    >>> db = Database("sqlite:///:memory:")
    >>> db.fetchall("SELECT 1")
    [(1,)]
    """

    def __init__(self, dsn: str | DataSource, *, connect_timeout: float = 5.0) -> None:
        self.source = dsn if isinstance(dsn, DataSource) else parse_dsn(dsn)
        self.dialect = self.source.dialect
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        self._in_tx = False
        self._lock = threading.RLock()

    # -- connection lifecycle -------------------------------------------------------------
    @property
    def raw(self) -> Any:
        if self._conn is None:
            self._conn = open_raw(self.source, connect_timeout=self._connect_timeout)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- statements ------------------------------------------------------------------------
    def _run(self, sql: str, params: Params, what: str, fetch: bool, many: bool = False) -> Any:
        with self._lock:
            try:
                cur = self.raw.cursor()
                try:
                    if many:
                        cur.executemany(sql, params)
                    elif params is None:
                        cur.execute(sql)
                    else:
                        cur.execute(sql, params)
                    if fetch:
                        return cur.fetchall() if cur.description is not None else []
                    return cur.rowcount
                finally:
                    cur.close()
            except _driver_errors() as exc:
                err = map_db_error(exc, what or sql.split(None, 1)[0])
                if isinstance(err, DatabaseUnavailableError) and not self._in_tx:
                    # The connection is unusable; the next call reconnects.
                    self.close()
                raise err from exc

    def execute(self, sql: str, params: Params = None, *, what: str = "") -> int:
        """Run a statement; return the affected row count."""
        return int(self._run(sql, params, what, fetch=False))

    def executemany(self, sql: str, rows: Sequence[Params], *, what: str = "") -> int:
        return int(self._run(sql, rows, what, fetch=False, many=True))

    def fetchall(self, sql: str, params: Params = None, *, what: str = "") -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._run(sql, params, what, fetch=True)]

    def fetchone(self, sql: str, params: Params = None, *, what: str = "") -> tuple[Any, ...] | None:
        rows = self.fetchall(sql, params, what=what)
        return rows[0] if rows else None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """Run the block in one transaction; commit on success, roll back on any exception.

        On SQLite the transaction begins IMMEDIATE: it takes the write lock up front, so two
        writers queue on busy_timeout instead of deadlocking on a lock upgrade.
        """
        with self._lock:
            if self._in_tx:
                raise DatabaseError("nested transactions are not supported")
            begin = {
                Dialect.POSTGRES: "BEGIN",
                Dialect.SQLITE: "BEGIN IMMEDIATE",
                Dialect.MYSQL: "START TRANSACTION",
            }[self.dialect]
            self.execute(begin, what="begin")
            self._in_tx = True
            try:
                yield self
            except BaseException:
                self._in_tx = False
                with contextlib.suppress(Exception):
                    self.execute("ROLLBACK", what="rollback")
                raise
            self._in_tx = False
            try:
                self.execute("COMMIT", what="commit")
            except DatabaseError:
                # Commit outcome unknown: the caller must treat the work as possibly done.
                self.close()
                raise
