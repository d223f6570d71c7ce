"""Operator tools without Spark: status (offsets, lag, last error), inspect, skip.

``status`` reads each sink's Spark checkpoint (``offsets/`` and ``commits/``: the per-writer
offset log) and its sluiceway state file; ``inspect`` reads the source directly; ``skip`` marks
a record done for one sink without writing it. ``step`` needs Spark and lives on
:class:`~sluiceway.pipeline.runner.Pipeline`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import NoSuchOffset, SourceError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.spec import PipelineSpec
from sluiceway.pipeline.state import StateStore


@dataclass(frozen=True)
class Checkpoint:
    committed_batch: int | None
    committed: dict[str, Any] | None
    planned_batch: int | None
    planned: dict[str, Any] | None


def _numbered(path: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


def _offset_of(path: Path) -> dict[str, Any] | None:
    """The source offset in one ``offsets/<n>`` file: ``v1``, metadata, then one line per source."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        return None
    if len(lines) < 3 or lines[-1] == "-":
        return None
    value = json.loads(lines[-1])
    return value if isinstance(value, dict) else None


def read_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    d = Path(directory)
    commits = _numbered(d / "commits")
    offsets = _numbered(d / "offsets")
    cb = commits[-1] if commits else None
    pb = offsets[-1] if offsets else None
    return Checkpoint(
        cb,
        _offset_of(d / "offsets" / str(cb)) if cb is not None else None,
        pb,
        _offset_of(d / "offsets" / str(pb)) if pb is not None else None,
    )


@dataclass
class SinkStatus:
    sink: str
    state: str
    committed_batch: int | None
    position: Any
    lag: int | None
    last_offset: int | None
    records: int
    dead_lettered: int
    error: dict[str, Any] | None
    skipped: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _lag(spec: PipelineSpec, committed: dict[str, Any] | None) -> tuple[Any, int | None]:
    src = spec.source
    if src.type == "journal":
        from sluiceway.pipeline.sources.journal import journal_head

        pos = int(committed["offset"]) if committed else 0
        return pos, max(0, journal_head(src.path) - pos)
    if src.type == "kafka":
        from sluiceway.pipeline.sources.kafka import KafkaAdmin, kafka_config

        admin = KafkaAdmin(kafka_config({f"kafka.{k}": v for k, v in src.config.items()}), src.topics)
        try:
            high = admin.watermarks(low=False)
        finally:
            admin.close()
        parts = {k: int(v) for k, v in (committed or {}).items()}
        return parts, sum(max(0, h - parts.get(k, 0)) for k, h in high.items())
    if src.type == "postgres-cdc":
        # The sinks read the capture's journal: position and lag are offsets in it (the WAL the
        # capture itself is behind is the source's own figure, in source_status).
        from sluiceway.pipeline.runner import cdc_log_dir
        from sluiceway.pipeline.sources.journal import journal_head

        pos = int(committed["offset"]) if committed else 0
        return pos, max(0, journal_head(str(cdc_log_dir(spec))) - pos)
    if src.type == "nats":
        from sluiceway.pipeline.sources.nats import stream_bounds

        first, head = stream_bounds(list(src.servers), src.stream)
        pos = int(committed["seq"]) if committed else first
        return pos, max(0, head - pos)
    if src.type == "redis":
        # Position: the last entry id read; Redis cannot count entries after an id cheaply.
        return (committed or {}).get("after"), None
    from sluiceway.pipeline.sources.outbox import OutboxState

    state = OutboxState(src.dsn, src.table)
    try:
        rows, _claimed = state.backlog()
    finally:
        state.close()
    return (int(committed["batch"]) if committed else 0), rows


def status(spec: PipelineSpec) -> list[SinkStatus]:
    """Per sink: committed batch and source position, lag, records written, last error."""
    out = []
    for sink in spec.sinks:
        cp = read_checkpoint(spec.checkpoint_dir(sink.name))
        st = StateStore(spec.checkpoint_dir(sink.name)).load()
        try:
            position, lag = _lag(spec, cp.committed)
        except Exception as exc:  # status must still show what it can when the source is down
            position, lag = cp.committed, None
            st.error = st.error or {"message": f"source unavailable: {exc}", "offset": None}
        if st.error:
            state = "failed"
        elif cp.committed_batch is None and cp.planned_batch is None:
            state = "new"
        elif cp.planned_batch != cp.committed_batch:
            state = "in-flight"
        else:
            state = "ok"
        out.append(
            SinkStatus(
                sink.name,
                state,
                cp.committed_batch,
                position,
                lag,
                st.last_offset,
                st.records,
                st.dead_lettered,
                st.error,
                sorted(st.skip),
            )
        )
    return out


def source_status(spec: PipelineSpec) -> dict[str, Any] | None:
    """What the source itself reports beyond the sinks: for CDC, each table's phase (copy with its
    progress, or sync) and the slot (confirmed position, WAL retained). ``None`` for others."""
    if spec.source.type != "postgres-cdc":
        return None
    from sluiceway.cdc.service import describe
    from sluiceway.pipeline.runner import capture_service

    return describe(capture_service(spec))


