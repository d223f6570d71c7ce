"""Prometheus metrics of a running pipeline, per sink: batches, records, failures, batch time, lag.

The run owns one :class:`PipelineMetrics`; each sink's ``foreachBatch`` function is wrapped in a
:class:`MeteredBatch` that times the sink's :class:`~sluiceway.pipeline.sinks.handler.BatchHandler`
and counts what its per-batch outcome says. Lag is not counted but measured: at scrape time, by
the same Spark-free reading of checkpoints and source that ``sluice pipeline status`` does, so
a sink that has stopped still shows its lag growing.

Under Spark Connect the batch function runs on the server, out of this process's reach: there
only the lag is reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from sluiceway.pipeline.errors import StepPaused
from sluiceway.pipeline.sinks.handler import BatchHandler, BatchSummary, Stopping
from sluiceway.pipeline.spec import PipelineSpec
from sluiceway.pipeline.state import SinkHealth

log = logging.getLogger("sluiceway.pipeline.metrics")

#: Batch durations from a few milliseconds (an idle trigger) to minutes (a replay with backoff).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class PipelineMetrics:
    """The series of one pipeline run, on a private registry.

    For example::

        metrics = PipelineMetrics(spec)
        Pipeline(spec, spark, metrics=metrics).run()
    """

    def __init__(self, spec: PipelineSpec) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.spec = spec
        self.registry = CollectorRegistry()
        labels = ["pipeline", "sink"]

        def counter(name: str, documentation: str) -> Any:
            return Counter(name, documentation, labels, registry=self.registry)

        self.batches = counter("sluice_pipeline_batches_total", "Micro-batches a sink wrote in full")
        self.records = counter("sluice_pipeline_records_total", "Records a sink wrote")
        self.dead_lettered = counter(
            "sluice_pipeline_dead_lettered_total", "Records a sink sent to its dead-letter sink"
        )
        self.failures = counter(
            "sluice_pipeline_failures_total", "Batches that stopped a sink (it stops at the last good offset)"
        )
        self.duration = Histogram(
            "sluice_pipeline_batch_duration_seconds",
            "Time a sink spent on one micro-batch (retries and replays included)",
            labels,
            registry=self.registry,
            buckets=DURATION_BUCKETS,
        )
        self.registry.register(_LagCollector(spec))
        for sink in spec.sinks:  # every sink's series from the first scrape on, at zero
            for metric in (self.batches, self.records, self.dead_lettered, self.failures, self.duration):
                metric.labels(spec.name, sink.name)

    def metered(self, handler: BatchHandler) -> MeteredBatch:
        """The ``foreachBatch`` function to give Spark instead of ``handler``."""
        return MeteredBatch(handler, self)

    def batch_done(self, sink: str, outcome: BatchSummary, seconds: float) -> None:
        labels = (self.spec.name, sink)
        self.batches.labels(*labels).inc()
        self.records.labels(*labels).inc(outcome.records)
        self.dead_lettered.labels(*labels).inc(outcome.dead_lettered)
        self.duration.labels(*labels).observe(seconds)

    def batch_failed(self, sink: str, seconds: float) -> None:
        labels = (self.spec.name, sink)
        self.failures.labels(*labels).inc()
        self.duration.labels(*labels).observe(seconds)


class MeteredBatch:
    """Runs a sink's batch handler and reports its outcome and duration to the run's metrics."""

    def __init__(self, handler: BatchHandler, metrics: PipelineMetrics) -> None:
        self.handler = handler
        self.metrics = metrics

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        try:
            outcome = self.handler(df, batch_id)
        except (Stopping, StepPaused):
            raise  # a stop or a step's pause: not a failure of the sink
        except Exception:
            self.metrics.batch_failed(self.handler.name, time.monotonic() - started)
            raise
        self.metrics.batch_done(self.handler.name, outcome, time.monotonic() - started)


class _LagCollector:
    """``sluice_pipeline_lag{pipeline,sink}`` and ``sluice_pipeline_sink_stopped{pipeline,sink}``,
    read when scraped (as ``sluice pipeline status``)."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from sluiceway.pipeline.operator import status

        lag = GaugeMetricFamily(
            "sluice_pipeline_lag",
            "Records a sink is behind its source (for postgres-cdc: of the capture's journal)",
            labels=["pipeline", "sink"],
        )
        try:
            sinks = status(self.spec)
        except Exception as exc:  # a scrape must not fail because the source is unreachable
            log.warning("pipeline %s: lag not measured: %s", self.spec.name, exc)
            sinks = []
        stopped = GaugeMetricFamily(
            "sluice_pipeline_sink_stopped",
            "1 while a sink is stopped on a failed batch (sluice pipeline status shows why), else 0",
            labels=["pipeline", "sink"],
        )
        for sink in sinks:
            if sink.lag is not None:
                lag.add_metric([self.spec.name, sink.sink], sink.lag)
            stopped.add_metric([self.spec.name, sink.sink], 1 if sink.state == SinkHealth.FAILED else 0)
        yield lag
        yield stopped
