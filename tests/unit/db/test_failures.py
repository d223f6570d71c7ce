"""One classification for every daemon: a failure is permanent (with its fix) or transient, decided
by codes — SQLSTATE, MySQL/MariaDB error numbers, SQLite result codes, librdkafka error names,
the broker adapters' causes — and the start-up wait built on it. Real driver exception objects,
no server."""

from __future__ import annotations

import errno
import logging
import math
import sqlite3

import psycopg
import psycopg.errors
import pymysql
import pytest
from confluent_kafka import KafkaError, KafkaException

from sluiceway.cdc.errors import CdcError, SlotInUseError, StreamInterrupted
from sluiceway.db import classify
from sluiceway.db.connection import connect_error
from sluiceway.db.failures import STARTUP_GRACE, wait_for_start
from sluiceway.errors import (
    BrokerError,
    Cause,
    ConfigError,
    DatabaseUnavailableError,
    Permanent,
    StartupRefused,
    StartupUnreachable,
    Transient,
)


def _sqlite(code: int, name: str) -> sqlite3.Error:
    exc = sqlite3.OperationalError(name.lower())
    exc.sqlite_errorcode, exc.sqlite_errorname = code, name
    return exc


PERMANENT: list[tuple[BaseException, Cause]] = [
    # PostgreSQL, by SQLSTATE
    (psycopg.errors.InsufficientPrivilege("permission denied for schema public"), Cause.PRIVILEGE),  # 42501
    (psycopg.errors.UndefinedTable('relation "outbox" does not exist'), Cause.MISSING),  # 42P01
    (psycopg.errors.InvalidSchemaName('schema "sluice" does not exist'), Cause.MISSING),  # 3F000
    (psycopg.errors.InvalidCatalogName('database "shop" does not exist'), Cause.MISSING),  # 3D000
    (psycopg.errors.InvalidPassword("password authentication failed"), Cause.AUTHENTICATION),  # 28P01
    (psycopg.errors.InvalidAuthorizationSpecification('role "x" does not exist'), Cause.AUTHENTICATION),
    # MySQL / MariaDB, by error number
    (pymysql.err.OperationalError(1142, "CREATE command denied to user 'app'@'%'"), Cause.PRIVILEGE),
    (pymysql.err.OperationalError(1143, "SELECT command denied for column"), Cause.PRIVILEGE),
    (pymysql.err.OperationalError(1044, "Access denied for user 'app'@'%' to database 'x'"), Cause.PRIVILEGE),
    (pymysql.err.OperationalError(1227, "Access denied; you need the SUPER privilege"), Cause.PRIVILEGE),
    (
        pymysql.err.OperationalError(1045, "Access denied for user 'app'@'h' (using password: YES)"),
        Cause.AUTHENTICATION,
    ),
    (pymysql.err.OperationalError(1698, "Access denied for user 'root'@'localhost'"), Cause.AUTHENTICATION),
    (pymysql.err.ProgrammingError(1146, "Table 'test.outbox' doesn't exist"), Cause.MISSING),
    (pymysql.err.OperationalError(1049, "Unknown database 'shop'"), Cause.MISSING),
    # SQLite, by primary result code
    (_sqlite(8, "SQLITE_READONLY"), Cause.PRIVILEGE),
    (_sqlite(8 | (6 << 8), "SQLITE_READONLY_DIRECTORY"), Cause.PRIVILEGE),
    (_sqlite(3, "SQLITE_PERM"), Cause.PRIVILEGE),
    (_sqlite(23, "SQLITE_AUTH"), Cause.PRIVILEGE),
    (_sqlite(14, "SQLITE_CANTOPEN"), Cause.MISSING),
    # librdkafka, by error code name
    (
        KafkaException(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error")),
        Cause.AUTHENTICATION,
    ),
    (KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED)), Cause.AUTHENTICATION),
    (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), Cause.PRIVILEGE),
    (KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)), Cause.PRIVILEGE),
    (KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)), Cause.MISSING),
    (KafkaException(KafkaError(KafkaError._INVALID_ARG, "bad setting")), Cause.CONFIGURATION),
    # brokers: the cause their adapters give set-up errors
    (
        BrokerError(
            "rabbitmq", "connect", "authentication failed", retriable=True, cause=Cause.AUTHENTICATION
        ),
        Cause.AUTHENTICATION,
    ),
    (
        BrokerError("nats", "check stream", "no such JetStream stream", retriable=True, cause=Cause.MISSING),
        Cause.MISSING,
    ),
    (BrokerError("nats", "publish", "maximum payload exceeded", permanent=True), Cause.CONFIGURATION),
    # files
    (PermissionError(errno.EACCES, "Permission denied", "/var/lib/sluice"), Cause.PRIVILEGE),
    (OSError(errno.EROFS, "Read-only file system", "/mnt/ro"), Cause.PRIVILEGE),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/nope"), Cause.MISSING),
    # our own
    (ConfigError("expected a duration", path="startupTimeout"), Cause.CONFIGURATION),
    (CdcError("PostgreSQL's wal_level is 'replica'"), Cause.CONFIGURATION),
]

