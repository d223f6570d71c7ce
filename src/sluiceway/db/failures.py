"""What a failure means, decided in one place, and the start-up wait every daemon runs on it.

:func:`classify` says of any error either :class:`~sluiceway.errors.Permanent` — waiting will not
mend it (a missing privilege, database, schema, table or stream; wrong credentials; a setting
that cannot work): say it once, with the fix, and stop — or :class:`~sluiceway.errors.Transient`
— a server restarting, a network cut: retry with backoff.

Codes decide, never message text. A driver's code (SQLSTATE, MySQL/MariaDB error number, SQLite
result code) is mapped once, in :mod:`sluiceway.db.connection`, to our error type and a
:class:`~sluiceway.errors.Cause`; the broker adapters set ``BrokerError.cause``; librdkafka's
errors are told apart by their error code names. This module turns that into the verdict and the
words of the fix. It sits in the database layer, the lowest that knows the drivers; brokers and
Kafka reach it through fields and code names, so it imports no client library.

:func:`wait_for_start` is the start-up check's loop (``sluice reap``, ``sluice capture``, ``sluice
feed worker``): a permanent failure ends the command at once
(:class:`~sluiceway.errors.StartupRefused`); an unreachable server is waited for, silently for
:data:`STARTUP_GRACE` seconds and then with a warning a minute, up to ``startupTimeout``
(:class:`~sluiceway.errors.StartupUnreachable`) — or for ever, for orchestrators that start
things in any order.
"""

from __future__ import annotations

import errno
import logging
import math
import re
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from sluiceway.db.connection import Database, map_db_error
from sluiceway.db.dsn import DataSource, Dialect
from sluiceway.db.queries import QuerySet
from sluiceway.errors import (
    BrokerError,
    Cause,
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    Permanent,
    StartupRefused,
    StartupUnreachable,
    Transient,
)
from sluiceway.outage import OUTAGE_REMINDER, WarningThrottle

T = TypeVar("T")
log = logging.getLogger("sluiceway.startup")

#: How long a daemon waits at start-up for a database or broker out of reach (``startupTimeout``).
DEFAULT_STARTUP_TIMEOUT = 30.0
#: The start-up wait is silent this long (a server restarting, a container starting beside this
#: one); past it, one warning and a reminder a minute.
STARTUP_GRACE = 10.0
#: The longest one attempt of a start-up check may take (a connect timeout, a metadata request).
ATTEMPT_TIMEOUT = 10.0

# SQLSTATEs and MySQL/MariaDB error numbers (as text: both fit in one table, none collide) that
# say which object is missing, for the fix's words.
_NO_SCHEMA = frozenset({"3F000"})
_NO_TABLE = frozenset({"42P01", "1146"})

# librdkafka's error code names (KafkaError.name()) that waiting will not mend.
_KAFKA_CAUSES: dict[str, Cause] = {
    "_AUTHENTICATION": Cause.AUTHENTICATION,  # SASL failed: wrong mechanism, user or password
    "SASL_AUTHENTICATION_FAILED": Cause.AUTHENTICATION,
    "TOPIC_AUTHORIZATION_FAILED": Cause.PRIVILEGE,
    "GROUP_AUTHORIZATION_FAILED": Cause.PRIVILEGE,
    "CLUSTER_AUTHORIZATION_FAILED": Cause.PRIVILEGE,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": Cause.PRIVILEGE,
    "UNKNOWN_TOPIC_OR_PART": Cause.MISSING,
    "_UNKNOWN_TOPIC": Cause.MISSING,
    "_INVALID_ARG": Cause.CONFIGURATION,  # a client setting librdkafka refuses
    "_SSL": Cause.CONFIGURATION,  # the TLS handshake failed: certificates, protocol
}
# Errors of our own code, never of the world: not waited on, not dressed as an outage.
_BUGS = (TypeError, AttributeError, NameError, AssertionError, ImportError, KeyError)


