"""One adapter per kind of source, looked up in :data:`ADAPTERS` by the spec's ``source.type``.

Why it is shaped so: the runner, the operator tools, the CLI and the overview each need a few
things of the source — which Spark data source reads it and with which options, how far a sink
is behind, the records at some offsets, a check before the run, its end (for ``skip``), what
to do when a run ends, the capture of a CDC pipeline. Each of those used to be an
``if source.type == …`` chain in its caller; here every kind answers all of them in one class,
and a new kind is one class and one line in the table.

The driver and broker modules (``sources/*``, which import PySpark; confluent-kafka; nats-py;
the CDC capture) are imported inside the methods that need them, so importing the pipeline,
the operator tools or ``sluice status`` stays light. Nothing here imports the runner or the
operator: both import this.

>>> adapter(spec).lag(spec, {"offset": 10})                                # doctest: +SKIP
(10, 32)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa

from sluiceway.errors import BrokerError, ConfigError, DatabaseError
from sluiceway.pipeline.checkpoint import read_checkpoint
from sluiceway.pipeline.errors import DestinationUnreachable, SourceError
from sluiceway.pipeline.preflight import CONNECT_TIMEOUT, error_text, reach_kafka, reach_redis
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.spec import (
    JournalSourceSpec,
    KafkaSourceSpec,
    MysqlCdcSourceSpec,
    NatsSourceSpec,
    OutboxSourceSpec,
    PipelineSpec,
    PostgresCdcSourceSpec,
    RedisSourceSpec,
)

if TYPE_CHECKING:
    from sluiceway.cdc.progress import CdcStatus
    from sluiceway.cdc.service import CaptureService

S = TypeVar("S")


@dataclass(frozen=True)
class ReplicationSlot:
    """A source's replication slot: what ``sluice pipeline drop-slot`` drops."""

    dsn: str
    name: str


class SourceAdapter(ABC, Generic[S]):
    """What the pipeline's driver side asks of one kind of source (``S``: its spec class)."""

    #: The spec's ``source.type``.
    kind: str
    spec_type: type[S]
    #: What :meth:`lag` counts (the overview compares it with the matching threshold).

    def source(self, spec: PipelineSpec) -> S:
        """The pipeline's source spec, as this kind's spec class."""
        src = spec.source
        if not isinstance(src, self.spec_type):
            raise TypeError(f"the {self.kind} source adapter was given a {src.type} source")
        return src

    # -- reading on Spark ------------------------------------------------------------------------
    def spark_format(
        self, spec: PipelineSpec, sink: str, *, max_records: int | None = None
    ) -> tuple[str, dict[str, str]]:
        """The Spark data source name and options that read the source for one sink: the kind's
        own options between the batch bound and the spec's ``options`` (which win)."""
        src = spec.source
        opts: dict[str, str] = {}
        limit = max_records or src.max_records_per_batch
        if limit:
            opts["maxRecordsPerBatch"] = str(limit)
        fmt, own = self.read_options(spec, sink)
        opts.update(own)
        opts.update(src.options)
        return fmt, opts

    @abstractmethod
    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]: ...

    def dedup(self, spec: PipelineSpec) -> bool:
        """Whether the stream drops records the harvester re-sent (:mod:`~sluiceway.pipeline.dedup`)."""
        return False

    # -- operator tools (no Spark) ---------------------------------------------------------------
    @abstractmethod
    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        """A sink's position (from its checkpoint's committed offset) and how far it is behind."""

    @abstractmethod
    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        """The records with ``start <= offset < end`` (at most ``limit``; ``start < end``)."""

    def end_offset(self, spec: PipelineSpec) -> int | None:
        """The source's next offset, when it can tell it cheaply (``skip`` refuses offsets past it)."""
        return None

    @abstractmethod
    def where(self, spec: PipelineSpec) -> str:
        """Where the records are, in a message (a path, topics, a stream)."""

    def status(self, spec: PipelineSpec) -> CdcStatus | None:
        """What the source reports beyond the sinks (CDC: tables and slot); ``None`` for most."""
        return None

    def slot(self, spec: PipelineSpec) -> ReplicationSlot | None:
        """The replication slot the source holds, if it holds one."""
        return None

    # -- a run's edges ---------------------------------------------------------------------------
    def check(self, spec: PipelineSpec) -> None:
        """Raise :class:`SourceError` (one line, naming the spec key) when the source cannot be
        read. Connects with a short timeout and closes again; writes nothing."""

    def capture(self, spec: PipelineSpec) -> CaptureService | None:
        """The capture that feeds the source while the pipeline runs (not yet prepared), if any."""
        return None

    def commit(self, spec: PipelineSpec, sink: str) -> None:
        """Tell the source that the sink's last committed batch is done, when a run ends.

        Spark commits a batch to its source only when it plans the next one, so a run that ends
        (``--once``, a stop) would leave the last batch as the source saw it until the next run.
        The checkpoint's commit log says the batch is done; committing it now is what Spark
        would do. Most sources keep nothing per batch."""


