"""One exception tree for the whole package.

Every error sluiceway raises on purpose derives from :class:`SluicewayError`. Driver errors
(psycopg, PyMySQL, sqlite3, librdkafka) are mapped at the adapter edge with ``raise … from exc``
so callers can catch one root and still reach the original cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SluicewayError(Exception):
    """Root of every error raised by sluiceway."""


class Cause(StrEnum):
    """Why waiting will not mend a failure (see :class:`Permanent` and ``sluiceway.db.classify``)."""

    #: The role or user may not do it: a GRANT (or a file's permissions) mends it.
    PRIVILEGE = "privilege"
    #: A database, schema, table, stream or file is not there.
    MISSING = "missing"
    #: The credentials are wrong, or the user does not exist or may not log in.
    AUTHENTICATION = "authentication"
    #: A setting (ours, the server's or a client library's) cannot work as given.
    CONFIGURATION = "configuration"


@dataclass(frozen=True, slots=True)
class Permanent:
    """A failure waiting will not mend: said once, with what fixes it, and the command stops.

    ``problem``: what went wrong in one line (the server's own words where it gave some);
    ``fix``: what the operator does about it (empty when ``problem`` already says).

    >>> Permanent(Cause.MISSING, 'database "shop" does not exist', "create it").line()
    'database "shop" does not exist — create it'
    """

    cause: Cause
    problem: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.problem} — {self.fix}" if self.fix else self.problem


@dataclass(frozen=True, slots=True)
class Transient:
    """A failure that may pass (a server restarting, a network cut): retried with backoff."""

    problem: str


#: What ``sluiceway.db.classify`` says of a failure.
Verdict = Permanent | Transient


class ConfigError(SluicewayError):
    """A configuration file or value is invalid.

    ``path`` names the offending field (``limits.sendBuffer``), ``problem`` says what was expected.
    """

    def __init__(self, problem: str, *, path: str = "", source: str = "") -> None:
        self.path = path
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        field = f"{path}: " if path else ""
        super().__init__(f"{where}{field}{problem}")


class InvalidIdentifierError(ConfigError):
    """A table or other SQL identifier from configuration does not match the allowed pattern."""


class UnsupportedDsnError(ConfigError):
    """The data source string names no dialect sluiceway supports."""


class InvalidRecordError(SluicewayError):
    """An outbox record was rejected before anything was written."""

    def __init__(self, problem: str, *, field: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid outbox record: {field}: {problem}")


class DatabaseError(SluicewayError):
    """A database call failed. It may still have succeeded on the server (assume it might have).

    ``code`` is the driver's error code when there is one: the SQLSTATE (PostgreSQL), the error
    number (MySQL/MariaDB) or the extended result code name (SQLite, ``SQLITE_BUSY``); ``detail``
    the driver's own first line (the server's message), for one-line errors that quote it.
    """

    #: The cause when the error is permanent (a refusal), else None: see :attr:`cause`.
    default_cause: Cause | None = None

    def __init__(
        self, message: str = "", *, code: str | None = None, detail: str = "", cause: Cause | None = None
    ) -> None:
        self.code = code
        self.detail = detail
        #: Why waiting will not mend it (set where the driver's code is mapped); None: it may pass.
        self.cause = cause if cause is not None else self.default_cause
        super().__init__(message)


class DatabaseUnavailableError(DatabaseError):
    """The database could not be reached."""


class DatabaseRefusedError(DatabaseError):
    """The server answered and refused for good: no such database (SQLSTATE 3D000), schema
    (3F000) or table (42P01), a failed authentication (28P01, 28000), a missing privilege (42501),
    and their MySQL/MariaDB and SQLite equivalents (``cause`` says which). A permanent error:
    said once, never retried (unlike :class:`DatabaseUnavailableError`, a server that cannot be
    reached for now)."""

    default_cause = Cause.PRIVILEGE


class NoSuchDatabaseError(DatabaseRefusedError):
    """The database named does not exist (a missing SQLite file opened for reading, SQLSTATE
    3D000): a permanent error, said once, never retried and never "fixed" by creating an empty
    database."""

    default_cause = Cause.MISSING


class ConflictError(DatabaseError):
    """The database aborted the transaction because it conflicted with a concurrent one
    (serialization failure: SQLSTATE 40001; SQLite's stale WAL snapshot). The whole transaction
    was rolled back, so running it again from the start is safe."""


class DeadlockError(ConflictError):
    """The transaction was chosen as a deadlock victim (SQLSTATE 40P01, MySQL/MariaDB error 1213)
    and rolled back as a whole."""


class LockTimeoutError(DatabaseError):
    """A lock could not be had in time (MySQL/MariaDB error 1205, SQLSTATE 55P03, SQLite busy or
    locked). Only the statement failed: on MySQL/MariaDB the transaction is still open."""


class PublishError(SluicewayError):
    """A record could not be handed to the broker or journal.

    ``permanent``: the destination can never accept it; ``fatal``: the client can deliver nothing
    more and must be replaced.
    """

    permanent: bool = False
    fatal: bool = False


class PublisherFailedError(PublishError):
    """The destination client failed for good during a leadership term (a fatal producer error):
    the term ends, its rows stay for the next term, which opens a fresh client."""

    fatal = True


class LeadershipError(SluicewayError):
    """Leadership was lost or could not be established."""


class InvariantViolation(SluicewayError):
    """A run-time invariant check failed: a bug, never an expected condition. Fail loudly."""


class BrokerError(PublishError):
    """A message broker (NATS, RabbitMQ, Redis) refused or failed an operation.

    ``broker`` names the system (``nats``, ``rabbitmq``, ``redis``), ``action`` what was being done
    (``connect``, ``publish``, ``read``…) and ``target`` the stream, exchange or subject involved.
    ``retriable``: the connection or the broker was briefly unavailable, trying again may succeed.
    ``permanent``: the broker can never accept this message (too large, no such stream): a
    dead-letter candidate at once. ``refused``: the broker decided against this message by a rule
    of its set-up (RabbitMQ returned it unroutable, published ``mandatory``): trying again helps
    only once someone changes the set-up, so a publisher may retry it or give up at once.
    ``cause``: a set-up error (wrong credentials, no such stream or exchange) — permanent when a
    command starts, retried like a lost connection later (someone is probably fixing the set-up).
    Client-library errors are mapped to it once, in each adapter.
    """

    def __init__(
        self,
        broker: str,
        action: str,
        problem: str,
        *,
        target: str = "",
        retriable: bool = False,
        permanent: bool = False,
        refused: bool = False,
        cause: Cause | None = None,
    ) -> None:
        self.broker, self.action, self.target, self.problem = broker, action, target, problem
        self.retriable, self.permanent, self.refused = retriable, permanent, refused
        self.cause = cause
        where = f" {target!r}" if target else ""
        super().__init__(f"{broker}: {action}{where} failed: {problem}")


class StartupError(SluicewayError):
    """A long-running command (``sluice reap``, ``sluice capture``, ``sluice feed worker``) cannot
    start: one line, exit 1, before it campaigns for leadership or takes any work."""


class StartupRefused(StartupError):
    """Something the command needs refused it for good (``verdict`` says what and the fix)."""

    def __init__(self, verdict: Permanent) -> None:
        self.verdict = verdict
        super().__init__(verdict.line())


class StartupUnreachable(StartupError):
    """``what`` stayed out of reach for the whole start-up wait (``waited`` seconds); ``last``:
    the last error met; ``setting``: what lengthens the wait.

    >>> str(StartupUnreachable("Kafka at 127.0.0.1:19092", 30, "Connection refused", "startupTimeout"))
    'Kafka at 127.0.0.1:19092 unreachable for 30 s (Connection refused); set startupTimeout to wait longer'
    """

    def __init__(self, what: str, waited: float, last: str, setting: str) -> None:
        self.what, self.waited, self.last, self.setting = what, waited, last, setting
        super().__init__(f"{what} unreachable for {waited:g} s ({last}); set {setting} to wait longer")
