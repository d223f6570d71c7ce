"""Pipelines on Spark: a source, namespace filters and transforms, sinks — one query per sink.

For example::

    from sluiceway.pipeline import Pipeline, PipelineSpec
    spec = PipelineSpec.from_yaml("orders.yaml")
    Pipeline(spec).run(once=True)

Sources: a journal, Kafka, an outbox table, a NATS JetStream stream, a Redis stream, PostgreSQL
change data capture. Sinks: a journal, Kafka, PostgreSQL, parquet/json/csv files, the console, a
feed, NATS JetStream, RabbitMQ, Redis. The data sources (``sluice-journal``, ``sluice-kafka``,
``sluice-outbox``, ``sluice-nats``, ``sluice-redis``, ``sluice-postgres-cdc``) work on their own
too, after ``register_sources(spark)``. See ``docs/pipeline.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluiceway.lazy import exports as _exports
from sluiceway.logs import adopt as _adopt_log_format

if TYPE_CHECKING:
    from sluiceway.pipeline.errors import PipelineError, SinkFailed, SourceError, SpecError, StepPaused
    from sluiceway.pipeline.failures import RetryPolicy, deliver
    from sluiceway.pipeline.operator import SinkStatus, inspect, read_checkpoint, skip, status
    from sluiceway.pipeline.record import RECORD_DDL, RECORD_SCHEMA, Record
    from sluiceway.pipeline.runner import (
        Pipeline,
        SinkRun,
        build_stream,
        register_query_source,
        register_sources,
    )
    from sluiceway.pipeline.session import build_session
    from sluiceway.pipeline.spec import PipelineSpec, SpecBuilder

# Each public name loads on first use (PEP 562), as in `sluiceway`: a Spark Python worker that
# unpickles a source or a sink imports this package, and needs neither the runner nor the spec
# models to read a journal (about 0.6 s less in every Python process Spark starts for a query).
_LAZY = {
    "PipelineError": "sluiceway.pipeline.errors",
    "SinkFailed": "sluiceway.pipeline.errors",
    "SourceError": "sluiceway.pipeline.errors",
    "SpecError": "sluiceway.pipeline.errors",
    "StepPaused": "sluiceway.pipeline.errors",
    "RetryPolicy": "sluiceway.pipeline.failures",
    "deliver": "sluiceway.pipeline.failures",
    "SinkStatus": "sluiceway.pipeline.operator",
    "inspect": "sluiceway.pipeline.operator",
    "read_checkpoint": "sluiceway.pipeline.operator",
    "skip": "sluiceway.pipeline.operator",
    "status": "sluiceway.pipeline.operator",
    "RECORD_DDL": "sluiceway.pipeline.record",
    "RECORD_SCHEMA": "sluiceway.pipeline.record",
    "Record": "sluiceway.pipeline.record",
    "Pipeline": "sluiceway.pipeline.runner",
    "SinkRun": "sluiceway.pipeline.runner",
    "build_stream": "sluiceway.pipeline.runner",
    "register_query_source": "sluiceway.pipeline.runner",
    "register_sources": "sluiceway.pipeline.runner",
    "build_session": "sluiceway.pipeline.session",
    "PipelineSpec": "sluiceway.pipeline.spec",
    "SpecBuilder": "sluiceway.pipeline.spec",
}


__getattr__ = _exports(__name__, _LAZY)

# In a Spark Python worker (a source's reader, a sink's task) warnings take the CLI's format.
_adopt_log_format()

__all__ = [
    "RECORD_DDL",
    "RECORD_SCHEMA",
    "Pipeline",
    "PipelineError",
    "PipelineSpec",
    "Record",
    "RetryPolicy",
    "SinkFailed",
    "SinkRun",
    "SinkStatus",
    "SourceError",
    "SpecBuilder",
    "SpecError",
    "StepPaused",
    "build_session",
    "build_stream",
    "deliver",
    "inspect",
    "read_checkpoint",
    "register_query_source",
    "register_sources",
    "skip",
    "status",
]