# --- journal ---------------------------------------------------------------------------------------
def _journal_lag(path: str, committed: dict[str, Any] | None) -> tuple[int, int]:
    from sluiceway.pipeline.sources.journal import journal_head

    pos = int(committed["offset"]) if committed else 0
    return pos, max(0, journal_head(path) - pos)


def _journal_records(path: str, start: int, end: int) -> pa.Table:
    from sluiceway.journal import Journal, JournalNotFoundError
    from sluiceway.pipeline.record import with_delete_ops, with_header_ops

    try:
        with Journal.open(path, read_only=True) as journal:
            batches = [with_header_ops(with_delete_ops(b)) for b in journal.read_arrow(start, end)]
    except JournalNotFoundError as exc:
        raise SourceError(f"no journal at {path}") from exc
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


class JournalAdapter(SourceAdapter[JournalSourceSpec]):
    kind = "journal"
    spec_type = JournalSourceSpec

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src = self.source(spec)
        return "sluice-journal", {
            "path": src.path,
            "startingOffset": str(src.starting_offset),
            "consumer": f"{spec.name}.{sink}",
        }

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        return _journal_lag(self.source(spec).path, committed)

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        return _journal_records(self.source(spec).path, start, min(end, start + limit))

    def end_offset(self, spec: PipelineSpec) -> int | None:
        from sluiceway.pipeline.sources.journal import journal_head

        return journal_head(self.source(spec).path)

    def where(self, spec: PipelineSpec) -> str:
        return str(self.source(spec).path)

    def check(self, spec: PipelineSpec) -> None:
        from sluiceway.journal import Journal, JournalNotFoundError

        path = self.source(spec).path
        try:
            Journal.head_offset(path)
        except JournalNotFoundError:
            raise SourceError(f"pipeline.source.path: no journal at {path}") from None


# --- kafka -----------------------------------------------------------------------------------------
def _kafka_conf(src: KafkaSourceSpec) -> dict[str, Any]:
    from sluiceway.pipeline.sources.kafka import kafka_config

    return kafka_config({f"kafka.{k}": v for k, v in src.config.items()})


