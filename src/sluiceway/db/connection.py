"""The database adapter edge: open connections for each dialect, run SQL, map driver errors.

Our own connections run in autocommit mode and take explicit transactions through
:meth:`Database.transaction`, so every statement's transactional scope is visible in code.
(User connections handed to the stasher are never touched this way.)
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sluiceway.db.dsn import DataSource, Dialect, parse_dsn
from sluiceway.db.writers import POLL_SECONDS, gate_for, is_write
from sluiceway.errors import (
    Cause,
    ConflictError,
    DatabaseError,
    DatabaseRefusedError,
    DatabaseUnavailableError,
    DeadlockError,
    LockTimeoutError,
    NoSuchDatabaseError,
    SluicewayError,
)

Params = dict[str, Any] | Sequence[Any] | None


def _driver_errors() -> tuple[type[BaseException], ...]:
    import psycopg
    import pymysql

    return (psycopg.Error, pymysql.err.Error, sqlite3.Error)


# Driver errors are classified by code, never by message text (messages are localised, reworded
# between versions, and may quote user data).
_PG_CONFLICTS: dict[str, type[DatabaseError]] = {
    "40001": ConflictError,  # serialization_failure: the transaction was rolled back
    "40P01": DeadlockError,  # deadlock_detected: likewise
}
_PG_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired, or NOWAIT found the row locked
# The server refused us for good: waiting will not help, so these are never retried. The cause
# (privilege, missing, authentication) is what sluiceway.db.classify names the fix by.
_Refusal = tuple[type[DatabaseError], Cause]
_PG_REFUSED: dict[str, _Refusal] = {
    "3D000": (NoSuchDatabaseError, Cause.MISSING),  # invalid_catalog_name: no such database
    "3F000": (DatabaseRefusedError, Cause.MISSING),  # invalid_schema_name: no such schema
    "42P01": (DatabaseRefusedError, Cause.MISSING),  # undefined_table
    "28P01": (DatabaseRefusedError, Cause.AUTHENTICATION),  # invalid_password
    # invalid_authorization_specification: no such role, may not log in, pg_hba.conf
    "28000": (DatabaseRefusedError, Cause.AUTHENTICATION),
    # insufficient_privilege: no CONNECT privilege, no CREATE on a schema, none on a table
    "42501": (DatabaseRefusedError, Cause.PRIVILEGE),
}
# libpq keeps the SQLSTATE of an error that ends the connection start-up to itself: psycopg's
# ``sqlstate`` is None there (seen with psycopg 3.3 and libpq 18; the PGresult is not exposed).
# So for a failed connect only, and only when no code came with it, the server's own words (its
# English ones; a localised server's refusal stays transient: retried, never wrongly final) name
# the code. This is the one place the text of a driver error decides anything.
_PG_CONNECT_REFUSALS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("3D000", re.compile(r'FATAL:\s+database ".*" does not exist')),
    ("28P01", re.compile(r"FATAL:\s+password authentication failed for user")),
    ("28000", re.compile(r'FATAL:\s+(role ".*" does not exist|role ".*" is not permitted to log in)')),
    ("28000", re.compile(r"FATAL:\s+(no pg_hba\.conf entry|pg_hba\.conf rejects connection)")),
    ("28000", re.compile(r"FATAL:\s+\w+ authentication failed for user")),  # ident, peer, md5…
    ("42501", re.compile(r'FATAL:\s+permission denied for database ".*"')),
)
_MYSQL_REFUSED: dict[int, _Refusal] = {
    1049: (NoSuchDatabaseError, Cause.MISSING),  # ER_BAD_DB_ERROR: unknown database
    1146: (DatabaseRefusedError, Cause.MISSING),  # ER_NO_SUCH_TABLE
    1044: (DatabaseRefusedError, Cause.PRIVILEGE),  # ER_DBACCESS_DENIED_ERROR: no access to that database
    1142: (DatabaseRefusedError, Cause.PRIVILEGE),  # ER_TABLEACCESS_DENIED_ERROR: CREATE, INSERT… denied
    1143: (DatabaseRefusedError, Cause.PRIVILEGE),  # ER_COLUMNACCESS_DENIED_ERROR
    1227: (DatabaseRefusedError, Cause.PRIVILEGE),  # ER_SPECIFIC_ACCESS_DENIED_ERROR (SUPER…)
    1045: (DatabaseRefusedError, Cause.AUTHENTICATION),  # ER_ACCESS_DENIED_ERROR: wrong user or password
    1698: (DatabaseRefusedError, Cause.AUTHENTICATION),  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR
}
_MYSQL_DEADLOCK = 1213  # ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back
_MYSQL_LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT: only the statement (innodb_rollback_on_timeout=OFF)
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CANTOPEN = 5, 6, 14  # primary result codes
# By primary result code: a file this user may not write, or cannot open at all (its directory
# missing or not ours), stays so however long we wait.
_SQLITE_REFUSED: dict[int, _Refusal] = {
    3: (DatabaseRefusedError, Cause.PRIVILEGE),  # SQLITE_PERM
    8: (DatabaseRefusedError, Cause.PRIVILEGE),  # SQLITE_READONLY (and its extended codes)
    _SQLITE_CANTOPEN: (DatabaseRefusedError, Cause.MISSING),  # SQLITE_CANTOPEN
    23: (DatabaseRefusedError, Cause.PRIVILEGE),  # SQLITE_AUTH
}
_SQLITE_BUSY_SNAPSHOT = 517  # WAL: our read snapshot went stale before our write; retry the transaction
# Read-only for now, mended by opening the file again: WAL recovery another connection will run
# (SQLITE_READONLY_RECOVERY), the file replaced under us (SQLITE_READONLY_DBMOVED).
_SQLITE_REOPEN = frozenset({264, 1032})


def _classify(exc: BaseException) -> tuple[type[DatabaseError], str | None, Cause | None]:
    """Our error type for a driver exception, the driver's code (as text) when it has one, and
    for a refusal its cause."""
    import psycopg
    import pymysql

    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state in _PG_CONFLICTS:
            return _PG_CONFLICTS[state], state, None
        if state == _PG_LOCK_NOT_AVAILABLE:
            return LockTimeoutError, state, None
        if state in _PG_REFUSED:
            cls, cause = _PG_REFUSED[state]
            return cls, state, cause
        return (
            (DatabaseUnavailableError if isinstance(exc, psycopg.OperationalError) else DatabaseError),
            state,
            None,
        )
    if isinstance(exc, pymysql.err.Error):
        errno = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        code = None if errno is None else str(errno)
        if errno == _MYSQL_DEADLOCK:
            return DeadlockError, code, None
        if errno == _MYSQL_LOCK_WAIT_TIMEOUT:
            return LockTimeoutError, code, None
        if errno in _MYSQL_REFUSED:
            cls, cause = _MYSQL_REFUSED[errno]
            return cls, code, cause
        unavailable = isinstance(exc, pymysql.err.OperationalError | pymysql.err.InterfaceError)
        return (DatabaseUnavailableError if unavailable else DatabaseError), code, None
    if isinstance(exc, sqlite3.Error):
        extended: int | None = getattr(exc, "sqlite_errorcode", None)
        name: str | None = getattr(exc, "sqlite_errorname", None)
        if extended == _SQLITE_BUSY_SNAPSHOT:
            return ConflictError, name, None
        primary = None if extended is None else extended & 0xFF
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return LockTimeoutError, name, None
        if extended in _SQLITE_REOPEN:
            return DatabaseUnavailableError, name, None
        if primary in _SQLITE_REFUSED:
            cls, cause = _SQLITE_REFUSED[primary]
            return cls, name, cause
        return DatabaseError, name, None
    return DatabaseError, None, None


def _classify_connect(exc: BaseException) -> tuple[type[DatabaseError], str | None, Cause | None]:
    """Like :func:`_classify`, for an error that ended a connection attempt: a refusal (see
    ``_PG_REFUSED``) is permanent; anything else is the server being out of reach, for now."""
    import psycopg

    cls, code, cause = _classify(exc)
    if isinstance(exc, psycopg.ProgrammingError):  # libpq refused the string itself (an unknown option)
        return DatabaseRefusedError, code, Cause.CONFIGURATION
    if code is None and isinstance(exc, psycopg.OperationalError):
        text = str(exc)
        code = next((state for state, words in _PG_CONNECT_REFUSALS if words.search(text)), None)
        cls, cause = _PG_REFUSED.get(code or "", (cls, cause))
    if issubclass(cls, DatabaseRefusedError):
        return cls, code, cause
    return DatabaseUnavailableError, code, None


def map_db_error(exc: BaseException, what: str) -> SluicewayError:
    """Translate a driver exception into our tree; the one place that knows driver types."""
    if isinstance(exc, SluicewayError):
        return exc
    cls, code, cause = _classify(exc)
    text = str(exc).strip()
    detail = text.splitlines()[0] if text else type(exc).__name__
    return cls(f"{what}: {type(exc).__name__}: {text}", code=code, detail=detail, cause=cause)


def open_raw(
    source: DataSource,
    *,
    connect_timeout: float = 5.0,
    read_only: bool = False,
    what: str = "",
    **pg_options: Any,
) -> Any:
    """Open a driver connection in autocommit mode.

    ``read_only``: for commands that only look. SQLite then opens the file with ``mode=ro``
    (a missing file is :class:`NoSuchDatabaseError`, not a new empty database) and leaves its
    journal mode alone; the server databases are only read by such commands' statements.
    ``what``: the failure's wording (default "cannot connect to <dsn>"). ``pg_options``: more
    libpq settings for a PostgreSQL connection (``application_name``, keepalives).
    """
    if read_only and source.dialect is Dialect.SQLITE and source.target != ":memory:":
        return _open_sqlite_read_only(source, connect_timeout)
    try:
        if source.dialect is Dialect.POSTGRES:
            import psycopg

            return psycopg.connect(
                source.target, autocommit=True, connect_timeout=max(1, int(connect_timeout)), **pg_options
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
        raise connect_error(exc, what or f"cannot connect to {source.redacted()}") from exc


def connect_error(exc: BaseException, what: str) -> DatabaseError:
    """Our error for a failed connection attempt: a refusal (a wrong password, no such database)
    is final; anything else is the server being out of reach, for now."""
    cls, code, cause = _classify_connect(exc)
    text = str(exc).strip()
    detail = text.splitlines()[0] if text else type(exc).__name__
    return cls(f"{what}: {text}", code=code, detail=detail, cause=cause)


def _open_sqlite_read_only(source: DataSource, connect_timeout: float) -> Any:
    path = Path(source.target)
    if not path.is_file():
        raise NoSuchDatabaseError(f"database file {source.target} does not exist")
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro",
            uri=True,
            isolation_level=None,
            timeout=connect_timeout,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout={int(connect_timeout * 1000)}")
    except sqlite3.Error as exc:
        raise DatabaseUnavailableError(
            f"cannot open {source.redacted()} for reading: {str(exc).strip()}", code=_classify(exc)[1]
        ) from exc
    return conn


class Database:
    """One connection of ours, with reconnect and error mapping. Not shared across threads.

    >>> db = Database("sqlite:///:memory:")
    >>> db.fetchall("SELECT 1")
    [(1,)]
    """

    def __init__(
        self,
        dsn: str | DataSource,
        *,
        connect_timeout: float = 5.0,
        on_connect: Callable[[Any], object] | None = None,
        read_only: bool = False,
        busy_timeout: float | None = None,
        urgent: bool = False,
    ) -> None:
        self.source = dsn if isinstance(dsn, DataSource) else parse_dsn(dsn)
        self.dialect = self.source.dialect
        self._connect_timeout = connect_timeout
        #: SQLite: how long a statement waits for the write lock (this process's other writers
        #: first, then other processes') before :class:`LockTimeoutError`; default connect_timeout.
        self.busy_timeout = connect_timeout if busy_timeout is None else busy_timeout
        #: SQLite: this connection's writes go to the head of the process's queue (a lease).
        self.urgent = urgent
        self._gate = (
            gate_for(self.source.target) if self.dialect is Dialect.SQLITE and not read_only else None
        )
        self._gate_held = False
        self._sqlite = self.dialect is Dialect.SQLITE
        #: Only reads: SQLite opens the file read-only (see :func:`open_raw`).
        self.read_only = read_only
        #: Called with each new driver connection (session settings), before any statement.
        self._on_connect = on_connect
        self._conn: Any = None
        self._in_tx = False
        self._lock = threading.RLock()

    # -- connection lifecycle -------------------------------------------------------------
    @property
    def raw(self) -> Any:
        if self._conn is None:
            conn = open_raw(self.source, connect_timeout=self._connect_timeout, read_only=self.read_only)
            if self._on_connect is not None:
                try:
                    self._on_connect(conn)
                except _driver_errors() as exc:
                    with contextlib.suppress(Exception):
                        conn.close()
                    raise map_db_error(exc, "session set-up") from exc
            if self.dialect is Dialect.SQLITE:
                # Short tries of SQLite's own busy handler; _run asks again between them.
                conn.execute(f"PRAGMA busy_timeout={int(POLL_SECONDS * 1000)}")
            self._conn = conn
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
        """Every statement's one way in: the driver's call; on SQLite, waiting for the write lock."""
        if self._sqlite:
            return self._run_sqlite(sql, params, what, fetch, many)
        return self._run_once(sql, params, what, fetch, many)

    def _run_sqlite(self, sql: str, params: Params, what: str, fetch: bool, many: bool = False) -> Any:
        with self._lock:
            if self._in_tx:
                return self._run_once(sql, params, what, fetch, many)
            # Outside a transaction (or its BEGIN / COMMIT): wait for the write lock.
            deadline = time.monotonic() + self.busy_timeout
            with self._writing(what or sql, deadline) if is_write(sql) else contextlib.nullcontext():
                while True:
                    try:
                        return self._run_once(sql, params, what, fetch, many)
                    except LockTimeoutError:
                        if time.monotonic() >= deadline:
                            raise
                        time.sleep(0.001)  # "database is locked": the statement did nothing; again

    @contextlib.contextmanager
    def _writing(self, what: str, deadline: float) -> Iterator[None]:
        """Hold this process's turn to write the file (see :mod:`sluiceway.db.writers`)."""
        if self._gate is None or self._gate_held:
            yield
            return
        if not self._gate.acquire(timeout=max(0.0, deadline - time.monotonic()), urgent=self.urgent):
            raise LockTimeoutError(
                f"{what.split(None, 1)[0] if what else 'write'}: database is locked: this process's "
                f"other writers held it for {self.busy_timeout:.1f}s",
                code="SQLITE_BUSY",
            )
        self._gate_held = True
        try:
            yield
        finally:
            self._gate_held = False
            self._gate.release()

    def _run_once(self, sql: str, params: Params, what: str, fetch: bool, many: bool = False) -> Any:
        """The driver's call."""
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
        writers wait for each other instead of deadlocking on a lock upgrade (this process's
        writers in turn, see :mod:`sluiceway.db.writers`).
        """
        with self._lock:
            if self._in_tx:
                raise DatabaseError("nested transactions are not supported")
            begin = {
                Dialect.POSTGRES: "BEGIN",
                Dialect.SQLITE: "BEGIN IMMEDIATE",
                Dialect.MYSQL: "START TRANSACTION",
            }[self.dialect]
            # SQLite: our turn to write is held from BEGIN to COMMIT (or ROLLBACK).
            with self._writing("begin", time.monotonic() + self.busy_timeout):
                yield from self._transaction(begin)

    def _transaction(self, begin: str) -> Iterator[Database]:
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
