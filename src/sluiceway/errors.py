"""One exception tree for the whole package.

Every error sluiceway raises on purpose derives from :class:`SluicewayError`. Driver errors
(psycopg, PyMySQL, sqlite3, librdkafka) are mapped at the adapter edge with ``raise … from exc``
so callers can catch one root and still reach the original cause.
"""

from __future__ import annotations


class SluicewayError(Exception):
    """Root of every error raised by sluiceway."""


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

    def __init__(self, message: str = "", *, code: str | None = None, detail: str = "") -> None:
        self.code = code
        self.detail = detail
        super().__init__(message)


class DatabaseUnavailableError(DatabaseError):
    """The database could not be reached."""


class DatabaseRefusedError(DatabaseError):
    """The server answered and refused the connection for good: no such database (SQLSTATE
    3D000), a failed authentication (28P01, 28000), no permission to connect (42501). A permanent
    error: said once, never retried (unlike :class:`DatabaseUnavailableError`, a server that
    cannot be reached for now)."""


class NoSuchDatabaseError(DatabaseRefusedError):
    """The database named does not exist (a missing SQLite file opened for reading, SQLSTATE
    3D000): a permanent error, said once, never retried and never "fixed" by creating an empty
    database."""


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
    ) -> None:
        self.broker, self.action, self.target, self.problem = broker, action, target, problem
        self.retriable, self.permanent, self.refused = retriable, permanent, refused
        where = f" {target!r}" if target else ""
        super().__init__(f"{broker}: {action}{where} failed: {problem}")
