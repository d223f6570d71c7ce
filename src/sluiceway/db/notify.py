"""LISTEN on a PostgreSQL channel: wake-ups instead of a poll timer.

A :class:`Listener` keeps one connection of its own that LISTENs on one channel. The producers'
NOTIFY is delivered when their transaction commits, so a wake-up never comes before the work is
visible. Notifications are hints, not data: a burst is one wake-up, and a connection lost (with
whatever was notified meanwhile) is reopened at the next :meth:`Listener.wait`, which then
returns True at once so that the caller looks for work (the catch-up poll).
"""

from __future__ import annotations

import logging

from sluiceway.db.connection import Database
from sluiceway.db.dsn import DataSource, Dialect
from sluiceway.db.identifiers import quote_identifier
from sluiceway.errors import ConfigError, DatabaseError

log = logging.getLogger("sluiceway.db")


class Listener:
    """LISTEN on ``channel`` over a connection of its own. Not thread-safe: one thread waits.

    >>> listener = Listener("postgresql://postgres@127.0.0.1/app", "sluice_outbox_outbox")  # doctest: +SKIP
    >>> listener.wait(5.0)  # True: notified, or the connection was (re)opened: look for work
    """

    def __init__(self, dsn: str | DataSource, channel: str, *, connect_timeout: float = 5.0) -> None:
        self.db = Database(dsn, connect_timeout=connect_timeout)
        if self.db.dialect is not Dialect.POSTGRES:
            raise ConfigError(
                f"LISTEN/NOTIFY needs PostgreSQL, not {self.db.dialect.value}", path="dataSource"
            )
        self.channel = channel
        self._listen = f"LISTEN {quote_identifier(channel, Dialect.POSTGRES, what='channel')}"
        self._listening = False

    def start(self) -> None:
        """Connect and LISTEN (also done by the first :meth:`wait`). Raises
        :class:`~sluiceway.errors.DatabaseError` if the server cannot be reached."""
        self.db.execute(self._listen, what=f"listen on {self.channel}")
        self._listening = True

    def wait(self, timeout: float) -> bool:
        """Block until a notification comes (True; every one queued is consumed) or ``timeout``
        seconds pass (False). True at once after (re)connecting, and after a lost connection."""
        if not self._listening:
            try:
                self.start()
            except DatabaseError as exc:
                log.debug("listen on %s: %s", self.channel, exc)
                self.db.close()
            return True
        import psycopg

        conn = self.db.raw
        try:
            woken = any(True for _ in conn.notifies(timeout=timeout, stop_after=1))
            if woken:
                for _ in conn.notifies(timeout=0):  # the rest of a burst: one wake-up
                    pass
        except psycopg.Error as exc:
            log.debug("listen on %s: connection lost (%s); listening again", self.channel, exc)
            self._listening = False
            self.db.close()
            return True
        return woken

    def close(self) -> None:
        self._listening = False
        self.db.close()