def skip(spec: PipelineSpec, sink: str, offset: int) -> None:
    """Mark the record at ``offset`` done for ``sink`` without writing it (takes effect when the
    sink next reaches it; a sink stopped on it resumes after it)."""
    spec.sink(sink)  # names the sink or raises SpecError
    if offset < 0:
        raise ValueError("offset must be >= 0")
    bounds = SOURCE_ENDS.get(spec.source.type)
    end = bounds(spec.source) if bounds is not None else None
    if end is not None and offset >= end:
        held = f"holds offsets 0 to {end - 1}" if end else "holds no records"
        raise NoSuchOffset(
            f"offset {offset} is past the end of the source: {spec.source.type} {_where(spec.source)} "
            f"{held} (nothing skipped)"
        )
    with StateStore(spec.checkpoint_dir(sink)).update() as st:
        if offset not in st.skip:
            st.skip.append(offset)


def _journal_end(src: Any) -> int:
    from sluiceway.pipeline.sources.journal import journal_head

    return journal_head(src.path)


def _kafka_end(src: Any) -> int:
    from sluiceway.pipeline.sources.kafka import KafkaAdmin, kafka_config

    admin = KafkaAdmin(kafka_config({f"kafka.{k}": v for k, v in src.config.items()}), src.topics)
    try:
        return max(admin.watermarks(low=False).values(), default=0)  # offsets are per partition
    finally:
        admin.close()


def _nats_end(src: Any) -> int:
    from sluiceway.pipeline.sources.nats import stream_bounds

    return stream_bounds(list(src.servers), src.stream)[1]


#: The next offset of each kind of source that can tell it cheaply (``skip`` refuses offsets past it).
SOURCE_ENDS: dict[str, Callable[[Any], int]] = {
    "journal": _journal_end,
    "kafka": _kafka_end,
    "nats": _nats_end,
}


def _where(src: Any) -> str:
    if src.type == "journal":
        return str(src.path)
    return str(getattr(src, "stream", None) or ",".join(getattr(src, "topics", [])))


def inspect(spec: PipelineSpec, start: int, end: int, *, limit: int = 1000) -> pa.Table:
    """The source's records with ``start <= offset < end`` (for Kafka: in every partition)."""
    src = spec.source
    if end <= start:
        return pa.Table.from_batches([], schema=RECORD_SCHEMA)
    if src.type == "journal":
        return _journal_records(src.path, start, min(end, start + limit))
    if src.type == "kafka":
        from sluiceway.pipeline.sources.kafka import (
            KafkaAdmin,
            KafkaPartition,
            kafka_config,
            read_partition,
            split_key,
        )

        conf = kafka_config({f"kafka.{k}": v for k, v in src.config.items()})
        admin = KafkaAdmin(conf, src.topics)
        try:
            low, high = admin.watermarks(low=True), admin.watermarks(low=False)
        finally:
            admin.close()
        batches: list[pa.RecordBatch] = []
        for key in sorted(high):
            lo, hi = max(start, low[key]), min(end, high[key], start + limit)
            if hi > lo:
                topic, p = split_key(key)
                batches.extend(read_partition(conf, KafkaPartition(topic, p, lo, hi), 10.0))
        return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
    if src.type == "postgres-cdc":
        from sluiceway.pipeline.runner import cdc_log_dir

        return _journal_records(str(cdc_log_dir(spec)), start, min(end, start + limit))
    if src.type == "nats":
        from sluiceway.pipeline.sources.nats import NatsPartition, read_range

        part = NatsPartition(tuple(src.servers), src.stream, src.subject, start, min(end, start + limit))
        return pa.Table.from_batches(list(read_range(part)), schema=RECORD_SCHEMA)
    if src.type == "redis":
        from sluiceway.brokers.redis import offset_entry
        from sluiceway.pipeline.sources.redis import RedisPartition
        from sluiceway.pipeline.sources.redis import read_range as read_entries

        entries = RedisPartition(src.url, src.stream, offset_entry(max(0, start - 1)), offset_entry(end - 1))
        return pa.Table.from_batches(list(read_entries(entries)), schema=RECORD_SCHEMA).slice(0, limit)
    from sluiceway.pipeline.sources.outbox import OutboxState

    state = OutboxState(src.dsn, src.table)
    try:
        return state.peek(start, end, limit)
    finally:
        state.close()


def _journal_records(path: str, start: int, end: int) -> pa.Table:
    from sluiceway.journal import Journal, JournalNotFoundError
    from sluiceway.pipeline.record import with_delete_ops, with_header_ops

    try:
        with Journal.open(path, read_only=True) as journal:
            batches = [with_header_ops(with_delete_ops(b)) for b in journal.read_arrow(start, end)]
    except JournalNotFoundError as exc:
        raise SourceError(f"no journal at {path}") from exc
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
