"""The feed worker: lease partitions, claim items at their gates, process, report, fan in.

One coordinator thread owns the database connection and does all SQL; processors run inline
(``concurrency=1``) or on a thread pool. A cycle:

1. every ``lease/3`` seconds: renew our leases, then balance (acquire free partitions, steal one,
   or release the excess — :mod:`sluiceway.feed.balance`); between renewals a lighter top-up
   (no steal) runs when partitions completed or the worker is idle;
2. write the outcomes that are ready, as one batch (conditional on each claim's version);
3. claim up to ``batch_size`` items in one statement and hand them to the processor;
4. gate check for the partitions touched (or all we hold, when the claim ran short): advance
   the gate (fan-in), complete the partition, or mark it failed — each an OCC update.

When a cycle finds nothing to do the worker rests: on PostgreSQL (``wake_ups``, on by default) on
a listening connection until a producer's NOTIFY, its next renewal, the next work due without a
notification (a retry, a ``retry_in``, scheduled work) or the long ``fallback_poll``
(:mod:`sluiceway.feed.wakeup`); elsewhere for ``poll_interval``.

A worker that holds nothing, on a feed whose last census showed no open partition at all (none
free, none leased by anyone), is *quiet*: it has nothing to renew and nobody to steal from or take
over, so it skips its renewals (and the rate limits they read, read again before its next claim)
and, with wake-ups, rests until a notification, the next work due or ``fallback_poll`` — not every
``lease/3``. Anything that would end that — work added, a lease released, a gate advanced by
hand, a retry — notifies; work that comes due wakes it by ``next_due``; a direct write is found by
the fallback. Once any partition is open, the worker keeps the ``lease/3`` cadence, so stealing
and taking over a dead worker's partitions are as prompt as ever.

Delivery is at-least-once: a worker that dies mid-item leaves the item's claim to lapse, and
another worker processes it again. Two workers never process one item at the same time: the
claim hides the item until its claim lease (``lease`` seconds) runs out, and a worker never
*starts* an item after half that lease has gone by (it hands it back instead) — so processors
must finish well within ``lease / 2``.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from sluiceway.clock import Clock, SystemClock
from sluiceway.db import Database, DataSource, Dialect, parse_dsn
from sluiceway.db.failures import DEFAULT_STARTUP_TIMEOUT, server_of, wait_for_start
from sluiceway.errors import DatabaseError, DatabaseRefusedError, LockTimeoutError
from sluiceway.feed.balance import choose, plan, victim
from sluiceway.feed.core import (
    Claimed,
    Decision,
    Outcome,
    OutcomeKind,
    RetryPolicy,
    decide,
    process_one,
    requeue_outcome,
)
from sluiceway.feed.errors import FeedError, FeedTimeout
from sluiceway.feed.model import Item, WorkerStats
from sluiceway.feed.processors import load_processor
from sluiceway.feed.rate import RateKey, keys_for
from sluiceway.feed.settings import FeedWorkerSettings
from sluiceway.feed.store import FeedStore, Held, table_names
from sluiceway.feed.wakeup import WakeUps
from sluiceway.outage import BUSY_GRACE, OUTAGE_REMINDER, WarningThrottle

log = logging.getLogger("sluiceway.feed")

#: Most free partitions read (and taken) per balance step: listings stay bounded.
ACQUIRE_PAGE = 100
#: How long a worker with a busy pool lingers for more outcomes before writing them.
GATHER_DELAY = 0.02
#: Shortest rest on the listening connection: a retry found due (or a renewal found late) is
#: looked at again this soon, never in a tight loop.
MIN_REST = 0.05
#: ``next_due``'s window when every free partition that is due counts, however long ago it came
#: due (seconds).
ANY_AGE = 1e9
#: Added to a retry's due time, so the worker wakes just after the item is claimable, not before.
DUE_SLACK = 0.01


class _NextDue:
    """The last answer of ``next_due`` (monotonic time of the first scheduled work due), kept
    while nothing that could move it happened: ask again after a wake-up or a busy cycle
    (``stale``), once that time has come, when the partitions held changed, or after a fallback
    interval (a program writing the tables directly sends no notification)."""

    def __init__(self) -> None:
        self.stale = True
        self.at: float | None = None
        self.asked = -1e9
        self.held: frozenset[int] = frozenset()

    def needs_asking(self, now: float, held: frozenset[int], fallback: float) -> bool:
        return (
            self.stale
            or held != self.held
            or (self.at is not None and now >= self.at)
            or now - self.asked >= fallback
        )

    def answer(self, now: float, seconds: float | None, held: frozenset[int]) -> None:
        self.stale = False
        self.at = None if seconds is None else now + seconds
        self.asked = now
        self.held = held


@dataclass
class _Loop:
    """What one run's loop knows between its cycles, made afresh by every run (see the module
    docstring for the algorithm it drives)."""

    started: float
    #: One line per database outage, and per lasting "database is locked" (SQLite), shared with
    #: the listening side, which meets the same outage.
    outage: WarningThrottle
    busy_db: WarningThrottle
    #: Monotonic time of the next renewal (with its balance, stealing allowed) and of the last
    #: balance of any kind (top-ups are throttled to one per ``poll_interval``).
    next_renew: float = 0.0
    last_balance: float = -1e9
    #: A notification, a catch-up or the due time since the last cycle: look for work now.
    woken: bool = False
    #: Holding nothing, and the last census saw no open partition in the feed: renewals are
    #: skipped and a rest lasts until woken or the fallback.
    quiet: bool = False
    #: A renewal was skipped while quiet: read the rate limits again before the next claim.
    limits_stale: bool = True
    #: Partitions held when the last balance ended: fewer now means some ran out (completed, or
    #: lost at a renewal) since then, so free partitions that balance left to others count as
    #: work coming due (see ``_rest``).
    held_after_balance: int = 0
    #: What next_due last said, and when to ask again.
    due: _NextDue = field(default_factory=_NextDue)
    #: Cycles in a row that failed on the database (the backoff grows with them).
    failures: int = 0
    #: ``run_until_idle``: cycles in a row with nothing done and nothing pending.
    idle_cycles: int = 0


def _traced(processor: Callable[[Item], object], settings: FeedWorkerSettings) -> Callable[[Item], object]:
    """``processor``, with a span per traced item if ``settings.tracing`` (see :mod:`.tracing`)."""
    if not settings.tracing:
        return processor
    from sluiceway.feed.tracing import TracedProcessor

    return TracedProcessor(processor, settings.prefix)


def default_owner() -> str:
    """A worker id unique across hosts, processes and restarts (never reused)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FeedWorker:
    """Processes a feed's items with ``processor``; see the module docstring for the algorithm.

    ``processor`` is a callable ``fn(item) -> {gate, done, data}``, ``"module:function"`` or an
    ``http(s)://`` URL (see :mod:`sluiceway.feed.processors`).

    >>> worker = FeedWorker("sqlite:///app.db", lambda item: {"done": True})   # doctest: +SKIP
    >>> worker.run_until_idle(timeout=30).completed                            # doctest: +SKIP
    3
    >>> with FeedWorker(dsn, "myapp.ocr:process", concurrency=8):             # doctest: +SKIP
    ...     serve_forever()                         # started on enter, stopped (leases released) on exit
    """

    def __init__(
        self,
        dsn: str | DataSource,
        processor: str | Callable[[Item], object],
        settings: FeedWorkerSettings | None = None,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        **options: Any,
    ) -> None:
        """``settings``, or its fields as keyword ``options`` (both: the options win); see
        :class:`~sluiceway.feed.settings.FeedWorkerSettings`. A bad one raises
        :class:`~sluiceway.feed.settings.FeedSettingsError` naming it."""
        if settings is None or options:
            given = settings.model_dump() if settings is not None else {}
            settings = FeedWorkerSettings.of(**{**given, **options})
        self.settings = settings
        self.source = dsn if isinstance(dsn, DataSource) else parse_dsn(dsn)
        postgres = self.source.dialect is Dialect.POSTGRES
        if settings.wake_ups and not postgres:
            raise FeedError(
                f"wake_ups need PostgreSQL (LISTEN/NOTIFY); on {self.source.dialect.value} workers poll "
                "every poll_interval: leave wake_ups unset"
            )
        #: Rest on LISTEN when idle (PostgreSQL; on by default there), else poll.
        self.wake_ups = postgres if settings.wake_ups is None else settings.wake_ups
        self.fallback_poll = settings.fallback_poll
        # A processor given as text is built per run (an HTTP one holds a connection pool, closed
        # when the run ends); building it here once checks the spec early (and, with tracing, that
        # the otel extra is there: TracedProcessor starts the process's tracing).
        self._load: Callable[[], Callable[[Item], object]] = lambda: _traced(
            load_processor(
                processor,
                timeout=settings.http_timeout,
                encoding=settings.http_encoding,
                concurrency=settings.concurrency,
            ),
            settings,
        )
        self.processor = self._load()
        self.prefix = settings.prefix
        table_names(settings.prefix)  # fail at construction, not in the worker thread
        self._owns_processor = isinstance(processor, str)
        self._close_processor(self.processor)
        self.owner = settings.owner or default_owner()
        self.concurrency = settings.concurrency
        self.policy = RetryPolicy(
            max_attempts=settings.max_attempts, backoff=settings.backoff, max_backoff=settings.max_backoff
        )
        self.manual_checkpoint = settings.manual_checkpoint
        self.batch_size = settings.batch_size
        self.lease = settings.lease
        self.renew_interval = settings.renew_interval
        self.poll_interval = settings.poll_interval
        self.checkpoint_interval = settings.checkpoint_interval
        self.migrate = settings.migrate
        self.clock: Clock = clock or SystemClock()
        self._rand = rand

        self._stop = threading.Event()
        self._wake: WakeUps | None = None  # the run's listening side, while a run has one
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._stats = WorkerStats(owner=self.owner)
        self._held: dict[int, Held] = {}
        self._target = 0
        # Concurrency > 1: outcomes come back from the pool through this queue.
        self._results: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._inflight = 0
        self._pending: list[Outcome] = []  # written at the next cycle (kept when a write fails)
        self._touched: set[int] = set()
        self._seconds_per_item = 0.0  # running estimate, to size claims for slow processors
        self._last_checkpoint = -1e9
        #: The feed's rate limits (read at every renewal) and, after a claim that a limit held
        #: back with no token at all, the seconds until the first token it waits for is due.
        self._limits: frozenset[RateKey] = frozenset()
        self._rate_wait: float | None = None
        self._rate_limited = False
        self._claims = 0  # rotates which group of rate-limited partitions claims first
        #: The current (or last) run's loop state.
        self._loop = _Loop(0.0, WarningThrottle(log, OUTAGE_REMINDER), WarningThrottle(log, OUTAGE_REMINDER))

    # -- public control -------------------------------------------------------------------------
    @property
    def stats(self) -> WorkerStats:
        with self._lock:
            return replace(self._stats)

    @property
    def partitions(self) -> list[str]:
        """Names of the partitions this worker holds right now."""
        with self._lock:
            return sorted(h.name for h in self._held.values())

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> FeedWorker:
        """Run in a background thread until :meth:`stop`."""
        if self.running:
            return self
        self._stop.clear()
        self._error = None
        self._thread = threading.Thread(
            target=self._thread_main, name=f"feed-worker-{self.owner}", daemon=True
        )
        self._thread.start()
        return self

    def _thread_main(self) -> None:
        try:
            self._run(until_idle=False, timeout=None)
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
            log.exception("feed worker %s stopped on an error", self.owner)

    def check(
        self,
        timeout: float = DEFAULT_STARTUP_TIMEOUT,
        *,
        setting: str = "startup_timeout",
        credentials: str = "dsn",
    ) -> None:
        """The start-up check, before :meth:`run` or :meth:`start` (``sluice feed worker`` runs
        it): reach the database, create or upgrade the feed's tables (``migrate``), and read and
        renew as the worker will (a renewal of nothing: this worker holds no lease yet).

        A database out of reach is waited for up to ``timeout`` seconds (``math.inf``: for ever),
        then :class:`~sluiceway.errors.StartupUnreachable` names it and ``setting``; a refusal (no
        such database, wrong password, a missing privilege) raises
        :class:`~sluiceway.errors.StartupRefused` at once, its fix naming ``credentials``.
        """

        def attempt(seconds: float) -> None:
            with Database(self.source, connect_timeout=seconds) as db:
                store = FeedStore(db, self.prefix)
                if self.migrate:
                    store.migrate()
                store.census()
                store.renew(self.owner, self.lease)

        wait_for_start(
            attempt, what=server_of(self.source), timeout=timeout, setting=setting, credentials=credentials
        )

    def request_stop(self) -> None:
        """Ask the loop to stop without waiting (safe from a signal handler); see :meth:`stop`."""
        self._stop.set()
        wake = self._wake
        if wake is not None:
            wake.interrupt()  # a rest on the listening connection may last fallback_poll seconds

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming, let items in flight finish, write their outcomes, release our leases."""
        self.request_stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise FeedTimeout(f"feed worker {self.owner} did not stop within {timeout:g}s")
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def run(self) -> None:
        """Run in this thread until :meth:`stop` is called (e.g. from a signal handler)."""
        self._stop.clear()
        self._run(until_idle=False, timeout=None)

    def run_until_idle(self, timeout: float | None = None) -> WorkerStats:
        """Work until there is nothing this worker can do, then release leases and return stats.

        Idle means: nothing claimable or in flight, no item of ours waiting for a retry, no free
        partition to take, nothing to fan in. Partitions held by other live workers are theirs.
        It polls (every ``poll_interval`` while retries are pending), without wake-ups: it ends
        as soon as it is idle, so there is no long rest to save.
        """
        self._stop.clear()
        self._run(until_idle=True, timeout=timeout)
        return self.stats

    def __enter__(self) -> FeedWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop -------------------------------------------------------------------------------
    def _run(self, *, until_idle: bool, timeout: float | None) -> None:
        if self._owns_processor:
            self.processor = self._load()
        store = FeedStore(Database(self.source), self.prefix)
        pool = (
            ThreadPoolExecutor(self.concurrency, thread_name_prefix="feed-proc")
            if self.concurrency > 1
            else None
        )
        now = self.clock.monotonic
        loop = self._loop = _Loop(
            started=now(),
            outage=WarningThrottle(log, OUTAGE_REMINDER, clock=now),
            busy_db=WarningThrottle(log, OUTAGE_REMINDER, clock=now, grace=BUSY_GRACE),
        )
        loop.next_renew = loop.started
        if self.wake_ups and not until_idle:
            # Not listening yet: the first rest listens, then returns at once for a catch-up look.
            self._wake = WakeUps(
                self.source, store.q["listen"], owner=self.owner, poll_interval=self.poll_interval,
                clock=self.clock, outage=loop.outage,
            )  # fmt: skip
        wake = self._wake
        try:
            if self.migrate:
                store.migrate()
            while not self._stop.is_set():
                at = now()
                if timeout is not None and at - loop.started > timeout:
                    raise FeedTimeout(f"feed worker {self.owner} was not idle after {timeout:g}s")
                try:
                    busy, waiting = self._step(store, pool, at, until_idle=until_idle)
                except DatabaseRefusedError:
                    raise  # a refused login, a dropped database: permanent, never retried
                except DatabaseError as exc:
                    self._trouble(exc)
                    continue
                if until_idle:
                    loop.idle_cycles = 0 if (busy or waiting) else loop.idle_cycles + 1
                    if loop.idle_cycles >= 2:
                        break
                if busy:
                    loop.due.stale = True  # something changed: what is due next may have too
                    continue
                self._idle(store, wake, until_idle=until_idle, waiting=waiting)
        finally:
            self._wake = None
            try:
                self._shutdown(store, pool)
            finally:
                if wake is not None:
                    wake.close()

    def _step(
        self, store: FeedStore, pool: ThreadPoolExecutor | None, now: float, *, until_idle: bool
    ) -> tuple[bool, bool]:
        """One round: the renewal when due, a cycle, and a top-up when idle, woken or running
        dry. Returns (did something, work is pending but not ready)."""
        loop = self._loop
        balanced = False  # a renewal's balance ran this round
        if now >= loop.next_renew:
            if self._held or not loop.quiet:
                self._renew(store)
            else:
                # Quiet: nothing to renew, and no lease of ours unknown to us (the census would
                # have counted it). Limits matter from the next claim on.
                loop.limits_stale = True
            self._balance(store, allow_steal=True)
            balanced = True
            loop.next_renew, loop.last_balance = now + self.renew_interval, now
        busy, waiting, short = self._cycle(store, pool)
        if (
            not busy
            and not (balanced and loop.quiet)  # it just looked: nothing anywhere
            and (until_idle or loop.woken or (short and now - loop.last_balance >= self.poll_interval))
        ):
            # Idle, woken, or our partitions ran dry: look for free ones (stealing waits for the
            # renewal cycle, one partition at a time). A wake-up always looks: its partition may
            # be new, or just released.
            busy = self._balance(store, allow_steal=False) > 0
            loop.last_balance = now
        loop.woken = False
        loop.busy_db.resolved("feed worker %s: the database is writable again", self.owner)
        if loop.failures:
            loop.outage.resolved(
                "feed worker %s: database reachable again after %.1fs (%d failed cycles)",
                self.owner, loop.outage.duration(), loop.failures,
            )  # fmt: skip
        loop.failures = 0
        return busy, waiting

    def _trouble(self, exc: DatabaseError) -> None:
        """A round the database failed: said once per outage, then waited out with backoff."""
        loop = self._loop
        if isinstance(exc, LockTimeoutError):
            # "database is locked": another writer holds SQLite's one write lock. Nothing was
            # done; try again soon. A wait, not an outage: said only if it lasts.
            loop.busy_db.warn(
                "feed worker %s: the database has been locked for a while (%s)", self.owner, exc
            )
            self._stop.wait(min(self.poll_interval, 0.05))
            return
        loop.failures += 1
        pause = min(self.renew_interval, self.poll_interval * 2 ** min(loop.failures, 6))
        # One line per outage (and a reminder a minute while it lasts), not one per cycle: a
        # restart meets every cycle of its few seconds.
        loop.outage.warn(
            "feed worker %s: database call failed (%s); retrying with backoff (up to %.1fs)",
            self.owner, exc, self.renew_interval,
        )  # fmt: skip
        self._stop.wait(pause)

    def _idle(self, store: FeedStore, wake: WakeUps | None, *, until_idle: bool, waiting: bool) -> None:
        """Nothing done this round: wait for a rate limit's next token, rest on the listening
        connection, or wait a poll interval (for outcomes from the pool, if any are due)."""
        loop = self._loop
        rate_wait = self._rate_wait
        if rate_wait is not None:
            # Held back by a rate limit: rest until its next token is due (from the bucket's
            # level and rate), not for a poll interval, and never in a tight loop.
            rate_wait = min(max(rate_wait, MIN_REST), self.renew_interval)
            with self._lock:
                self._stats.rate_waits += 1
                self._stats.rate_wait_seconds += rate_wait
        if wake is not None and self._inflight == 0:
            # Quiet, the next renewal has nothing to do: only a notification, work coming due or
            # the fallback ends the rest.
            renew_at = math.inf if loop.quiet and not self._held else loop.next_renew
            loop.woken = self._rest(store, wake, renew_at, rate_wait)
        elif rate_wait is not None:
            self._idle_wait(min(rate_wait, self.poll_interval))
        else:
            self._idle_wait(self.poll_interval if not until_idle or waiting else 0.0)

    def _rest(
        self, store: FeedStore, wake: WakeUps, next_renew: float, rate_wait: float | None = None
    ) -> bool:
        """Nothing to do and nothing in flight: rest on the listening connection until a
        notification, the next renewal, the next work due, or the fallback poll. True when woken
        by a notification, a catch-up after (re)listening, or the due time itself.

        ``rate_wait``: work is there but a rate limit holds it back: rest until its next token,
        without asking what else is due (claimable work is, so the answer would be "now").
        """
        now = self.clock.monotonic()
        timeout = min(self.fallback_poll, next_renew - now)
        if rate_wait is not None:
            before = wake.notifications
            woken = wake.rest(max(min(timeout, rate_wait), MIN_REST))
            if wake.notifications != before:
                with self._lock:
                    self._stats.wakeups += wake.notifications - before
            if woken:
                self._loop.due.stale = True
            return woken
        # Work that becomes claimable with nobody committing — items at our gates backing off
        # (retries, retry_in) or scheduled (not_before), claims of a worker that died, free
        # partitions scheduled for later — comes with no notification: ask the database when the
        # first of it is due. Not only when our gates are open (a scheduled partition is nobody's
        # yet), but not before every rest either: the answer is kept until something changes
        # (see _NextDue), so an idle worker's renewal rests cost no extra statement.
        loop = self._loop
        due = loop.due
        if due.needs_asking(now, frozenset(self._held), self.fallback_poll):
            # A partition that came due since our last balance is one we have not seen yet. Once
            # partitions of ours ran out since that balance (its top-up is throttled to one per
            # poll_interval), the free ones it left to others may be ours to take: all count then.
            ran_out = len(self._held) < loop.held_after_balance
            since = ANY_AGE if ran_out else now - loop.last_balance
            try:
                seconds = store.next_due(self.owner, since + DUE_SLACK)
                due.answer(now, seconds, frozenset(self._held))
            except DatabaseError:
                seconds = self.poll_interval  # the next cycle meets the trouble and reports it
                due.stale = True
            if seconds is not None:
                timeout = min(timeout, seconds + DUE_SLACK)
        elif due.at is not None:
            timeout = min(timeout, due.at - now + DUE_SLACK)
        before = wake.notifications
        woken = wake.rest(max(timeout, MIN_REST))
        if wake.notifications != before:
            with self._lock:
                self._stats.wakeups += wake.notifications - before
        if not woken and due.at is not None and self.clock.monotonic() >= due.at:
            # Woken by the due time itself: look at once, balancing included, as for a
            # notification. Skipping the balance (it is throttled to one per poll_interval) would
            # be a long sleep: a free partition that is due is no longer in next_due's answer.
            woken = True
        if woken:
            due.stale = True  # new work, a catch-up, or the due time: what is next may have moved
        return woken

    def _idle_wait(self, seconds: float) -> None:
        if self._inflight > 0:
            self._gather(seconds)
        elif seconds > 0:
            self._stop.wait(seconds)

    def _gather(self, seconds: float) -> None:
        """Wait for outcomes from the pool: wake on the first (not on a timer), then linger a
        moment for more, so that slow processors' outcomes are still written in batches rather
        than one statement per item."""
        try:
            self._pending.append(self._results.get(timeout=max(seconds, 0.01)))
            self._inflight -= 1
        except queue.Empty:
            return
        want = max(1, min(self.batch_size, self.concurrency) // 2)
        deadline = time.monotonic() + GATHER_DELAY
        while self._inflight > 0 and len(self._pending) < want:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                self._pending.append(self._results.get(timeout=remaining))
                self._inflight -= 1
            except queue.Empty:
                return

    def _cycle(self, store: FeedStore, pool: ThreadPoolExecutor | None) -> tuple[bool, bool, bool]:
        """One round. Returns (did something, work is pending but not ready, claim ran short)."""
        busy = self._flush(store)
        claimed = 0
        requested = 0
        if self._held:
            requested = self._claim_size()
            if requested > 0:
                batch = self._claim(store, requested)
                claimed = len(batch)
                if batch:
                    self._dispatch(store, batch, pool)
                    busy = True
                    busy = self._flush(store) or busy
        # Short: we asked and got less (our partitions are running dry, or nothing is held). Not
        # when a full pool kept us from asking, nor when a rate limit did: that says nothing about
        # the partitions.
        short = not self._held or (requested > 0 and claimed < requested and not self._rate_limited)
        now = self.clock.monotonic()
        progressed = False
        open_gates = 0
        if self._held and (
            short or (self._touched and now - self._last_checkpoint >= self.checkpoint_interval)
        ):
            ids = list(self._held) if short else list(self._touched & self._held.keys())
            progressed, open_gates = self._checkpoint(store, ids)
            self._touched.clear()
            self._last_checkpoint = now
        waiting = (
            self._inflight > 0
            or bool(self._pending)
            or (short and open_gates > 0)
            or self._rate_wait is not None
        )
        return busy or progressed, waiting, short

    def _claim(self, store: FeedStore, requested: int) -> list[Claimed]:
        """Claim up to ``requested`` items; under rate limits, no more than their buckets give.

        Without limits this is the one claim statement. With them, the partitions we hold are
        grouped by the set of buckets their attributes match; each group takes tokens for what it
        may claim (from every bucket of its set), claims at most that many from its partitions, and
        gives back what the claim did not use. A token is taken before its item is claimed, so all
        workers together never claim more than a bucket gives (``burst + max_rate · T``). A claim
        that fails after its take loses those tokens: fewer items, never more.
        """
        self._rate_wait = None
        self._rate_limited = False
        if self._loop.limits_stale:
            self._read_limits(store)
        if not self._limits:
            return store.claim(self.owner, requested, self.lease)
        groups: dict[tuple[RateKey, ...], list[int]] = {}
        for held in self._held.values():
            groups.setdefault(keys_for(held.attributes, self._limits), []).append(held.id)
        order = sorted(groups)
        # Start from a different group each time, so that one group with tokens to fill every
        # batch does not keep the others of this worker waiting.
        self._claims += 1
        start = self._claims % len(order)
        batch: list[Claimed] = []
        for keys in order[start:] + order[:start]:
            room = requested - len(batch)
            if room <= 0:
                break
            granted = self._take(store, keys, room)
            if granted == 0:
                continue
            ids = groups[keys]
            got = (
                store.claim(self.owner, granted, self.lease)
                if len(groups) == 1
                else store.claim_in(self.owner, sorted(ids), granted, self.lease)
            )
            for key in keys:
                store.give_back_tokens(key, granted - len(got))
            batch.extend(got)
        return batch

    def _take(self, store: FeedStore, keys: tuple[RateKey, ...], want: int) -> int:
        """Take up to ``want`` tokens from every bucket of ``keys``; return how many items that
        allows (the least any bucket gave), having given the excess back to the others."""
        allowed = want
        taken: list[RateKey] = []
        for key in keys:
            grant = store.take_tokens(key, allowed)
            if grant is None:
                continue  # the limit was cleared since we read the list: it no longer applies
            if grant.taken < allowed:
                self._rate_limited = True
                for earlier in taken:
                    store.give_back_tokens(earlier, allowed - grant.taken)
                allowed = grant.taken
            if allowed == 0:
                if grant.wait is not None:
                    self._rate_wait = (
                        grant.wait if self._rate_wait is None else min(self._rate_wait, grant.wait)
                    )
                return 0
            taken.append(key)
        return allowed

    def _claim_size(self) -> int:
        if self.concurrency == 1:
            room = self.batch_size
        else:
            # Keep up to two batches in flight so the pool never starves between claims, but do
            # not claim dribbles: wait until a worthwhile number has come back.
            room = 2 * max(self.batch_size, self.concurrency) - self._inflight
            if room < min(self.batch_size, self.concurrency):
                return 0
        if self._seconds_per_item > 0:
            # Never claim more than the processors can start within half the claim lease.
            fits = int((self.lease / 2) / (self._seconds_per_item * 1.5) * self.concurrency)
            room = min(room, max(1, fits))
        return min(room, self.batch_size)

    # -- processing -----------------------------------------------------------------------------
    def _items_for(self, store: FeedStore, batch: list[Claimed]) -> dict[int, Held]:
        missing = {c.partition_id for c in batch} - self._held.keys()
        if missing:
            # Ours in the database but not in memory (an answer lost to a failed call): look up.
            found = store.held(self.owner, sorted(missing))
            with self._lock:
                for held in found:
                    self._held[held.id] = held
        return dict(self._held)

    def _dispatch(self, store: FeedStore, batch: list[Claimed], pool: ThreadPoolExecutor | None) -> None:
        start_by = self.clock.monotonic() + self.lease / 2
        held = self._items_for(store, batch)
        if pool is None:
            t0 = self.clock.monotonic()
            self._pending.extend(self._process(batch, held, start_by))
            self._observe(self.clock.monotonic() - t0, len(batch))
            return
        for claimed in batch:
            pool.submit(self._pool_task, claimed, held, start_by)
            self._inflight += 1

    def _pool_task(self, claimed: Claimed, held: dict[int, Held], start_by: float) -> None:
        t0 = self.clock.monotonic()
        outcome = requeue_outcome(claimed)
        try:
            [outcome] = self._process([claimed], held, start_by)
        finally:
            self._observe(self.clock.monotonic() - t0, 1)
            self._results.put(outcome)

    def _observe(self, seconds: float, n: int) -> None:
        if n:
            per = seconds / n
            self._seconds_per_item = (
                per if self._seconds_per_item == 0 else 0.8 * self._seconds_per_item + 0.2 * per
            )

    def _process(self, batch: list[Claimed], held: dict[int, Held], start_by: float) -> list[Outcome]:
        """Run the processor on each claimed item, in order; one outcome each.

        The worker's per-item path (a no-op processor spends most of its time here), so the
        lookups are taken out of the loop."""
        now, stopping = self.clock.monotonic, self._stop.is_set
        processor, policy, rand = self.processor, self.policy, self._rand
        outcomes: list[Outcome] = []
        for claimed in batch:
            partition = held.get(claimed.partition_id)
            if partition is None or stopping() or now() > start_by:
                # Not started: hand it back now. Past start_by, its claim lease could run out
                # while we process it, and another worker could start it too.
                outcomes.append(requeue_outcome(claimed))
                continue
            item = Item(
                claimed.id, partition.name, claimed.gate, claimed.data, claimed.attempts,
                claimed.partition_id, partition.attributes,
            )  # fmt: skip
            outcomes.append(process_one(processor, claimed, item, policy, rand))
        return outcomes

    def _flush(self, store: FeedStore) -> bool:
        """Write the outcomes that are ready, as one batch."""
        while self._inflight > 0:
            try:
                self._pending.append(self._results.get_nowait())
                self._inflight -= 1
            except queue.Empty:
                break
        if not self._pending:
            return False
        outcomes = self._pending
        written = store.complete(outcomes)  # on error, _pending stays for the next cycle
        self._pending = []
        kinds = [o.kind for o in outcomes]
        with self._lock:
            s = self._stats
            s.processed += len(kinds) - kinds.count(OutcomeKind.REQUEUE)
            s.completed += kinds.count(OutcomeKind.DONE)
            s.moved += kinds.count(OutcomeKind.MOVED)
            s.retried += kinds.count(OutcomeKind.RETRY)
            s.failed += kinds.count(OutcomeKind.FAILED)
            s.requeued += kinds.count(OutcomeKind.REQUEUE)
            s.deferred += kinds.count(OutcomeKind.DEFERRED)
            s.lost += len(outcomes) - written
        if written < len(outcomes):
            log.info(
                "feed worker %s: %d of %d outcomes arrived after their claim lapsed and were dropped",
                self.owner, len(outcomes) - written, len(outcomes),
            )  # fmt: skip
        self._touched.update({o.partition_id for o in outcomes})
        return True

    # -- gates ----------------------------------------------------------------------------------
    def _checkpoint(self, store: FeedStore, ids: list[int]) -> tuple[bool, int]:
        """Fan in where a gate is done. Returns (anything changed, partitions with open gates)."""
        if not ids:
            return False, 0
        summaries = store.summarize_owned(self.owner, ids)
        seen = {s.partition_id for s in summaries}
        progressed = False
        with self._lock:
            for pid in set(ids) - seen:
                # Not ours any more (stolen, released, closed by someone): forget it.
                self._held.pop(pid, None)
                progressed = True
        # No notification for our own advances: only the holder may claim a partition's items,
        # and that is us, going on to claim without resting.
        applied = store.apply(
            [(s, decide(s, manual=self.manual_checkpoint)) for s in summaries], notify=False
        )
        with self._lock:
            for summary, decision, ok in applied:
                if not ok:
                    continue
                progressed = True
                if decision is Decision.ADVANCE:
                    self._stats.gates_advanced += 1
                    held = self._held.get(summary.partition_id)
                    if held is not None and summary.next_gate is not None:
                        self._held[summary.partition_id] = replace(held, gate=summary.next_gate)
                    self._touched.add(summary.partition_id)
                elif decision is Decision.COMPLETE:
                    self._stats.partitions_completed += 1
                    self._held.pop(summary.partition_id, None)
                elif decision is Decision.FAIL:
                    self._stats.partitions_failed += 1
                    self._held.pop(summary.partition_id, None)
                    pid, gate = summary.partition_id, summary.gate
                    log.warning("feed partition %d is blocked by failed items at gate %d", pid, gate)
        return progressed, sum(1 for s in summaries if s.open)

    # -- leases ---------------------------------------------------------------------------------
    def _renew(self, store: FeedStore) -> None:
        still = store.renew(self.owner, self.lease)
        self._read_limits(store)
        with self._lock:
            lost = self._held.keys() - still
            for pid in lost:
                self._held.pop(pid)
        if lost:
            log.info("feed worker %s lost %d partition(s) to other workers", self.owner, len(lost))
        unknown = still - self._held.keys()
        if unknown:
            # Ours in the database but not in memory (e.g. an answer lost to a failed call).
            with self._lock:
                for held in store.held(self.owner, sorted(unknown)):
                    self._held[held.id] = held

    def _read_limits(self, store: FeedStore) -> None:
        # Limits are a shared setting (Feed.set_rate): a new or cleared one applies from the next
        # renewal (or, for a quiet worker, its next claim); a changed rate at once (a take reads
        # it from the bucket's row).
        self._limits = frozenset(limit.key for limit in store.rate_limits())
        self._loop.limits_stale = False

    def _balance(self, store: FeedStore, *, allow_steal: bool) -> int:
        """One balancing step; returns how many partitions were gained."""
        gained = self._balance_step(store, allow_steal=allow_steal)
        self._loop.held_after_balance = len(self._held)  # what a balance that ran left us with
        return gained

    def _balance_step(self, store: FeedStore, *, allow_steal: bool) -> int:
        loop = self._loop
        loop.quiet = False
        census = store.census()
        mine = len(self._held)
        # No open partition in the whole feed, and none of ours: nothing to take, steal or take
        # over until something notifies (or comes due). available counts every lease, expired or
        # not, so a lease of ours we do not know about keeps this False (the renewal adopts it).
        loop.quiet = mine == 0 and census.available == 0
        step = plan(self.owner, mine, census)
        self._target = step.target
        if step.release:
            # Give back the newest: they are the least likely to have work in flight with us.
            ids = sorted(self._held)[-step.release :]
            released = store.release(self.owner, ids)
            with self._lock:
                for pid in ids:
                    self._held.pop(pid, None)
                self._stats.released += released
            log.info("feed worker %s released %d partition(s) (target %d)", self.owner, released, step.target)
            return 0
        if step.acquire <= 0:
            return 0
        # Read a wider page than needed (highest priorities first) and take the best of it, a
        # random part among equal priorities: workers balancing at the same moment then mostly try
        # different rows instead of all losing on the same ones.
        need = min(step.acquire, ACQUIRE_PAGE)
        free = store.free_partitions(min(ACQUIRE_PAGE, max(2 * need, need + 8)))
        pick = choose(free, need, self._rand)
        got = store.acquire(self.owner, pick, self.lease) if pick else []
        stolen: list[Held] = []
        if not free and allow_steal:
            target_owner = victim(self.owner, mine, step.target, census)
            if target_owner is not None:
                row = store.victim_partition(target_owner)
                if row is not None:
                    stolen = store.steal(self.owner, row[0], row[1], self.lease)
                    if stolen:
                        log.info(
                            "feed worker %s stole partition %d from %s", self.owner, row[0], target_owner
                        )
        with self._lock:
            for held in (*got, *stolen):
                self._held[held.id] = held
            self._stats.acquired += len(got)
            self._stats.stolen += len(stolen)
        return len(got) + len(stolen)

    # -- shutdown -------------------------------------------------------------------------------
    def _shutdown(self, store: FeedStore, pool: ThreadPoolExecutor | None) -> None:
        self._stop.set()  # queued pool tasks see it and hand their items back unprocessed
        try:
            if pool is not None:
                pool.shutdown(wait=True)
            while self._inflight > 0:
                self._pending.append(self._results.get())
                self._inflight -= 1
            try:
                self._flush(store)
                ids = sorted(self._held)
                if ids:
                    released = store.release(self.owner, ids)
                    with self._lock:
                        self._stats.released += released
                        self._held.clear()
            except DatabaseError as exc:
                # Outcomes not written are processed again once their claims lapse (at-least-once).
                log.warning("feed worker %s could not report on shutdown: %s", self.owner, exc)
        finally:
            store.db.close()
            self._close_processor(self.processor)

    def _close_processor(self, processor: object) -> None:
        """Close what the worker built itself (an HTTP processor's connection pool)."""
        close = getattr(processor, "close", None)
        if self._owns_processor and callable(close):
            close()

    def close(self) -> None:
        """Kept for symmetry with other parts: a run already closes what it opened."""
