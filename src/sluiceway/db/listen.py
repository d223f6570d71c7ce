"""Waiting for PostgreSQL notifications on a connection of its own.

A :class:`Listener` opens a dedicated autocommit connection, runs its ``LISTEN`` statements and
then blocks in ``select`` on the connection's socket and on a pipe of its own, so that another
thread (or a signal handler) can cut a long wait short with :meth:`Listener.interrupt`.

Why it is shaped so:

* **Its own connection.** Notifications reach a session only between its transactions; the
  connection that claims and writes would hold them back while busy, and a LISTEN there would
  be undone by a reconnect nobody notices. This one does nothing but wait.
* **Loss is loud.** A dropped connection (a server restart, ``pg_terminate_backend``, a network
  cut) raises :class:`DatabaseUnavailableError` from :meth:`wait`; notifications sent meanwhile
  are gone, so the caller re-listens and then looks for work it may have missed. TCP keepalives
  on the socket bound how long a silently dead peer (a NAT that forgot us) goes unnoticed.
* Errors are mapped as everywhere else (:func:`map_db_error`, :func:`connect_error`): a refused
  login is permanent, a server out of reach is transient.

>>> listener = Listener(parse_dsn("postgresql://app@db/app"), ['LISTEN "feed_wakeup"'])  # doctest: +SKIP
>>> listener.listen(); listener.wait(30.0)                                             # doctest: +SKIP
1
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

from sluiceway.db.connection import map_db_error, open_raw
from sluiceway.db.dsn import DataSource, Dialect
from sluiceway.errors import ConfigError, DatabaseUnavailableError

#: TCP keepalive on the listening socket: idle seconds before probing, seconds between probes,
#: probes lost before the connection counts as dead (about a minute in all). The socket is quiet
#: for as long as nothing happens, so without these a peer that vanished would never be noticed.
KEEPALIVE: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


class Listener:
    """A dedicated PostgreSQL connection that runs ``statements`` (its LISTENs) and waits.

    Belongs to one thread, except :meth:`interrupt`, which any thread or a signal handler may call.
    """

    def __init__(
        self,
        source: DataSource,
        statements: Sequence[str],
        *,
        application_name: str = "sluiceway listener",
        connect_timeout: float = 5.0,
    ) -> None:
        if source.dialect is not Dialect.POSTGRES:
            raise ConfigError(
                f"LISTEN/NOTIFY needs PostgreSQL; {source.redacted()} is {source.dialect.value}", path="dsn"
            )
        self.source = source
        self.statements = tuple(statements)
        self.application_name = application_name[:63]
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        # The self-pipe that interrupt() writes to; both ends non-blocking (a full pipe already
        # holds a wake-up, and a drain must not block).
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Held by close() while it closes the pipe, so interrupt() never writes to a descriptor
        # number the process may already have reused for something else.
        self._closing = threading.Lock()

    @property
    def listening(self) -> bool:
        """Connected, with the LISTEN statements run."""
        return self._conn is not None

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening session (for logs and operators), when connected."""
        return None if self._conn is None else int(self._conn.info.backend_pid)

    def listen(self) -> None:
        """(Re)connect and run the LISTEN statements. Notifications sent while not listening are
        lost: after this returns, look for work that may have been missed."""
        self._drop()
        import psycopg

        conn = open_raw(
            self.source,
            connect_timeout=self._connect_timeout,
            what=f"cannot connect to {self.source.redacted()} to listen",
            application_name=self.application_name,
            **KEEPALIVE,
        )
        try:
            for sql in self.statements:
                conn.execute(sql)
        except psycopg.Error as exc:
            with contextlib.suppress(Exception):
                conn.close()
            raise map_db_error(exc, "listen") from exc
        self._conn = conn

    def wait(self, timeout: float) -> int:
        """Block until notifications arrive, :meth:`interrupt` is called, or ``timeout`` seconds
        pass. Returns how many notifications arrived (all that were waiting, drained); 0 on a
        timeout or an interrupt. Raises :class:`DatabaseUnavailableError` when the connection is
        lost (it is then closed: :meth:`listen` again)."""
        import psycopg

        conn = self._conn
        if conn is None:
            raise DatabaseUnavailableError("not listening: call listen() first")
        received = 0
        remaining = max(0.0, timeout)
        deadline = time.monotonic() + remaining
        while True:
            try:
                ready, _, _ = select.select([conn.fileno(), self._wake_r], [], [], remaining)
            except (OSError, ValueError) as exc:  # the socket went away under us
                self._drop()
                raise DatabaseUnavailableError(f"listening connection lost: {exc}") from exc
            if self._wake_r in ready:
                self._drain_pipe()
                return received
            if not ready:
                return received
            try:
                # timeout=0: take what the socket holds now, never block here (select did that).
                received += sum(1 for _ in conn.notifies(timeout=0))
            except psycopg.Error as exc:
                # Whatever the driver says (the server's goodbye, a reset), this session is over and
                # so is its LISTEN: always "unavailable", so the caller listens again.
                self._drop()
                raise DatabaseUnavailableError(f"listening connection lost: {exc}") from exc
            if received:
                return received
            # Readable but no notification: a partial message, or the server's goodbye before
            # the connection closes (then the next read raises). Wait on for what is left.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 0

    def sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, or until :meth:`interrupt` (while not listening)."""
        ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        if ready:
            self._drain_pipe()

    def interrupt(self) -> None:
        """Cut the current (or the next) :meth:`wait` short. Safe from any thread and from signal
        handlers (one write to a non-blocking pipe)."""
        # Never block: a signal handler may interrupt close() in this very thread. If close() holds
        # the lock, the listener is going away and there is nothing left to wake.
        if not self._closing.acquire(blocking=False):
            return
        try:
            if self._wake_w >= 0:
                with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
                    os.write(self._wake_w, b"\0")
        finally:
            self._closing.release()

    def _drain_pipe(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the connection and the pipe (no wait or interrupt afterwards)."""
        self._drop()
        with self._closing:
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._wake_r = self._wake_w = -1

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
