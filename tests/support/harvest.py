"""Embedded harvesters in tests: a configuration for the test broker, and an event recorder."""

from __future__ import annotations

import threading
import time
from typing import Any

from sluiceway.harvest import Harvest, HarvestConfig
from sluiceway.harvest.events import Event

# goharvest's reaper.yaml from its README, verbatim.
GOHARVEST_YAML = """\
harvest:
  baseKafkaConfig: 
    bootstrap.servers: localhost:9092
  producerKafkaConfig:
    compression.type: lz4
    delivery.timeout.ms: 10000
  leaderTopic: my-app-name
  leaderGroupID: my-app-name
  dataSource: host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable
  outboxTable: outbox
  limits:
    minPollInterval: 1s
    heartbeatTimeout: 5s
    maxInFlightRecords: 1000
    minMetricsInterval: 5s
    sendConcurrency: 4
    sendBuffer: 10
logging:
  level: Debug
"""


def kafka_config(dsn: str, bootstrap: str, name: str, **extra: Any) -> HarvestConfig:
    harvest: dict[str, Any] = {
        "name": name,
        "baseKafkaConfig": {"bootstrap.servers": bootstrap},
        "dataSource": dsn,
        "election": {"kind": "database"},
        "limits": {"heartbeatTimeout": "2s", "minMetricsInterval": "500ms"},
    }
    harvest.update(extra)
    return HarvestConfig.from_dict({"harvest": harvest})


class Recorder:
    """An event handler that keeps every event, and when it arrived (``time.monotonic()``)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)
            self.arrivals.append(time.monotonic())

    def names(self) -> list[str]:
        with self.lock:
            return [type(e).__name__ for e in self.events]

    def of(self, cls: type[Event]) -> list[Any]:
        with self.lock:
            return [e for e in self.events if isinstance(e, cls)]

    def first_arrival(self, cls: type[Event]) -> float:
        """When the harvester emitted its first ``cls`` event (the handler runs on its thread)."""
        with self.lock:
            return next(at for e, at in zip(self.events, self.arrivals, strict=True) if isinstance(e, cls))


def started(harvest: Harvest, recorder: Recorder) -> Harvest:
    harvest.set_event_handler(recorder)
    return harvest.start()
