"""Driver errors become our types by their codes (SQLSTATE, MySQL error number, SQLite result
code), never by their text: real driver exception objects, no database."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import psycopg
import psycopg.errors
import pymysql
import pytest

from sluiceway import (
    ConflictError,
    DatabaseError,
    DatabaseUnavailableError,
    DeadlockError,
    LockTimeoutError,
    SluicewayError,
)
from sluiceway.db import map_db_error
from sluiceway.errors import DatabaseRefusedError, NoSuchDatabaseError


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected"), DeadlockError, "40P01"),
        (psycopg.errors.SerializationFailure("could not serialize access"), ConflictError, "40001"),
        (
            psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
            LockTimeoutError,
            "55P03",
        ),
        (psycopg.OperationalError("connection refused"), DatabaseUnavailableError, None),
        (psycopg.errors.AdminShutdown("terminating connection"), DatabaseUnavailableError, "57P01"),
        (psycopg.errors.UniqueViolation("duplicate key"), DatabaseError, "23505"),
        (pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"), DeadlockError, "1213"),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), LockTimeoutError, "1205"),
        (pymysql.err.OperationalError(2013, "Lost connection to server"), DatabaseUnavailableError, "2013"),
        (pymysql.err.InterfaceError(0, ""), DatabaseUnavailableError, "0"),
        (pymysql.err.IntegrityError(1062, "Duplicate entry"), DatabaseError, "1062"),
    ],
)
def test_driver_errors_map_by_code(exc: Exception, kind: type[DatabaseError], code: str | None) -> None:
    mapped = map_db_error(exc, "claim")
    assert type(mapped) is kind
    assert isinstance(mapped, DatabaseError) and mapped.code == code
    assert str(mapped) == f"claim: {type(exc).__name__}: {str(exc).strip()}"


def test_the_text_decides_nothing() -> None:
    # A unique violation that quotes a partition named "deadlock-…" is not a deadlock, and a
    # deadlock reported in another language still is.
    duplicate = psycopg.errors.UniqueViolation("Key (name)=(deadlock-serialization-7) already exists")
    assert not isinstance(map_db_error(duplicate, "add"), ConflictError)
    assert not isinstance(
        map_db_error(pymysql.err.IntegrityError(1062, "Deadlock found"), "add"), ConflictError
    )
    assert isinstance(
        map_db_error(psycopg.errors.DeadlockDetected("interblocage détecté"), "add"), DeadlockError
    )


def test_a_deadlock_is_a_conflict_and_a_database_error() -> None:
    mapped = map_db_error(pymysql.err.OperationalError(1213, "Deadlock"), "add")
    assert isinstance(mapped, ConflictError) and isinstance(mapped, DatabaseError)
    assert not isinstance(mapped, DatabaseUnavailableError), "the connection is fine: no reconnect"


def test_our_own_errors_pass_through() -> None:
    ours = LockTimeoutError("already mapped", code="1205")
    assert map_db_error(ours, "claim") is ours


@pytest.fixture
def shared_memory() -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    uri = "file:sluiceway_errors?mode=memory&cache=shared"
    first = sqlite3.connect(uri, uri=True, isolation_level=None)
    second = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=0)
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def test_sqlite_locked_is_a_lock_timeout(
    shared_memory: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    first, second = shared_memory
    first.execute("CREATE TABLE t (x)")
    first.execute("BEGIN IMMEDIATE")
    first.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.OperationalError) as caught:
        second.execute("INSERT INTO t VALUES (2)")
    mapped = map_db_error(caught.value, "insert")
    assert type(mapped) is LockTimeoutError and mapped.code == "SQLITE_LOCKED_SHAREDCACHE"


def test_sqlite_cannot_open_is_a_refusal() -> None:
    # A file in a directory that is not there (or not ours) stays unopenable however long we wait.
    with pytest.raises(sqlite3.OperationalError) as caught:
        sqlite3.connect("file:/nonexistent-dir/app.db?mode=rw", uri=True)
    mapped = map_db_error(caught.value, "open")
    assert type(mapped) is DatabaseRefusedError and mapped.code == "SQLITE_CANTOPEN"


@pytest.mark.parametrize(
    ("code", "name", "kind"),
    [
        (5, "SQLITE_BUSY", LockTimeoutError),
        (517, "SQLITE_BUSY_SNAPSHOT", ConflictError),
        (19, "SQLITE_CONSTRAINT", DatabaseError),
    ],
)
def test_sqlite_codes(code: int, name: str, kind: type[SluicewayError]) -> None:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode, exc.sqlite_errorname = code, name
    mapped = map_db_error(exc, "write")
    assert type(mapped) is kind and isinstance(mapped, DatabaseError) and mapped.code == name


def test_sqlite_errors_without_a_code_are_plain_database_errors() -> None:
    mapped = map_db_error(sqlite3.ProgrammingError("Cannot operate on a closed database."), "read")
    assert type(mapped) is DatabaseError and mapped.code is None


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (psycopg.errors.InvalidCatalogName('database "nosuch" does not exist'), NoSuchDatabaseError, "3D000"),
        (psycopg.errors.InvalidPassword("password authentication failed"), DatabaseRefusedError, "28P01"),
        (
            psycopg.errors.InvalidAuthorizationSpecification("no pg_hba.conf entry"),
            DatabaseRefusedError,
            "28000",
        ),
        (
            psycopg.errors.InsufficientPrivilege("permission denied for database"),
            DatabaseRefusedError,
            "42501",
        ),
        (pymysql.err.OperationalError(1049, "Unknown database 'nosuch'"), NoSuchDatabaseError, "1049"),
        (pymysql.err.OperationalError(1045, "Access denied for user"), DatabaseRefusedError, "1045"),
    ],
)
def test_a_refusal_is_permanent_never_unavailable(
    exc: Exception, kind: type[DatabaseError], code: str
) -> None:
    # Unavailable is retried (harvester, feed worker, CDC, pipeline sinks); a refusal never is.
    mapped = map_db_error(exc, "connect")
    assert type(mapped) is kind and isinstance(mapped, DatabaseRefusedError)
    assert not isinstance(mapped, DatabaseUnavailableError) and mapped.code == code