class KafkaAdapter(SourceAdapter[KafkaSourceSpec]):
    kind = "kafka"
    spec_type = KafkaSourceSpec

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src = self.source(spec)
        opts = {"topic": ",".join(src.topics), "startingOffsets": src.starting_offsets}
        opts.update({f"kafka.{k}": v for k, v in src.config.items()})
        return "sluice-kafka", opts

    def dedup(self, spec: PipelineSpec) -> bool:
        return self.source(spec).dedup

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        from sluiceway.pipeline.sources.kafka import KafkaAdmin

        src = self.source(spec)
        admin = KafkaAdmin(_kafka_conf(src), src.topics)
        try:
            high = admin.watermarks(low=False)
        finally:
            admin.close()
        parts = {k: int(v) for k, v in (committed or {}).items()}
        return parts, sum(max(0, h - parts.get(k, 0)) for k, h in high.items())

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        """Offsets are per partition: the range is read in every partition."""
        from sluiceway.pipeline.sources.kafka import KafkaAdmin, KafkaPartition, read_partition, split_key

        src = self.source(spec)
        conf = _kafka_conf(src)
        admin = KafkaAdmin(conf, src.topics)
        try:
            low, high = admin.watermarks(low=True), admin.watermarks(low=False)
        finally:
            admin.close()
        batches: list[pa.RecordBatch] = []
        for key in sorted(high):
            lo, hi = max(start, low[key]), min(end, high[key], start + limit)
            if hi > lo:
                topic, partition = split_key(key)
                batches.extend(read_partition(conf, KafkaPartition(topic, partition, lo, hi), 10.0))
        return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)

    def end_offset(self, spec: PipelineSpec) -> int | None:
        from sluiceway.pipeline.sources.kafka import KafkaAdmin

        src = self.source(spec)
        admin = KafkaAdmin(_kafka_conf(src), src.topics)
        try:
            return max(admin.watermarks(low=False).values(), default=0)  # offsets are per partition
        finally:
            admin.close()

    def where(self, spec: PipelineSpec) -> str:
        return ",".join(self.source(spec).topics)

    def check(self, spec: PipelineSpec) -> None:
        from sluiceway.pipeline.sources.kafka import KafkaAdmin

        src = self.source(spec)
        servers = src.config.get("bootstrap.servers", "")
        try:
            reach_kafka(src.config)
            admin = KafkaAdmin({**src.config, "log_level": "0"}, src.topics, timeout=CONNECT_TIMEOUT)
            try:
                admin.partitions()
            finally:
                admin.close()
        except DestinationUnreachable as exc:
            raise SourceError(f"pipeline.source: {exc.problem}") from None
        except Exception as exc:
            raise SourceError(f"pipeline.source: kafka {servers}: {error_text(exc)}") from None


# --- outbox ----------------------------------------------------------------------------------------
class OutboxAdapter(SourceAdapter[OutboxSourceSpec]):
    kind = "outbox"
    spec_type = OutboxSourceSpec

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src = self.source(spec)
        return "sluice-outbox", {
            "dsn": src.dsn,
            "table": src.table,
            "numPartitions": str(src.partitions),
            "leaseTtl": str(src.lease_ttl),
        }

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        """Position: the committed batch; lag: the rows still in the table."""
        from sluiceway.pipeline.sources.outbox import OutboxState

        src = self.source(spec)
        state = OutboxState(src.dsn, src.table)
        try:
            rows, _claimed = state.backlog()
        finally:
            state.close()
        return (int(committed["batch"]) if committed else 0), rows

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        from sluiceway.pipeline.sources.outbox import OutboxState

        src = self.source(spec)
        state = OutboxState(src.dsn, src.table)
        try:
            return state.peek(start, end, limit)
        finally:
            state.close()

    def where(self, spec: PipelineSpec) -> str:
        return self.source(spec).table

    def check(self, spec: PipelineSpec) -> None:
        from sluiceway.db import Database
        from sluiceway.outbox.table import locate_outbox

        src = self.source(spec)
        try:
            with Database(src.dsn, connect_timeout=CONNECT_TIMEOUT) as db:
                locate_outbox(db, src.table)
        except (DatabaseError, ConfigError) as exc:
            raise SourceError(f"pipeline.source: {error_text(exc)}") from None

    def commit(self, spec: PipelineSpec, sink: str) -> None:
        """Purge the rows of the sink's last committed batch (and every one before it)."""
        from sluiceway.pipeline.sources.outbox import OutboxState

        src = self.source(spec)
        cp = read_checkpoint(spec.checkpoint_dir(sink))
        if cp.committed is None or "batch" not in cp.committed:
            return
        state = OutboxState(src.dsn, src.table)
        try:
            state.commit(int(cp.committed["batch"]))
        finally:
            state.close()


# --- postgres-cdc ----------------------------------------------------------------------------------
def cdc_root(spec: PipelineSpec) -> Path:
    """Where a CDC pipeline's capture keeps its journal and the copy's state (beside the checkpoints)."""
    return Path(spec.checkpoint) / "_cdc"


