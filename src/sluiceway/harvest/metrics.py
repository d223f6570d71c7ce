"""Prometheus metrics for the harvester (off by default; loopback when on)."""

from __future__ import annotations

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


class HarvestMetrics:
    """Turns harvester events into Prometheus series on a private registry."""

    def __init__(self, name: str, *, destination: str = "kafka") -> None:
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