def classify(exc: BaseException, *, setting: str = "") -> Permanent | Transient:
    """Whether waiting can mend ``exc``, with the fix when it cannot.

    ``exc``: any error — ours, a database driver's (psycopg, PyMySQL, sqlite3), confluent-kafka's
    ``KafkaException``, an ``OSError``. ``setting``: the configuration key or flag that holds the
    address and credentials (``dataSource``, ``--dsn``), named in the fix.

    >>> import psycopg.errors
    >>> verdict = classify(psycopg.errors.InsufficientPrivilege("permission denied for schema public"))
    >>> verdict.cause, verdict.fix
    (<Cause.PRIVILEGE: 'privilege'>, 'grant the role the privilege it lacks (GRANT … TO the role)')
    >>> classify(ConnectionRefusedError(111, "Connection refused"))
    Transient(problem='[Errno 111] Connection refused')
    """
    if isinstance(exc, StartupRefused):
        return exc.verdict
    said = one_line(exc)  # a driver's own words, before mapping prefixes them
    if _is_driver_error(exc):
        exc = map_db_error(exc, "database")
    if isinstance(exc, DatabaseError):
        if exc.cause is None:
            return Transient(said)
        return Permanent(exc.cause, said, _database_fix(exc, setting))
    if isinstance(exc, BrokerError):
        if exc.cause is not None:
            return Permanent(exc.cause, one_line(exc), _broker_fix(exc.cause, setting))
        if exc.permanent:
            return Permanent(Cause.CONFIGURATION, one_line(exc))
        return Transient(one_line(exc))
    if isinstance(exc, ConfigError):
        return Permanent(Cause.CONFIGURATION, one_line(exc))
    kafka = _kafka_error(exc)
    if kafka is not None:
        name, words = kafka
        cause = _KAFKA_CAUSES.get(name)
        if cause is None:
            return Transient(words)
        words = f"{name}: {words}"
        fix = (
            f"check the credentials in {setting or 'the Kafka settings'}"
            if cause is Cause.AUTHENTICATION
            else ""
        )
        return Permanent(cause, words, fix)
    if isinstance(exc, OSError):
        return _os_verdict(exc)
    if isinstance(exc.__cause__, DatabaseUnavailableError):
        return Transient(one_line(exc))  # raised from an outage (a connection lost mid-check)
    if getattr(exc, "permanent", False) is True:  # PublishError, CdcError, DestinationUnreachable
        return Permanent(Cause.CONFIGURATION, one_line(exc))
    return Transient(one_line(exc))


def one_line(exc: BaseException) -> str:
    """The first line of an error's text, whitespace collapsed (driver errors add a ``LINE 1:``
    excerpt and hints below it)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return " ".join(first.split())


def _is_driver_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        return True
    import psycopg
    import pymysql

    return isinstance(exc, psycopg.Error | pymysql.err.Error)


def _database_fix(exc: DatabaseError, setting: str) -> str:
    where = f" in {setting}" if setting else ""
    code = exc.code or ""
    sqlite = code.startswith("SQLITE_")
    if exc.cause is Cause.AUTHENTICATION:
        return f"check the user and password{where}, and that the role exists and may log in"
    if exc.cause is Cause.MISSING:
        if code in _NO_SCHEMA:
            return "create the schema, or name one that exists"
        if code in _NO_TABLE:
            return "create the table, or correct its name in the configuration"
        if sqlite:
            return f"check the file's path{where}: its directory must exist and be writable by this user"
        return f"create the database, or correct its name{where}"
    if exc.cause is Cause.CONFIGURATION:
        return f"correct the data source{where}"
    if exc.cause is Cause.PRIVILEGE:
        if sqlite:
            return "let this user write the database file and its directory"
        return "grant the role the privilege it lacks (GRANT … TO the role)"
    return ""


def _broker_fix(cause: Cause, setting: str) -> str:
    if cause is Cause.AUTHENTICATION:
        return f"check the user and password in {setting or 'the broker URL'}"
    if cause is Cause.PRIVILEGE:
        return "give the user access to it on the broker"
    return ""  # the adapter's words say what to create or change


def _kafka_error(exc: BaseException) -> tuple[str, str] | None:
    """A ``KafkaException``'s ``KafkaError`` as (code name, one line), without importing
    confluent-kafka: its first argument answers ``name()`` and ``code()``."""
    error = exc.args[0] if exc.args else None
    name, code, words = (getattr(error, a, None) for a in ("name", "code", "str"))
    if not (callable(name) and callable(code)):
        return None
    text = words() if callable(words) else str(error)
    return str(name()), " ".join(str(text).split())


def _os_verdict(exc: OSError) -> Permanent | Transient:
    if isinstance(exc, ConnectionError | TimeoutError):
        return Transient(one_line(exc))
    where = f"{exc.filename}: " if exc.filename else ""
    said = f"{where}{exc.strerror or one_line(exc)}"
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return Permanent(Cause.PRIVILEGE, said, "give this user access to it")
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return Permanent(Cause.MISSING, said, "create it, or correct the path in the configuration")
    return Transient(said)  # a full disk, too many open files: may pass


def server_of(source: DataSource) -> str:
    """A database server as an unreachable line names it, without credentials:
    ``PostgreSQL at 127.0.0.1:5432``, ``MySQL/MariaDB at db:3306``, ``SQLite file app.db``.

    >>> from sluiceway.db.dsn import parse_dsn
    >>> server_of(parse_dsn("postgresql://app:secret@db.internal/shop"))
    'PostgreSQL at db.internal:5432'
    """
    if source.dialect is Dialect.SQLITE:
        return f"SQLite file {source.target}"
    if source.dialect is Dialect.MYSQL:
        kwargs = dict(source.mysql_kwargs)
        return f"MySQL/MariaDB at {kwargs.get('host')}:{kwargs.get('port')}"
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(source.target)
    except Exception:  # libpq refuses the string itself: the connect says why
        return "PostgreSQL"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    return f"PostgreSQL at {host}:{params.get('port') or 5432}"


def whoami(db: Database) -> tuple[str | None, str | None]:
    """The role (MySQL: ``user@host``) statements run as, and the schema (MySQL: database) an
    unqualified table goes to; ``(None, "main")`` on SQLite. For the words of a refusal's fix."""
    row = db.fetchone(QuerySet("sluiceway.db", db.dialect)["whoami"], what="whoami")
    if row is None:
        return None, None
    return (None if row[0] is None else str(row[0])), (None if row[1] is None else str(row[1]))


