"""Wake-ups for idle feed workers on PostgreSQL: sleep on LISTEN instead of a poll timer.

Producers ``NOTIFY`` on the feed's channel (:func:`~sluiceway.feed.store.wake_channel`) inside
the transaction that makes work available — ``add``/``add_many``, ``add_items``, a gate advanced
by hand, a lease released, ``retry``/``resolve`` (:meth:`FeedStore.notify`). PostgreSQL delivers
a notification at commit and never for a rollback, so a worker it wakes finds the work visible.

A worker with nothing to do rests here: on its listening connection, until a notification
arrives or its timer runs out — the next lease renewal, the next retry due, or the long fallback
poll, whichever comes first (the worker computes that). The fallback stays because a wake-up can
be missed: a producer that writes the tables directly, or a notification sent while the listening
connection was down.

Why it is shaped so:

* **Catch-up after (re)connecting.** Notifications sent while nobody listened are lost. So every
  time the LISTEN is (re)established, :meth:`WakeUps.rest` returns True at once, before sleeping:
  the worker looks for work *after* it listens, and nothing can slip between the two.
* **Degraded, not stopped.** When the listening connection cannot be opened (the server is down,
  no connection slot left) the worker polls every ``poll_interval`` as it would without wake-ups,
  and tries to listen again with a growing pause. A refused login is permanent and raised.
* **Stopping is prompt.** :meth:`WakeUps.interrupt` (from ``stop()``, or a signal handler) ends a
  rest at once; the rest may otherwise last the whole fallback interval.
"""

from __future__ import annotations

import logging

from sluiceway.clock import Clock
from sluiceway.db import DataSource, Listener
from sluiceway.errors import DatabaseError, DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.outage import OUTAGE_REMINDER, WarningThrottle

log = logging.getLogger("sluiceway.feed")

#: Longest pause between two attempts to listen again while the listening connection is down.
MAX_RELISTEN_PAUSE = 60.0


class WakeUps:
    """The listening side of one worker. Owned by the worker's loop thread, except
    :meth:`interrupt`."""

    def __init__(
        self,
        source: DataSource,
        listen_sql: str,
        *,
        owner: str,
        poll_interval: float,
        clock: Clock,
        outage: WarningThrottle | None = None,
    ) -> None:
        self.owner = owner
        self.poll_interval = poll_interval
        self.clock = clock
        self.listener = Listener(source, [listen_sql], application_name=f"sluiceway feed wake-ups {owner}")
        #: Notifications that woke this worker, and times the LISTEN was (re)established.
        self.notifications = 0
        self.listens = 0
        self._failures = 0
        self._retry_at = clock.monotonic()
        # Shared with the worker's loop (which meets the same outage): one line per outage.
        self._outage = outage or WarningThrottle(log, OUTAGE_REMINDER, clock=clock.monotonic)

    @property
    def listening(self) -> bool:
        return self.listener.listening

    def rest(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds. True when the worker should look for work at once:
        notifications arrived, or the LISTEN was just (re)established (a catch-up look for what
        was sent while nobody listened). False after a timeout or an interrupt."""
        if not self.listener.listening:
            if self.clock.monotonic() >= self._retry_at and self._listen():
                return True
            # Not listening: poll as a worker without wake-ups does.
            self.listener.sleep(min(timeout, self.poll_interval))
            return False
        try:
            received = self.listener.wait(timeout)
        except DatabaseUnavailableError as exc:
            # The loop's own statements meet the same outage and warn about it: one line is enough.
            log.info("feed worker %s: lost its listening connection (%s); listening again", self.owner, exc)
            return self._listen()
        self.notifications += received
        return received > 0

    def _listen(self) -> bool:
        """(Re)establish the LISTEN; True when it worked. Refusals are raised (permanent)."""
        try:
            self.listener.listen()
        except DatabaseRefusedError:
            raise
        except DatabaseError as exc:  # out of reach, or no slot left: poll meanwhile
            self._failures += 1
            pause = min(MAX_RELISTEN_PAUSE, self.poll_interval * 2 ** min(self._failures, 12))
            self._retry_at = self.clock.monotonic() + pause
            # One line per outage (a reminder a minute while it lasts), not one per attempt.
            self._outage.warn(
                "feed worker %s: cannot listen for wake-ups (%s); polling every %gs meanwhile",
                self.owner, exc, self.poll_interval,
            )  # fmt: skip
            return False
        if self._outage.troubled:
            self._outage.resolved("feed worker %s: listening for wake-ups again", self.owner)
        elif self._failures or self.listens:
            log.info("feed worker %s: listening for wake-ups again", self.owner)
        self._failures = 0
        self.listens += 1
        return True

    def interrupt(self) -> None:
        """End the current or next rest at once (any thread, signal handlers too)."""
        self.listener.interrupt()

    def close(self) -> None:
        self.listener.close()
