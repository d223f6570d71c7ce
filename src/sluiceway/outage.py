"""Logging a lasting trouble — a database or a broker out of reach — by the outage, not by the attempt.

A part that retries with backoff meets the same error many times while a server is away: a
restart is a second, a failover a minute. One line per attempt buries the log (and hides the one
line that matters: when it began); no line at all hides the outage. So: one warning when the
trouble starts, at most one reminder per interval while it lasts (with the count held back), and
one INFO line when it ends, saying for how long.

One :class:`WarningThrottle` per thread that meets the trouble (the feed worker's loop, the
harvester's marker, purger and lease campaign): each has its own connection, so each meets a
restart once, and says so once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two warnings about the same trouble (the first one is logged at once).
WARN_INTERVAL = 10.0
#: The interval for a database out of reach: a restart or a failover is one line, not several.
OUTAGE_REMINDER = 60.0
#: A locked database (another writer holds SQLite's one write lock) is a wait, not an outage:
#: nothing is said unless it lasts this long.
BUSY_GRACE = 30.0


class WarningThrottle:
    """Warnings about a lasting trouble, at most one per ``interval``; the next line written says
    how many were held back, and :meth:`resolved` says when the trouble ended. Not thread-safe:
    one thread uses it.

    >>> now = [0.0]
    >>> throttle = WarningThrottle(logging.getLogger("doctest"), 10.0, clock=lambda: now[0])
    >>> [throttle.warn("down") for now[0] in (0.0, 1.0, 2.0, 11.0)]
    [True, False, False, True]
    >>> throttle.held, throttle.duration()
    (0, 11.0)
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = WARN_INTERVAL,
        *,
        clock: Callable[[], float] = time.monotonic,
        grace: float = 0.0,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        #: A trouble younger than this is only logged at DEBUG (see :data:`BUSY_GRACE`).
        self.grace = grace
        self._seen: float | None = None  # when warn() was first called for this trouble
        self._last: float | None = None  # when the last warning was written; None: no trouble
        self._started: float | None = None  # when the first warning of this trouble was written
        self.held = 0

    @property
    def troubled(self) -> bool:
        """A warning was written and the trouble has not been :meth:`resolved` since."""
        return self._last is not None

    def duration(self) -> float:
        """Seconds since this trouble's first warning (0 when there is none)."""
        return 0.0 if self._started is None else self._clock() - self._started

    def warn(self, msg: str, *args: object) -> bool:
        """Log ``msg`` unless a warning was written less than ``interval`` ago (or the trouble is
        younger than ``grace``: then at DEBUG); True if logged as a warning."""
        now = self._clock()
        if self._seen is None:
            self._seen = now
        if now - self._seen < self.grace:
            self.logger.debug(msg, *args)
            return False
        if self._last is not None and now - self._last < self.interval:
            self.held += 1
            return False
        if self._started is None:
            self._started = now
        held, self.held, self._last = self.held, 0, now
        if held:
            self.logger.warning(msg + " (%d more such warnings held back)", *args, held)
        else:
            self.logger.warning(msg, *args)
        return True

    def changed(self) -> None:
        """The trouble changed (another error): the next warning is written at once."""
        self._last = None

    def resolved(self, msg: str, *args: object) -> None:
        """The trouble is over: say so once (if a warning was written), and start afresh."""
        self._seen = None
        if self._last is None:
            return
        held, self.held, self._last, self._started = self.held, 0, None, None
        if held:
            self.logger.info(msg + " (%d more warnings held back since the last one)", *args, held)
        else:
            self.logger.info(msg, *args)


def ride_out(
    call: Callable[[], T],
    *,
    what: str,
    errors: tuple[type[BaseException], ...],
    limit: float,
    throttle: WarningThrottle,
    backoff: float = 0.1,
    max_backoff: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    hopeless: Callable[[BaseException], bool] = lambda exc: False,
) -> T:
    """``call()``, with an outage waited out: on one of ``errors`` it is called again with
    backoff for up to ``limit`` seconds, then the error is raised. One warning when the outage
    starts (``throttle``'s reminders while it lasts), one line when it ends. An error that
    ``hopeless`` says waiting will not mend is raised at once. For calls that are safe to repeat,
    whether or not the failed attempt took effect.

    >>> now = [0.0]
    >>> tries = iter([ConnectionError("down"), ConnectionError("down"), None])
    >>> def call():
    ...     error = next(tries)
    ...     if error:
    ...         raise error
    ...     return "ok"
    >>> throttle = WarningThrottle(logging.getLogger("doctest"), clock=lambda: now[0])
    >>> ride_out(call, what="x", errors=(ConnectionError,), limit=60, throttle=throttle,
    ...          sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    'ok'
    """
    since: float | None = None
    delay = backoff
    while True:
        try:
            result = call()
        except errors as exc:
            now = clock()
            since = now if since is None else since
            if hopeless(exc) or now - since >= limit:
                raise
            throttle.warn("%s: %s (retrying for up to %gs)", what, exc, limit)
            sleep(min(delay, max_backoff, max(0.0, since + limit - now)))
            delay = max(delay * 2, 0.01)
            continue
        if since is not None:
            throttle.resolved("%s: reachable again after %.1fs", what, clock() - since)
        return result
