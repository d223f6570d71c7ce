"""Prometheus metrics of a feed worker, read from the worker's own counters at scrape time.

The worker already counts what it does (:class:`~sluiceway.feed.model.WorkerStats`, under its
lock); a collector that copies those counters when Prometheus scrapes adds nothing to the
worker's hot path and cannot drift from ``stats``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sluiceway.db import Database
from sluiceway.errors import SluicewayError
from sluiceway.feed.model import ScheduledWork
from sluiceway.feed.store import FeedStore
from sluiceway.feed.worker import FeedWorker

log = logging.getLogger("sluiceway.feed")

#: Seconds a reading of the feed's scheduled work serves scrapes before it is read again.
SCHEDULED_EVERY = 15.0

#: ``sluice_feed_items_total{outcome}``: what became of the items this worker processed.
ITEM_OUTCOMES = ("completed", "moved", "retried", "deferred", "failed", "requeued", "lost")
#: ``sluice_feed_partitions_total{event}``: partitions this worker took, gave back or closed.
PARTITION_EVENTS = (
    ("acquired", "acquired"),
    ("stolen", "stolen"),
    ("released", "released"),
    ("completed", "partitions_completed"),
    ("failed", "partitions_failed"),
)

#: The worker's other counters, one series each: name, help, ``WorkerStats`` field.
WORKER_COUNTERS = (
    ("sluice_feed_gates_advanced", "Gates this worker advanced", "gates_advanced"),
    (
        "sluice_feed_wakeups",
        "Notifications that woke this worker from an idle rest (PostgreSQL wake-ups)",
        "wakeups",
    ),
    (
        "sluice_feed_rate_limited_waits",
        "Rests this worker took because a rate limit had no token for work that was there",
        "rate_waits",
    ),
    (
        "sluice_feed_rate_limited_wait_seconds",
        "Seconds of those rests (each until the next token was due)",
        "rate_wait_seconds",
    ),
)


class FeedMetrics:
    """Series for one worker on a private registry; ``feed`` labels them (the table prefix).

    For example::

        metrics = FeedMetrics(worker, feed="feed_")
        endpoint = serve_metrics(metrics.registry, "127.0.0.1:9465")
    """

    def __init__(
        self, worker: FeedWorker, feed: str, *, dsn: str | None = None, every: float = SCHEDULED_EVERY
    ) -> None:
        from prometheus_client import CollectorRegistry

        self.worker = worker
        self.feed = feed
        #: With ``dsn``: the feed's scheduled work too, read on a connection of its own (one
        #: small indexed query) at most every ``every`` seconds, whoever scrapes.
        self._dsn, self._every = dsn, every
        self._lock = threading.Lock()
        self._store: FeedStore | None = None
        self._read_at = float("-inf")
        self._scheduled: ScheduledWork | None = None
        self._closed = False
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._store is not None:
                self._store.db.close()
                self._store = None

    def scheduled(self) -> ScheduledWork | None:
        """The feed's scheduled work, read at most every ``every`` seconds; None without a
        ``dsn`` or while the database cannot be read (the gauges are left out, not wrong). A
        scrape while another one is reading serves the last reading: a database that hangs
        holds up one scrape, not all of them."""
        if self._dsn is None or not self._lock.acquire(blocking=False):
            return self._scheduled
        try:
            now = time.monotonic()
            if not self._closed and now - self._read_at >= self._every:
                self._read_at = now
                try:
                    if self._store is None:
                        self._store = FeedStore(Database(self._dsn), self.feed)
                    self._scheduled = self._store.scheduled()
                except SluicewayError as exc:
                    log.debug("feed metrics: scheduled work not read: %s", exc)
                    self._scheduled = None
            return self._scheduled
        finally:
            self._lock.release()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.worker.stats
        items = CounterMetricFamily(
            "sluice_feed_items", "Items this worker processed, by outcome", labels=["feed", "outcome"]
        )
        for outcome in ITEM_OUTCOMES:
            items.add_metric([self.feed, outcome], getattr(stats, outcome))
        yield items
        partitions = CounterMetricFamily(
            "sluice_feed_partitions",
            "Partitions this worker took, gave back or closed",
            labels=["feed", "event"],
        )
        for event, field in PARTITION_EVENTS:
            partitions.add_metric([self.feed, event], getattr(stats, field))
        yield partitions
        for name, description, field in WORKER_COUNTERS:
            counter = CounterMetricFamily(name, description, labels=["feed"])
            counter.add_metric([self.feed], getattr(stats, field))
            yield counter
        held = GaugeMetricFamily(
            "sluice_feed_partitions_held", "Partitions leased right now", labels=["feed"]
        )
        held.add_metric([self.feed], len(self.worker.partitions))
        yield held
        scheduled = self.scheduled()
        if scheduled is None:
            return
        for kind, count in (("partitions", scheduled.partitions), ("items", scheduled.items)):
            gauge = GaugeMetricFamily(
                f"sluice_feed_scheduled_{kind}",
                f"Feed {kind} scheduled for later (not_before, retry_in) and not due yet",
                labels=["feed"],
            )
            gauge.add_metric([self.feed], count)
            yield gauge
        if scheduled.next_due is not None:
            due = GaugeMetricFamily(
                "sluice_feed_next_due_seconds",
                "Seconds until the feed's first scheduled work is due",
                labels=["feed"],
            )
            due.add_metric([self.feed], max(0.0, (scheduled.next_due - datetime.now(UTC)).total_seconds()))
            yield due
