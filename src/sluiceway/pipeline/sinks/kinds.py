"""The kinds of sink, in one table: what a spec's ``type`` means everywhere a sink is handled.

One :class:`SinkKind` per kind names its spec class, how its writer is built, what is checked at
start (:func:`check_sinks`, before Spark runs a batch) and how a batch reaches it
(:class:`Path`). The batch step (:mod:`~sluiceway.pipeline.sinks.handler`), the tasks
(:mod:`~sluiceway.pipeline.sinks.distributed`) and the start-up checks ask this table and never
name a kind themselves: adding a sink is a spec class, a writer and one row of :data:`SINK_KINDS`.

Writers are imported where they are built, lazily: a sink's client library is only needed when
the sink is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.preflight import reach_broker, reach_database, reach_kafka, reach_redis, writable_dir
from sluiceway.pipeline.spec import (
    ConsoleSinkSpec,
    DeltaSinkSpec,
    FeedSinkSpec,
    FilesSinkSpec,
    IcebergSinkSpec,
    JournalSinkSpec,
    KafkaSinkSpec,
    NatsSinkSpec,
    PostgresSinkSpec,
    RabbitMqSinkSpec,
    RedisSinkSpec,
)

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.base import SinkWriter
    from sluiceway.pipeline.spec import PipelineSpec, SinkSpec


class Path(Enum):
    """How a batch reaches a kind of sink (see :mod:`~sluiceway.pipeline.sinks.distributed`)."""

    #: Split by key, sorted by offset, each part written by a task (journal, Kafka, Postgres, …).
    ORDERED = "ordered"
    #: The source's own parts, each task's files staged and put in place by the driver in order.
    FILES = "files"
    #: One table commit per batch (:mod:`~sluiceway.pipeline.sinks.tables`).
    TABLE = "table"
    #: The batch's first rows shown on the driver.
    SHOW = "show"


@dataclass(frozen=True, slots=True)
class SinkKind:
    #: The spec class whose ``type`` names this kind.
    spec: type
    #: ``(spec, sink_name, staged) -> writer``: ``sink_name`` names the register or progress row
    #: the writer keeps; ``staged``, for file sinks, writes into ``<path>/.staging``.
    writer: Callable[[Any, str, bool], SinkWriter]
    #: Raises :class:`DestinationUnreachable` when the sink cannot be reached; ``None``: nothing
    #: to reach.
    check: Callable[[Any], None] | None
    path: Path
    #: Written as one part unless ``parallelism`` says otherwise (the journal: its appends queue on
    #: its one writer anyway, and one part keeps the source's order exactly, not only per key).
    one_part: bool = False
    #: With no dead-letter sink and no ``step``, written by Spark's own writer: a file of this
    #: format has no record a writer could refuse (``parquet``).
    spark_writer: bool = False


# -- writers ------------------------------------------------------------------------------------
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


def _table(spec: DeltaSinkSpec | IcebergSinkSpec, sink_name: str, staged: bool) -> SinkWriter:
    from sluiceway.pipeline.sinks.lakehouse.sink import LakeWriter

    return LakeWriter(spec, sink_name)


# -- start-up checks ----------------------------------------------------------------------------
def _directory(spec: JournalSinkSpec | FilesSinkSpec) -> None:
    writable_dir(spec.path)


def _database(spec: PostgresSinkSpec | FeedSinkSpec) -> None:
    reach_database(spec.dsn)


def _kafka_cluster(spec: KafkaSinkSpec) -> None:
    reach_kafka(dict(spec.config))


def _table_store(spec: DeltaSinkSpec | IcebergSinkSpec) -> None:
    from sluiceway.pipeline.sinks.lakehouse.sink import check_table

    check_table(spec)


#: Every kind of sink, by the spec's ``type``.
SINK_KINDS: dict[str, SinkKind] = {
    "journal": SinkKind(JournalSinkSpec, _journal, _directory, Path.ORDERED, one_part=True),
    "kafka": SinkKind(KafkaSinkSpec, _kafka, _kafka_cluster, Path.ORDERED),
    "postgres": SinkKind(PostgresSinkSpec, _postgres, _database, Path.ORDERED),
    "feed": SinkKind(FeedSinkSpec, _feed, _database, Path.ORDERED),
    "nats": SinkKind(NatsSinkSpec, _broker, reach_broker, Path.ORDERED),
    "rabbitmq": SinkKind(RabbitMqSinkSpec, _broker, reach_broker, Path.ORDERED),
    "redis": SinkKind(RedisSinkSpec, _broker, reach_redis, Path.ORDERED),
    "parquet": SinkKind(FilesSinkSpec, _files, _directory, Path.FILES, spark_writer=True),
    "json": SinkKind(FilesSinkSpec, _files, _directory, Path.FILES),
    "csv": SinkKind(FilesSinkSpec, _files, _directory, Path.FILES),
    "delta": SinkKind(DeltaSinkSpec, _table, _table_store, Path.TABLE),
    "iceberg": SinkKind(IcebergSinkSpec, _table, _table_store, Path.TABLE),
    "console": SinkKind(ConsoleSinkSpec, _console, None, Path.SHOW),
}


def kind_of(spec: SinkSpec) -> SinkKind:
    return SINK_KINDS[spec.type]


def make_writer(spec: SinkSpec, *, sink_name: str, staged: bool = False) -> SinkWriter:
    """The writer for a sink spec, built by its kind (see :attr:`SinkKind.writer`)."""
    return kind_of(spec).writer(spec, sink_name, staged)


def check_sinks(spec: PipelineSpec) -> None:
    """Raise :class:`DestinationUnreachable` naming the first sink (or its dead-letter sink) that
    cannot be reached."""
    for sink in spec.sinks:
        for name, target in ((sink.name, sink), (f"{sink.name}.dead_letter", sink.dead_letter)):
            check = kind_of(target).check if target is not None else None
            if check is None:
                continue
            try:
                check(target)
            except DestinationUnreachable as exc:
                raise DestinationUnreachable(exc.problem, sink=name, permanent=exc.permanent) from None
