"""Prometheus metrics for the harvester (off by default; loopback when on)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from sluiceway.harvest.events import (
    Event,
    KeyParked,
    LeaderAcquired,
    LeaderFenced,
    LeaderRevoked,
    MeterRead,
    RecordDeadLettered,
)
from sluiceway.metrics import MetricsEndpoint, serve_metrics

log = logging.getLogger("sluiceway.harvest")


class HarvestMetrics:
    """Turns harvester events into Prometheus series on a private registry."""

    def __init__(
        self, name: str, *, destination: str = "kafka", outbox: tuple[str, str] | None = None
    ) -> None:
        """``outbox``: the outbox's (dsn, table), for the age of its oldest row at each scrape."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = {"harvest": name}
        self._labels = labels
        self.records = Counter(
            "sluice_harvest_records_total",
            "Outbox records by outcome",
            ["harvest", "outcome"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "sluice_harvest_in_flight", "Records in flight", ["harvest"], registry=self.registry
        )
        self.leader = Gauge(
            "sluice_harvest_leader", "1 while this process leads", ["harvest"], registry=self.registry
        )
        self.latency = Histogram(
            "sluice_harvest_latency_seconds",
            "Row creation to broker acknowledgement (p50 per meter read)",
            ["harvest"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.parked_keys = Gauge(
            "sluice_harvest_parked_keys",
            "Keys parked behind a dead letter (their later records wait for an operator)",
            ["harvest"],
            registry=self.registry,
        )
        self.keys_parked = Counter(
            "sluice_harvest_keys_parked_total",
            "Dead letters that parked their key",
            ["harvest"],
            registry=self.registry,
        )
        # Which kind of destination this harvester publishes to (kafka, journal, nats, rabbitmq, redis).
        Gauge(
            "sluice_harvest_destination",
            "1 for the kind of destination the harvester publishes to",
            ["harvest", "destination"],
            registry=self.registry,
        ).labels(name, destination).set(1)
        # Every labelled series exists from the start, at zero: a dashboard of a fresh process
        # shows 0, not "no data", and rate() has a first point to start from.
        for outcome in OUTCOMES:
            self.records.labels(name, outcome)
        for series in (self.latency, self.keys_parked):
            series.labels(name)
        self.leader.labels(name).set(0)
        self._backlog = None if outbox is None else _BacklogAge(name, *outbox)
        if self._backlog is not None:
            self.registry.register(self._backlog)
        self._endpoint: MetricsEndpoint | None = None

    def observe(self, event: Event) -> None:
        name = self._labels["harvest"]
        if isinstance(event, MeterRead):
            s = event.stats
            for outcome, n in (
                ("marked", s.marked),
                ("published", s.published),
                ("purged", s.purged),
                ("reset", s.reset),
                ("dead", s.dead),
            ):
                if n:
                    self.records.labels(name, outcome).inc(n)
            self.in_flight.labels(name).set(s.in_flight)
            if "p50" in s.latency_ms:
                self.latency.labels(name).observe(s.latency_ms["p50"] / 1000.0)
            if s.parked_keys is not None:
                self.parked_keys.labels(name).set(s.parked_keys)
        elif isinstance(event, LeaderAcquired):
            self.leader.labels(name).set(1)
        elif isinstance(event, LeaderRevoked | LeaderFenced):
            self.leader.labels(name).set(0)
        elif isinstance(event, RecordDeadLettered):
            self.records.labels(name, "dead_lettered").inc()
        elif isinstance(event, KeyParked):
            self.keys_parked.labels(name).inc()

    def serve(self, addr: str) -> tuple[str, int]:
        """Serve /metrics on ``host:port`` (default host 127.0.0.1). Returns the bound address."""
        self._endpoint = serve_metrics(self.registry, addr)
        return self._endpoint.host, self._endpoint.port

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        if self._backlog is not None:
            self._backlog.close()


#: ``sluice_harvest_records_total``'s outcomes: the meter's counts, and each record buried
#: (``dead_lettered``, one per :class:`RecordDeadLettered`; ``dead`` is the meter's count of them).
OUTCOMES = ("marked", "published", "purged", "reset", "dead", "dead_lettered")


class _BacklogAge:
    """``sluice_harvest_backlog_age_seconds{harvest}``: how long the row at the head of the
    outbox (the lowest id: the next to publish, or in flight) has waited, read when scraped on a
    read-only connection of its own (one index probe); 0 when the outbox is empty. A scrape
    while the database is away has no sample (and logs why), rather than failing."""

    def __init__(self, name: str, dsn: str, table: str) -> None:
        self.name, self.dsn, self.table = name, dsn, table
        self._db: Any = None
        self._layout: Any = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from sluiceway.db import Database
        from sluiceway.outbox.table import discover, head_age

        gauge = GaugeMetricFamily(
            "sluice_harvest_backlog_age_seconds",
            "Seconds the row at the head of the outbox has waited (0: empty), by the database's clock",
            labels=["harvest"],
        )
        with self._lock:  # scrapes may overlap; one connection serves them in turn
            try:
                if self._db is None:
                    self._db = Database(self.dsn, read_only=True)
                    self._layout = discover(self._db, self.table)
                age = head_age(self._db, self._layout)
                gauge.add_metric([self.name], 0.0 if age is None else age)
            except Exception as exc:  # the database away: no sample this scrape
                log.warning("harvest %s: backlog age not measured: %s", self.name, " ".join(str(exc).split()))
                self.close()
        yield gauge

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):  # closing a connection the server already dropped
                db.close()