_PLAIN_ROLE = re.compile(r"^[a-z_][a-z0-9_$]*$")


def grantee(user: str | None, dialect: Dialect) -> str:
    """A role as a GRANT statement names it: ``cdc``, ``"CDC-reader"``, ``'app'@'%'``.

    >>> grantee("cdc_reader", Dialect.POSTGRES), grantee("app@%", Dialect.MYSQL)
    ('cdc_reader', "'app'@'%'")
    """
    if not user:
        return "<the role>"
    if dialect is Dialect.MYSQL:
        name, _, host = user.rpartition("@")
        return f"'{name}'@'{host}'" if name else f"'{host}'"
    return user if _PLAIN_ROLE.match(user) else '"' + user.replace('"', '""') + '"'


def wait_for_start(
    check: Callable[[float], T],
    *,
    what: str,
    timeout: float,
    setting: str = "startupTimeout",
    credentials: str = "",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    logger: logging.Logger = log,
) -> T:
    """``check(seconds)`` until it succeeds — one attempt, given at most ``seconds`` — and its result.

    A failure :func:`classify` calls permanent raises :class:`~sluiceway.errors.StartupRefused`
    at once (its fix names ``credentials``, the key holding the address and password). A
    transient one is tried again with backoff until ``timeout`` seconds have passed since the
    first attempt (``math.inf``: for ever), then :class:`~sluiceway.errors.StartupUnreachable` names
    ``what``, the wait and the last error, and ``setting`` to wait longer. Nothing is logged for
    :data:`STARTUP_GRACE` seconds; then one warning, and a reminder a minute.

    >>> now = [0.0]
    >>> def down(seconds):
    ...     raise ConnectionRefusedError(111, "Connection refused")
    >>> wait_for_start(down, what="Kafka at k:9092", timeout=3, clock=lambda: now[0],
    ...                sleep=lambda s: now.__setitem__(0, now[0] + s))
    Traceback (most recent call last):
    ...
    sluiceway.errors.StartupUnreachable: Kafka at k:9092 unreachable for 3 s ([Errno 111] Connection refused); set startupTimeout to wait longer
    """  # noqa: E501
    started = clock()
    deadline = started + timeout
    throttle = WarningThrottle(logger, OUTAGE_REMINDER, clock=clock, grace=STARTUP_GRACE)
    delay = 0.25
    while True:
        left = deadline - clock()
        try:
            result = check(max(0.5, min(ATTEMPT_TIMEOUT, left)))
        except _BUGS:
            raise
        except Exception as exc:
            verdict = classify(exc, setting=credentials)
            if isinstance(verdict, Permanent):
                raise StartupRefused(verdict) from exc
            left = deadline - clock()
            if left <= 0:
                raise StartupUnreachable(what, timeout, verdict.problem, setting) from exc
            bound = "for ever" if math.isinf(timeout) else f"up to {timeout:g} s ({setting})"
            throttle.warn("%s unreachable (%s); waiting %s", what, verdict.problem, bound)
            sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
            continue
        throttle.resolved("%s reachable after %.1f s", what, clock() - started)
        return result


__all__ = [
    "DEFAULT_STARTUP_TIMEOUT",
    "classify",
    "grantee",
    "one_line",
    "server_of",
    "wait_for_start",
    "whoami",
]