def cdc_log_dir(spec: PipelineSpec) -> Path:
    """The capture's journal, which every sink of a CDC pipeline reads."""
    from sluiceway.cdc.service import log_path

    return log_path(cdc_root(spec))


class _CaptureAdapter(SourceAdapter[S]):
    """A CDC source: its capture streams the database's changes into a journal
    (:mod:`sluiceway.cdc.service`); each sink reads it at its own offset, as from any journal,
    its ops carried in a header."""

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src: Any = self.source(spec)
        return "sluice-journal", {
            "path": str(cdc_log_dir(spec)),
            "startingOffset": "0",
            "consumer": cdc_consumer(spec, sink),
            # Fail, never skip, if records this sink has not read were released.
            "strict": "true",
            "headerOps": "true",
            "minPartitions": str(src.partitions),
        }

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        """Offsets in the capture's journal (the WAL the capture itself is behind is the source's
        own figure, in :meth:`status`)."""
        return _journal_lag(str(cdc_log_dir(spec)), committed)

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        return _journal_records(str(cdc_log_dir(spec)), start, min(end, start + limit))

    def where(self, spec: PipelineSpec) -> str:
        return str(cdc_log_dir(spec))

    def status(self, spec: PipelineSpec) -> CdcStatus | None:
        """Each table's phase (copy with its progress, or sync) and the slot (confirmed position,
        WAL retained)."""
        from sluiceway.cdc.service import describe

        return describe(self.capture(spec))

    def capture(self, spec: PipelineSpec) -> CaptureService:
        """The capture (database → journal), not yet prepared."""
        from sluiceway.cdc.service import CaptureService, state_path

        readers = tuple(cdc_consumer(spec, sink.name) for sink in spec.sinks)
        options = self.options(spec, str(state_path(cdc_root(spec))))
        return CaptureService(options, cdc_log_dir(spec), consumers=readers)

    @abstractmethod
    def options(self, spec: PipelineSpec, state_dir: str) -> Any:
        """The capture's options."""

    @abstractmethod
    def session(self, dsn: str) -> Any:
        """A session of the source's database (``check_server``, ``resolve_tables``, ``close``)."""

    def check(self, spec: PipelineSpec) -> None:
        """The server's settings (``wal_level``; the binlog's format), our role's rights and the
        tables — read-only, before Spark starts, so each is one line without a JVM. The
        capture's ``prepare()`` then creates what it needs (Pipeline.preflight)."""
        src: Any = self.source(spec)
        session = self.session(src.dsn)
        try:
            session.check_server()
            session.resolve_tables(src.tables if isinstance(src.tables, str) else tuple(src.tables))
        except DatabaseError as exc:
            raise SourceError(f"pipeline.source: {error_text(exc)}") from None
        finally:
            session.close()


class PostgresCdcAdapter(_CaptureAdapter[PostgresCdcSourceSpec]):
    kind = "postgres-cdc"
    spec_type = PostgresCdcSourceSpec

    def slot(self, spec: PipelineSpec) -> ReplicationSlot | None:
        src = self.source(spec)
        return ReplicationSlot(src.dsn, src.slot)

    def session(self, dsn: str) -> Any:
        from sluiceway.cdc.postgres import CdcSession

        return CdcSession(dsn)

    def options(self, spec: PipelineSpec, state_dir: str) -> Any:
        from sluiceway.cdc.capture import CaptureOptions

        src = self.source(spec)
        return CaptureOptions(
            dsn=src.dsn,
            tables=src.tables if isinstance(src.tables, str) else tuple(src.tables),
            slot=src.slot,
            publication=src.publication,
            state_dir=state_dir,
            snapshot=src.snapshot,
            chunk_size=src.chunk_size,
        )


class MysqlCdcAdapter(_CaptureAdapter[MysqlCdcSourceSpec]):
    kind = "mysql-cdc"
    spec_type = MysqlCdcSourceSpec

    def session(self, dsn: str) -> Any:
        from sluiceway.cdc.mysql.server import BinlogSession

        return BinlogSession(dsn)

    def options(self, spec: PipelineSpec, state_dir: str) -> Any:
        from sluiceway.cdc.mysql.capture import BinlogOptions

        src = self.source(spec)
        return BinlogOptions(
            dsn=src.dsn,
            tables=src.tables if isinstance(src.tables, str) else tuple(src.tables),
            server_id=src.server_id,
            state_dir=state_dir,
            snapshot=src.snapshot,
            chunk_size=src.chunk_size,
        )


