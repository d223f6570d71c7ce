"""The sink port: every writer takes an Arrow table of records (in order) and a token.

``token`` identifies exactly this slice of exactly this batch of this checkpoint's life; a
writer that can store it atomically with the data (journal register, Postgres progress row,
file name) uses it to make a replayed write a no-op. Writers are created where a part of the batch is
written (a Spark task on an executor; the driver for ``step``) and never pickled.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa


class SinkWriter(Protocol):
    def write(self, table: pa.Table, token: str) -> None: ...

    def close(self) -> None: ...


def make_writer(spec: Any, *, sink_name: str, staged: bool = False) -> SinkWriter:
    """The writer for a sink spec (``sink_name`` names the register/progress row it keeps).

    ``staged``: file sinks write into ``<path>/.staging`` and list what they wrote in ``staged``,
    for the driver to put in place (see :mod:`~sluiceway.pipeline.sinks.distributed`)."""
    kind = spec.type
    if kind == "journal":
        from sluiceway.pipeline.sinks.journal import JournalSink

        return JournalSink(spec.path, sink_name)
    if kind == "kafka":
        from sluiceway.pipeline.sinks.kafka import KafkaSink

        return KafkaSink(spec.topic, dict(spec.config))
    if kind == "postgres":
        from sluiceway.pipeline.sinks.postgres import PostgresSink

        return PostgresSink(spec.dsn, spec.table, spec.key, sink_name, create=spec.create)
    if kind in ("parquet", "json", "csv"):
        from sluiceway.pipeline.sinks.files import FileSink

        return FileSink(spec.path, kind, staged=staged)
    if kind == "console":
        from sluiceway.pipeline.sinks.console import ConsoleSink

        return ConsoleSink(sink_name, spec.limit)
    if kind == "feed":
        from sluiceway.pipeline.sinks.feed import FeedSink

        return FeedSink(
            spec.dsn, spec.partition, gate=spec.gate, prefix=spec.prefix, if_exists=spec.if_exists
        )
    if kind in ("nats", "rabbitmq", "redis"):
        from sluiceway.pipeline.sinks.brokers import BrokerSink

        return BrokerSink(spec, spec.topic)
    raise ValueError(f"unknown sink type {kind!r}")