TRANSIENT: list[BaseException] = [
    psycopg.OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),  # 57P01
    psycopg.errors.SerializationFailure("could not serialize access"),  # 40001
    psycopg.errors.LockNotAvailable("lock timeout"),  # 55P03
    psycopg.errors.UniqueViolation("duplicate key"),  # 23505: not a set-up error; retried as today
    pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"),
    pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"),
    pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"),
    pymysql.err.OperationalError(1213, "Deadlock found"),
    _sqlite(5, "SQLITE_BUSY"),
    _sqlite(8 | (1 << 8), "SQLITE_READONLY_RECOVERY"),  # mended by opening the file again
    _sqlite(8 | (4 << 8), "SQLITE_READONLY_DBMOVED"),
    _sqlite(19, "SQLITE_CONSTRAINT"),
    KafkaException(KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:19092 failed")),
    KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)),
    KafkaException(KafkaError(KafkaError._TIMED_OUT)),
    BrokerError("redis", "connect", "cannot connect: Connection refused", retriable=True),
    ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
    TimeoutError("timed out"),
    OSError(errno.ENOSPC, "No space left on device", "/var/lib/sluice"),
    SlotInUseError("replication slot 's' is being read by another process"),
    StreamInterrupted("the replication connection was lost"),
]


@pytest.mark.parametrize(("exc", "cause"), PERMANENT, ids=lambda v: type(v).__name__)
def test_set_up_errors_are_permanent_with_their_cause(exc: BaseException, cause: Cause) -> None:
    verdict = classify(exc)
    assert isinstance(verdict, Permanent), verdict
    assert verdict.cause is cause
    assert "\n" not in verdict.line()


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda v: type(v).__name__)
def test_everything_else_is_transient(exc: BaseException) -> None:
    assert isinstance(classify(exc), Transient)


def test_the_fix_says_what_to_do_and_names_the_setting() -> None:
    def fix(exc: BaseException) -> str:
        verdict = classify(exc, setting="dataSource")
        assert isinstance(verdict, Permanent)
        return verdict.fix

    assert (
        fix(psycopg.errors.InsufficientPrivilege("x"))
        == "grant the role the privilege it lacks (GRANT … TO the role)"
    )
    assert (
        fix(psycopg.errors.InvalidCatalogName("x"))
        == "create the database, or correct its name in dataSource"
    )
    assert (
        fix(pymysql.err.OperationalError(1049, "x"))
        == "create the database, or correct its name in dataSource"
    )
    assert fix(psycopg.errors.InvalidSchemaName("x")) == "create the schema, or name one that exists"
    assert fix(psycopg.errors.UndefinedTable("x")).startswith("create the table")
    assert fix(pymysql.err.OperationalError(1045, "x")).startswith(
        "check the user and password in dataSource"
    )
    assert fix(_sqlite(8, "SQLITE_READONLY")) == "let this user write the database file and its directory"
    assert "dataSource" in fix(_sqlite(14, "SQLITE_CANTOPEN"))