def cdc_consumer(spec: PipelineSpec, sink: str) -> str:
    """The name under which a sink commits its offsets in the capture's journal."""
    return f"{spec.name}.{sink}"


# --- nats ------------------------------------------------------------------------------------------
class NatsAdapter(SourceAdapter[NatsSourceSpec]):
    kind = "nats"
    spec_type = NatsSourceSpec

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src = self.source(spec)
        opts = {
            "servers": ",".join(src.servers),
            "stream": src.stream,
            "startingOffset": str(src.starting_offset),
        }
        if src.subject:
            opts["subject"] = src.subject
        return "sluice-nats", opts

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        from sluiceway.pipeline.sources.nats import stream_bounds

        src = self.source(spec)
        first, head = stream_bounds(list(src.servers), src.stream)
        pos = int(committed["seq"]) if committed else first
        return pos, max(0, head - pos)

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        from sluiceway.pipeline.sources.nats import NatsPartition, read_range

        src = self.source(spec)
        part = NatsPartition(tuple(src.servers), src.stream, src.subject, start, min(end, start + limit))
        return pa.Table.from_batches(list(read_range(part)), schema=RECORD_SCHEMA)

    def end_offset(self, spec: PipelineSpec) -> int | None:
        from sluiceway.pipeline.sources.nats import stream_bounds

        src = self.source(spec)
        return stream_bounds(list(src.servers), src.stream)[1]

    def where(self, spec: PipelineSpec) -> str:
        return self.source(spec).stream

    def check(self, spec: PipelineSpec) -> None:
        from sluiceway.pipeline.sources.nats import stream_bounds

        src = self.source(spec)
        try:
            stream_bounds(list(src.servers), src.stream)
        except BrokerError as exc:
            raise SourceError(f"pipeline.source: {error_text(exc)}") from None


# --- redis -----------------------------------------------------------------------------------------
class RedisAdapter(SourceAdapter[RedisSourceSpec]):
    kind = "redis"
    spec_type = RedisSourceSpec

    def read_options(self, spec: PipelineSpec, sink: str) -> tuple[str, dict[str, str]]:
        src = self.source(spec)
        return "sluice-redis", {"url": src.url, "stream": src.stream, "startingOffset": src.starting_offset}

    def lag(self, spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
        """Position: the last entry id read; Redis cannot count entries after an id cheaply."""
        return (committed or {}).get("after"), None

    def inspect(self, spec: PipelineSpec, start: int, end: int, limit: int) -> pa.Table:
        from sluiceway.brokers.redis import offset_entry
        from sluiceway.pipeline.sources.redis import RedisPartition, read_range

        src = self.source(spec)
        entries = RedisPartition(src.url, src.stream, offset_entry(max(0, start - 1)), offset_entry(end - 1))
        return pa.Table.from_batches(list(read_range(entries)), schema=RECORD_SCHEMA).slice(0, limit)

    def where(self, spec: PipelineSpec) -> str:
        return self.source(spec).stream

    def check(self, spec: PipelineSpec) -> None:
        try:
            reach_redis(self.source(spec))
        except DestinationUnreachable as exc:
            raise SourceError(f"pipeline.source: {exc.problem}") from None


#: The adapter of each kind of source, by ``source.type``.
ADAPTERS: dict[str, SourceAdapter[Any]] = {
    a.kind: a
    for a in (
        JournalAdapter(),
        KafkaAdapter(),
        OutboxAdapter(),
        PostgresCdcAdapter(),
        MysqlCdcAdapter(),
        NatsAdapter(),
        RedisAdapter(),
    )
}


def adapter(spec: PipelineSpec) -> SourceAdapter[Any]:
    """The adapter of the pipeline's source."""
    return ADAPTERS[spec.source.type]
