"""What a capture measures: changes and bytes published, the position confirmed to PostgreSQL,
how far behind the server's WAL it is, and commit → acknowledgement latency.

:class:`CaptureMeter` keeps the figures (a log line reads them); :meth:`CaptureMeter.serve` adds
the ``sluice_capture_*`` Prometheus series on a private registry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.metrics import MetricsEndpoint, serve_metrics
from sluiceway.outbox.record import RecordColumns

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Changes of an append whose commit → hand-over time is observed: cheap, and representative.
_SAMPLES = 64


def commit_sample(batch: pa.RecordBatch) -> list[int]:
    """The commit times (microseconds) of up to :data:`_SAMPLES` changes of ``batch``, evenly spread."""
    stamps = pc.drop_null(batch.column("timestamp")) if batch.num_rows else None
    if stamps is None or not len(stamps):
        return []
    commits = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False)
    return [int(m) for m in commits[:: max(1, len(commits) // _SAMPLES)]]


def value_bytes(records: RecordColumns) -> int:
    """The bytes of the records' values (what ``sluice_capture_bytes_total`` counts)."""
    return sum(map(len, filter(None, records.values)))


class PublishMeter(Protocol):
    """What a :class:`~sluiceway.capture.target.PublishTarget` counts (a :class:`CaptureMeter`,
    or a relay of one in another process)."""

    def published(self, records: RecordColumns, batch: pa.RecordBatch) -> None: ...

    def skipped(self, count: int) -> None: ...

    def dead_lettered(self) -> None: ...


class CaptureMeter:
    def __init__(self, name: str, destination: str) -> None:
        self.name = name
        self.destination = destination
        self.changes = 0
        self.bytes = 0
        self.confirmed = 0
        self.lag_bytes = 0
        self.leading = False
        #: Changes passed over as told (``sluice capture skip``), and sent to the dead letter destination.
        self.skips = 0
        self.dead_letters = 0
        self._lock = threading.Lock()
        self._prom: dict[str, Any] | None = None
        self._endpoint: MetricsEndpoint | None = None

    def serve(self, addr: str) -> tuple[str, int]:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        registry = CollectorRegistry()
        label = ["capture"]
        self._prom = {
            "changes": Counter("sluice_capture_changes_total", "Changes published and acknowledged",
                               label, registry=registry),
            "bytes": Counter("sluice_capture_bytes_total", "Bytes of message values published",
                             label, registry=registry),
            "confirmed": Gauge("sluice_capture_confirmed_lsn", "Position confirmed to PostgreSQL (LSN)",
                               label, registry=registry),
            "lag": Gauge("sluice_capture_lag_bytes", "WAL written past the confirmed position",
                         label, registry=registry),
            "leader": Gauge("sluice_capture_leader", "1 while capturing", label, registry=registry),
            "skipped": Counter("sluice_capture_skipped_total",
                               "Refused changes passed over as told (sluice capture skip)",
                               label, registry=registry),
            "dead_letters": Counter("sluice_capture_dead_letters_total",
                                    "Refused changes sent to the dead letter destination",
                                    label, registry=registry),
            "latency": Histogram("sluice_capture_publish_latency_seconds",
                                 "Commit to broker acknowledgement, per change", label,
                                 registry=registry, buckets=_BUCKETS),
        }  # fmt: skip
        Gauge(
            "sluice_capture_destination", "1 for the kind of destination", ["capture", "destination"],
            registry=registry,
        ).labels(self.name, self.destination).set(1)  # fmt: skip
        # Every series exists from the start (counters at zero, not leading yet): a dashboard of
        # a fresh process shows 0 rather than "no data".
        for key in ("changes", "bytes", "skipped", "dead_letters", "latency"):
            self._prom[key].labels(self.name)
        self._prom["leader"].labels(self.name).set(1 if self.leading else 0)
        self._endpoint = serve_metrics(registry, addr)
        return self._endpoint.host, self._endpoint.port

    def published(self, records: RecordColumns, batch: pa.RecordBatch) -> None:
        samples = commit_sample(batch) if self._prom is not None else ()
        self.count_published(len(records), value_bytes(records), samples)

    def count_published(self, count: int, size: int, commits: Sequence[int]) -> None:
        """``count`` changes of ``size`` bytes handed over; ``commits``: a sample of their commit
        times (microseconds since the epoch) for the latency histogram."""
        with self._lock:
            self.changes += count
            self.bytes += size
        prom = self._prom
        if prom is not None:
            prom["changes"].labels(self.name).inc(count)
            prom["bytes"].labels(self.name).inc(size)
            now = time.time()
            histogram = prom["latency"].labels(self.name)
            for micros in commits:
                histogram.observe(max(0.0, now - micros / 1e6))

    def skipped(self, count: int) -> None:
        with self._lock:
            self.skips += count
        if self._prom is not None:
            self._prom["skipped"].labels(self.name).inc(count)

    def dead_lettered(self) -> None:
        with self._lock:
            self.dead_letters += 1
        if self._prom is not None:
            self._prom["dead_letters"].labels(self.name).inc()

    def position(self, confirmed: int, wal_end: int) -> None:
        self.confirmed = confirmed
        self.lag_bytes = max(0, wal_end - confirmed)
        if self._prom is not None:
            self._prom["confirmed"].labels(self.name).set(confirmed)
            self._prom["lag"].labels(self.name).set(self.lag_bytes)

    def leader(self, leading: bool) -> None:
        self.leading = leading
        if self._prom is not None:
            self._prom["leader"].labels(self.name).set(1 if leading else 0)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
