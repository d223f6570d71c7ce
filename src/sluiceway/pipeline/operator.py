"""Operator tools without Spark: status (offsets, lag, last error), inspect, skip.

``status`` reads each sink's Spark checkpoint (``offsets/`` and ``commits/``: the per-writer
offset log) and its sluiceway state file; ``inspect`` reads the source directly; ``skip`` marks
a record done for one sink without writing it. What each kind of source answers (lag, records,
its end) comes from its adapter (:mod:`~sluiceway.pipeline.sources.adapters`). ``step`` needs
Spark and lives on :class:`~sluiceway.pipeline.runner.Pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluiceway.pipeline.checkpoint import Checkpoint, read_checkpoint
from sluiceway.pipeline.errors import NoSuchOffset
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.adapters import adapter
from sluiceway.pipeline.spec import PipelineSpec
from sluiceway.pipeline.state import SinkHealth, StateStore

if TYPE_CHECKING:
    from sluiceway.cdc.progress import CdcStatus

__all__ = ["Checkpoint", "SinkStatus", "inspect", "read_checkpoint", "skip", "source_status", "status"]


@dataclass
class SinkStatus:
    sink: str
    state: SinkHealth
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


def status(spec: PipelineSpec) -> list[SinkStatus]:
    """Per sink: committed batch and source position, lag, records written, last error."""
    source = adapter(spec)
    out = []
    for sink in spec.sinks:
        cp = read_checkpoint(spec.checkpoint_dir(sink.name))
        st = StateStore(spec.checkpoint_dir(sink.name)).load()
        try:
            position, lag = source.lag(spec, cp.committed)
        except Exception as exc:  # status must still show what it can when the source is down
            position, lag = cp.committed, None
            st.error = st.error or {"message": f"source unavailable: {exc}", "offset": None}
        if st.error:
            state = SinkHealth.FAILED
        elif cp.committed_batch is None and cp.planned_batch is None:
            state = SinkHealth.NEW
        elif cp.planned_batch != cp.committed_batch:
            state = SinkHealth.IN_FLIGHT
        else:
            state = SinkHealth.OK
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


def source_status(spec: PipelineSpec) -> CdcStatus | None:
    """What the source itself reports beyond the sinks: for CDC, each table's phase (copy with its
    progress, or sync) and the slot (confirmed position, WAL retained). ``None`` for others."""
    return adapter(spec).status(spec)


def skip(spec: PipelineSpec, sink: str, offset: int) -> None:
    """Mark the record at ``offset`` done for ``sink`` without writing it (takes effect when the
    sink next reaches it; a sink stopped on it resumes after it)."""
    spec.sink(sink)  # names the sink or raises SpecError
    if offset < 0:
        raise ValueError("offset must be >= 0")
    source = adapter(spec)
    end = source.end_offset(spec)
    if end is not None and offset >= end:
        held = f"holds offsets 0 to {end - 1}" if end else "holds no records"
        raise NoSuchOffset(
            f"offset {offset} is past the end of the source: {spec.source.type} {source.where(spec)} "
            f"{held} (nothing skipped)"
        )
    with StateStore(spec.checkpoint_dir(sink)).update() as st:
        if offset not in st.skip:
            st.skip.append(offset)


def inspect(spec: PipelineSpec, start: int, end: int, *, limit: int = 1000) -> pa.Table:
    """The source's records with ``start <= offset < end`` (for Kafka: in every partition)."""
    if end <= start:
        return pa.Table.from_batches([], schema=RECORD_SCHEMA)
    return adapter(spec).inspect(spec, start, end, limit)