def test_a_refused_connection_start_up_is_classified_by_the_servers_words() -> None:
    # libpq keeps a failed start-up's SQLSTATE to itself: connect_error reads the server's FATAL line.
    for said, cause in (
        ('FATAL:  role "nobody" does not exist', Cause.AUTHENTICATION),
        ('FATAL:  database "shop" does not exist', Cause.MISSING),
        ('FATAL:  password authentication failed for user "app"', Cause.AUTHENTICATION),
        ('FATAL:  permission denied for database "shop"', Cause.PRIVILEGE),
    ):
        mapped = connect_error(psycopg.OperationalError(f"connection failed: {said}"), "cannot connect")
        verdict = classify(mapped)
        assert isinstance(verdict, Permanent) and verdict.cause is cause, said
    unknown = connect_error(psycopg.ProgrammingError('invalid connection option "hostx"'), "cannot connect")
    verdict = classify(unknown, setting="dataSource")
    assert isinstance(verdict, Permanent) and verdict.cause is Cause.CONFIGURATION
    assert verdict.fix == "correct the data source in dataSource"
    refused = connect_error(
        psycopg.OperationalError("connection failed: Connection refused"), "cannot connect"
    )
    assert isinstance(classify(refused), Transient)


def test_an_error_raised_from_an_outage_is_an_outage() -> None:
    try:
        try:
            raise DatabaseUnavailableError("server closed the connection unexpectedly")
        except DatabaseUnavailableError as lost:
            raise CdcError("table 'public.t': server closed the connection unexpectedly") from lost
    except CdcError as exc:
        assert isinstance(classify(exc), Transient)


def test_a_startup_refusal_keeps_its_own_verdict() -> None:
    verdict = Permanent(
        Cause.PRIVILEGE, "the role 'cdc' may not create …", "GRANT CREATE ON SCHEMA public TO cdc"
    )
    assert classify(StartupRefused(verdict)) is verdict


# -- the start-up wait ------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_permanent_failure_ends_the_wait_at_once() -> None:
    clock, attempts = Clock(), []

    def check(seconds: float) -> None:
        attempts.append(seconds)
        raise psycopg.errors.InsufficientPrivilege("permission denied for schema public")

    with pytest.raises(StartupRefused) as caught:
        wait_for_start(check, what="PostgreSQL at db:5432", timeout=30, clock=clock, sleep=clock.sleep)
    assert attempts == [10.0] and clock.sleeps == []
    assert str(caught.value) == (
        "permission denied for schema public — grant the role the privilege it lacks (GRANT … TO the role)"
    )


def test_an_unreachable_server_is_waited_for_up_to_the_bound_then_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, attempts = Clock(), []

    def check(seconds: float) -> None:
        attempts.append(seconds)
        clock.now += min(seconds, 1.0)  # each attempt takes a second
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    with caplog.at_level(logging.DEBUG), pytest.raises(StartupUnreachable) as caught:
        wait_for_start(check, what="Kafka at 127.0.0.1:19092", timeout=3, clock=clock, sleep=clock.sleep)
    assert str(caught.value) == (
        "Kafka at 127.0.0.1:19092 unreachable for 3 s ([Errno 111] Connection refused); "
        "set startupTimeout to wait longer"
    )
    assert 3.0 <= clock.now < 3.5, "gave up at the bound"
    assert len(attempts) >= 2 and all(seconds <= 3.0 for seconds in attempts), attempts
    # Within the grace (a server restarting, a container starting beside this one): no warning.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_long_wait_warns_after_the_grace_and_ends_when_the_server_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()

    def check(seconds: float) -> str:
        if clock.now < 100:
            raise psycopg.OperationalError("Connection refused")
        return "there"

    with caplog.at_level(logging.INFO, logger="sluiceway.startup"):
        got = wait_for_start(
            check, what="PostgreSQL at db:5432", timeout=math.inf, clock=clock, sleep=clock.sleep
        )
    assert got == "there" and clock.now >= 100
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one when the grace ran out, one reminder a minute later
    assert warnings[0].startswith("PostgreSQL at db:5432 unreachable (Connection refused); waiting for ever")
    assert max(clock.sleeps) <= 5.0, "backs off, but looks again at least every 5 s"
    assert STARTUP_GRACE <= 10.0
    assert any("reachable after" in r.getMessage() for r in caplog.records)


def test_programming_errors_are_not_dressed_as_an_outage() -> None:
    clock = Clock()

    def check(seconds: float) -> None:
        raise TypeError("a bug")

    with pytest.raises(TypeError):
        wait_for_start(check, what="x", timeout=30, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []
