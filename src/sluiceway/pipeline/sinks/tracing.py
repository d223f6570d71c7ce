"""The pipeline's spans (``tracing: {enabled: true}`` in the spec; docs/operations.md, "Tracing").

Two spans continue the traces of a micro-batch's records (their ``traceparent`` headers, as the
Stasher wrote them and the harvester or the capture passed them on):

* **one per sink per batch, on the driver** (``process <pipeline>.<sink>``, kind ``CONSUMER``):
  from the batch's start to the moment its outcome is known; its records' traces are those the
  parts reported, or — where Spark wrote the batch without Python in the tasks (a Parquet sink
  without a dead-letter sink, a Delta or Iceberg table written natively) — found by one more
  read of the batch's headers after the write;
* **one per part written, on the executor that wrote it** (``write <sink>``, kind ``PRODUCER``):
  the sink's write of that part, failed with the destination's reason if a record stopped it.

Each is the child of the record's span when it covers one record, and links to each record's
span when it covers a batch (at most 128 links: OpenTelemetry's default limit), as the messaging
conventions say. A batch whose records carry no sampled trace gets no span at all. Records and
their headers go to the sinks unchanged.

An executor may be another machine: the tasks carry the driver's ``OTEL_*`` variables
(:class:`TraceSetup`) and use them when their own environment has no ``OTEL_*`` variable. A
Python worker can end without running its exit handlers, so a part's span is exported before the
task returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.tracing import (
    MAX_LINKS,
    TRACEPARENT,
    Tracing,
    continuing,
    end_span,
    otel_environment,
    sampled_contexts,
    sampled_parent,
    start_tracing,
)

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.part import PartResult

#: The service name of the pipeline's spans, unless ``OTEL_SERVICE_NAME`` gives one.
SERVICE = "sluice-pipeline"
#: How long a task waits for its span to be exported before it returns (seconds).
EXPORT_WAIT = 2.0

log = logging.getLogger("sluiceway.pipeline.sink")


@dataclass(frozen=True)
class TraceSetup:
    """What a sink's batches need to trace (small and picklable, for the tasks): the pipeline,
    the source's kind (``messaging.system``) and the driver's ``OTEL_*`` variables."""

    pipeline: str
    system: str
    environment: tuple[tuple[str, str], ...] = ()

    @classmethod
    def here(cls, pipeline: str, system: str) -> TraceSetup:
        return cls(pipeline, system, tuple(sorted(otel_environment().items())))

    def start(self) -> Tracing:
        """This process's tracing (started once per process; see :func:`~sluiceway.tracing.start_tracing`)."""
        return start_tracing(SERVICE, dict(self.environment))


def traceparents(table: pa.Table) -> list[str]:
    """The distinct sampled ``traceparent`` values among the records of ``table`` (at most
    :data:`~sluiceway.tracing.MAX_LINKS`), read column-wise: the records nobody traces cost a
    comparison of their header names."""
    if "headers" not in table.column_names or table.num_rows == 0:
        return []
    column = table.column("headers")
    headers = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    flat = headers.flatten()
    values = pc.filter(flat.field("value"), pc.equal(flat.field("key"), TRACEPARENT))
    found: list[str] = []
    for value in pc.unique(values).to_pylist():
        if value is not None and sampled_parent([(TRACEPARENT, value)]):
            found.append(value)
            if len(found) == MAX_LINKS:
                break
    return found


def spark_traceparents(df: Any) -> list[str]:
    """:func:`traceparents` of a Spark batch, by one small query (for the batches Spark writes
    itself, where no Python task sees the records)."""
    if "headers" not in df.columns:
        return []
    from pyspark.sql import functions as F

    values = (
        df.select(F.explode(F.expr(f"filter(headers, h -> h.key = '{TRACEPARENT}')")).alias("h"))
        .select(F.col("h.value").alias("value"))
        .where(F.col("value").rlike("[13579bdfBDF]$"))
        .distinct()
        .limit(MAX_LINKS)
        .collect()
    )
    return [row["value"] for row in values if sampled_parent([(TRACEPARENT, row["value"])])]


def contexts_of(parents: Sequence[str]) -> list[Any]:
    return sampled_contexts([(TRACEPARENT, value)] for value in parents)


def traced_part(
    setup: TraceSetup,
    table: pa.Table,
    *,
    sink: str,
    sink_kind: str,
    batch: int,
    part: int,
    write: Callable[[], PartResult],
) -> PartResult:
    """``write()`` of one part of a batch, in a ``write <sink>`` span when its records carry a
    sampled trace; the result names those traces for the driver's span. Tracing never changes
    how the part went: a span that cannot be made or exported is a warning."""
    parents = traceparents(table)
    span = tracing = None
    if parents:
        try:
            tracing = setup.start()
            span = continuing(
                tracing.tracer, f"write {sink}", contexts_of(parents), records=table.num_rows,
                kind="PRODUCER",
                attributes={
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "write",
                    "messaging.destination.name": sink,
                    "messaging.batch.message_count": table.num_rows,
                    "sluiceway.pipeline": setup.pipeline,
                    "sluiceway.sink.kind": sink_kind,
                    "sluiceway.pipeline.batch": batch,
                    "sluiceway.pipeline.part": part,
                },
            )  # fmt: skip
        except Exception as exc:  # the otel extra missing on this executor, say
            log.warning("sink %s: no span for part %d of batch %d: %s", sink, part, batch, exc)
    if span is None or tracing is None:
        result = write()
        result.traces = parents
        return result
    try:
        result = write()
    except BaseException as exc:
        _finish(tracing, span, str(exc) or type(exc).__name__)
        raise
    span.set_attribute("sluiceway.written_count", result.written)
    _finish(tracing, span, result.error)
    result.traces = parents
    return result


def _finish(tracing: Tracing, span: Any, error: str | None) -> None:
    """End a task's span and export it before the task returns (its Python worker may end
    without running exit handlers), waiting at most :data:`EXPORT_WAIT` for the collector."""
    try:
        end_span(span, error)
        tracing.provider.force_flush(int(EXPORT_WAIT * 1000))
    except Exception as exc:
        log.warning("tracing: a part's span could not be exported: %s", exc)


class BatchSpan:
    """The driver's span of one sink's batch: its start taken before the batch is written, the
    span made once its outcome (and its records' traces) is known."""

    def __init__(self, setup: TraceSetup, sink: str, sink_kind: str, batch: int) -> None:
        self.setup, self.sink, self.sink_kind, self.batch = setup, sink, sink_kind, batch
        self.started = time.time_ns()

    def end(self, parents: Sequence[str], records: int, error: str | None) -> None:
        """The span, when ``parents`` (the batch's sampled traceparents) is not empty."""
        contexts = contexts_of(parents)
        if not contexts:
            return
        group = f"{self.setup.pipeline}.{self.sink}"
        span = continuing(
            self.setup.start().tracer, f"process {group}", contexts, records=records, kind="CONSUMER",
            start_time=self.started,
            attributes={
                "messaging.system": self.setup.system,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.consumer.group.name": group,
                "messaging.batch.message_count": records,
                "sluiceway.pipeline": self.setup.pipeline,
                "sluiceway.sink.kind": self.sink_kind,
                "sluiceway.pipeline.batch": self.batch,
            },
        )  # fmt: skip
        end_span(span, error)
