"""Pipelines on Spark: a source, namespace filters and transforms, sinks — one query per sink.

>>> from sluiceway.pipeline import Pipeline, PipelineSpec                  # doctest: +SKIP
>>> spec = PipelineSpec.from_yaml("orders.yaml")
>>> Pipeline(spec).run(once=True)

Sources: a journal, Kafka, an outbox table, a NATS JetStream stream, a Redis stream, PostgreSQL
change data capture. Sinks: a journal, Kafka, PostgreSQL, parquet/json/csv files, the console, a
feed, NATS JetStream, RabbitMQ, Redis. The data sources (``sluice-journal``, ``sluice-kafka``,
``sluice-outbox``, ``sluice-nats``, ``sluice-redis``, ``sluice-postgres-cdc``) work on their own
too, after ``register_sources(spark)``. See ``docs/pipeline.md``.
"""

from sluiceway.logs import adopt as _adopt_log_format
from sluiceway.pipeline.errors import PipelineError, SinkFailed, SourceError, SpecError, StepPaused
from sluiceway.pipeline.failures import RetryPolicy, deliver
from sluiceway.pipeline.operator import SinkStatus, inspect, read_checkpoint, skip, status
from sluiceway.pipeline.record import RECORD_DDL, RECORD_SCHEMA, Record
from sluiceway.pipeline.runner import Pipeline, SinkRun, build_stream, register_query_source, register_sources
from sluiceway.pipeline.session import build_session
from sluiceway.pipeline.spec import PipelineSpec, SpecBuilder

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
