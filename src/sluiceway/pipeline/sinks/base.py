"""The sink port: every writer takes an Arrow table of records (in order) and a token.

``token`` identifies exactly this slice of exactly this batch of this checkpoint's life; a
writer that can store it atomically with the data (journal register, Postgres progress row,
file name) uses it to make a replayed write a no-op. Writers are created where a part of the batch is
written (a Spark task on an executor; the driver for ``step``) and never pickled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from sluiceway.pipeline.spec import (
        ConsoleSinkSpec,
        FeedSinkSpec,
        FilesSinkSpec,
        JournalSinkSpec,
        KafkaSinkSpec,
        NatsSinkSpec,
        PostgresSinkSpec,
        RabbitMqSinkSpec,
        RedisSinkSpec,
        SinkSpec,
    )


class SinkWriter(Protocol):
    def write(self, table: pa.Table, token: str) -> None: ...

    def close(self) -> None: ...


def make_writer(spec: SinkSpec, *, sink_name: str, staged: bool = False) -> SinkWriter:
    """The writer for a sink spec (``sink_name`` names the register/progress row it keeps), built
    by the spec's kind's entry in :data:`WRITERS`.

    ``staged``: file sinks write into ``<path>/.staging`` and list what they wrote in ``staged``,
    for the driver to put in place (see :mod:`~sluiceway.pipeline.sinks.distributed`)."""
    build = WRITERS[spec.type]
    return build(spec, sink_name, staged)


# One builder per kind. Each imports its writer lazily: a sink's client library is only needed
# when the sink is used.
def _journal(spec: JournalSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.journal import JournalSink

    return JournalSink(spec.path, sink_name)


def _kafka(spec: KafkaSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.kafka import KafkaSink

    return KafkaSink(spec.topic, dict(spec.config))


def _postgres(spec: PostgresSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.postgres import PostgresSink

    return PostgresSink(spec.dsn, spec.table, spec.key, sink_name, create=spec.create)


def _files(spec: FilesSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.files import FileSink

    return FileSink(spec.path, spec.type, staged=staged)


def _console(spec: ConsoleSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.console import ConsoleSink

    return ConsoleSink(sink_name, spec.limit)


def _feed(spec: FeedSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.feed import FeedSink

    return FeedSink(spec.dsn, spec.partition, gate=spec.gate, prefix=spec.prefix, if_exists=spec.if_exists)


def _broker(
    spec: NatsSinkSpec | RabbitMqSinkSpec | RedisSinkSpec, sink_name: str, staged: bool
) -> SinkWriter:
    from sluiceway.pipeline.sinks.brokers import BrokerSink

    return BrokerSink(spec, spec.topic)


#: The writer builder of each sink kind (the spec's ``type``).
WRITERS: dict[str, Callable[[Any, str, bool], SinkWriter]] = {
    "journal": _journal,
    "kafka": _kafka,
    "postgres": _postgres,
    "parquet": _files,
    "json": _files,
    "csv": _files,
    "console": _console,
    "feed": _feed,
    "nats": _broker,
    "rabbitmq": _broker,
    "redis": _broker,
}
