"""Prometheus metrics of a feed worker, read from the worker's own counters at scrape time.

The worker already counts what it does (:class:`~sluiceway.feed.model.WorkerStats`, under its
lock); a collector that copies those counters when Prometheus scrapes adds nothing to the
worker's hot path and cannot drift from ``stats``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sluiceway.feed.worker import FeedWorker

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


class FeedMetrics:
    """Series for one worker on a private registry; ``feed`` labels them (the table prefix).

    >>> metrics = FeedMetrics(worker, feed="feed_")                  # doctest: +SKIP
    >>> endpoint = serve_metrics(metrics.registry, "127.0.0.1:9465")
    """

    def __init__(self, worker: FeedWorker, feed: str) -> None:
        from prometheus_client import CollectorRegistry

        self.worker = worker
        self.feed = feed
        self.registry = CollectorRegistry()
        self.registry.register(self)

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
        gates = CounterMetricFamily(
            "sluice_feed_gates_advanced", "Gates this worker advanced", labels=["feed"]
        )
        gates.add_metric([self.feed], stats.gates_advanced)
        yield gates
        wakeups = CounterMetricFamily(
            "sluice_feed_wakeups",
            "Notifications that woke this worker from an idle rest (PostgreSQL wake-ups)",
            labels=["feed"],
        )
        wakeups.add_metric([self.feed], stats.wakeups)
        yield wakeups
        rate_waits = CounterMetricFamily(
            "sluice_feed_rate_limited_waits",
            "Rests this worker took because a rate limit had no token for work that was there",
            labels=["feed"],
        )
        rate_waits.add_metric([self.feed], stats.rate_waits)
        yield rate_waits
        rate_seconds = CounterMetricFamily(
            "sluice_feed_rate_limited_wait_seconds",
            "Seconds of those rests (each until the next token was due)",
            labels=["feed"],
        )
        rate_seconds.add_metric([self.feed], stats.rate_wait_seconds)
        yield rate_seconds
        held = GaugeMetricFamily(
            "sluice_feed_partitions_held", "Partitions leased right now", labels=["feed"]
        )
        held.add_metric([self.feed], len(self.worker.partitions))
        yield held
