"""The ``foreachBatch`` function of a sink's query: the batch written from the executors, the
sink's state kept on the driver.

For each micro-batch the Spark tasks write their parts of it
(:mod:`~sluiceway.pipeline.sinks.distributed`: the batch split by key for ordered sinks, the
source's own parts for files; the per-part rules — resume, skip, retry, one record at a time,
dead letters — in :mod:`~sluiceway.pipeline.sinks.part`), and each returns one small row. The
driver records the outcome in the sink's state file and, if a part stopped on a record it could
not write, raises :class:`SinkFailed`, which stops this sink's query only — every sink has its
own query and checkpoint. Only those rows reach the driver: its memory does not grow with the
batch. One exception, small by construction: the ``console`` sink shows a batch's first rows there.
``step`` lets each part that has records left write one of them. :meth:`BatchHandler.write_here`
runs the same batch step with the batch written on the driver as one part (the unit tests'
way in, without Spark).

The handler is a small picklable object (specs and paths), so it works unchanged under Spark
Connect.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluiceway.pipeline.errors import (
    PipelineError,
    SinkFailed,
    StepPaused,
    error_detail,
    explain,
    file_system_fault,
    from_python_worker,
    one_line,
)
from sluiceway.pipeline.failures import RetryPolicy
from sluiceway.pipeline.sinks.base import SinkWriter
from sluiceway.pipeline.sinks.distributed import (
    RESULT_DDL,
    TaskPlan,
    commit_files,
    default_parallelism,
    prepare,
    results_of,
    write_parquet,
)
from sluiceway.pipeline.sinks.kinds import Path, kind_of, make_writer
from sluiceway.pipeline.sinks.part import PartResult, write_part
from sluiceway.pipeline.spec import FilesSinkSpec
from sluiceway.pipeline.state import SinkState, StateStore

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.tracing import TraceSetup
    from sluiceway.pipeline.spec import SinkSpec

log = logging.getLogger("sluiceway.pipeline.sink")


@dataclass(frozen=True)
class BatchSummary:
    """What a batch did, for metrics: records written, and of the rest, dead-lettered."""

    records: int
    dead_lettered: int


class Stopping(PipelineError):
    MARKER = "sluice-stopping"

    def __init__(self, sink: str) -> None:
        super().__init__(f"{self.MARKER}: sink {sink!r} stopped before its next batch")


def policy_of(spec: SinkSpec) -> RetryPolicy:
    r = spec.retry
    return RetryPolicy(r.attempts, r.backoff, r.max_backoff, r.record_attempts, r.outage)


class BatchHandler:
    """``foreachBatch`` callable for one sink of one pipeline."""

    def __init__(
        self,
        pipeline: str,
        sink: SinkSpec,
        checkpoint_dir: str,
        *,
        stopping: threading.Event | None = None,
        tracing: TraceSetup | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.sink = sink
        self.name = sink.name
        self.checkpoint_dir = checkpoint_dir
        self.policy = policy_of(sink)
        #: Set when the run is stopping (SIGTERM): batches that have not started write nothing.
        #: The run's own event — two pipelines in one process stop independently.
        self.stopping = stopping
        #: Tracing on: the batch's spans (:mod:`sluiceway.pipeline.sinks.tracing`).
        self.tracing = tracing
        self._writer: SinkWriter | None = None
        self._dead: SinkWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled under Spark Connect to run on the server, where the run's event cannot follow.
        state = dict(self.__dict__)
        state["_writer"] = state["_dead"] = state["stopping"] = None
        return state

    @property
    def writer(self) -> SinkWriter:
        if self._writer is None:
            self._writer = make_writer(self.sink, sink_name=f"{self.pipeline}.{self.name}")
        return self._writer

    @property
    def dead_writer(self) -> SinkWriter | None:
        if self.sink.dead_letter is None:
            return None
        if self._dead is None:
            self._dead = make_writer(self.sink.dead_letter, sink_name=f"{self.pipeline}.{self.name}.dead")
        return self._dead

    def __call__(self, df: Any, batch_id: int) -> BatchSummary:
        if self.stopping is not None and self.stopping.is_set():
            raise Stopping(self.name)
        if kind_of(self.sink).path is Path.SHOW:
            return self.show(df)
        state = self._begin(batch_id)
        if state is None:
            return BatchSummary(0, 0)
        try:
            results = self.write_batch(df, batch_id, state)
        except (SinkFailed, StepPaused, Stopping):
            raise
        except Exception as exc:
            # A transform's (a Python worker's) error escaped the batch's job: one line that names
            # its cause, and its whole text kept for ``pipeline status --json``. Spark's own
            # errors go on as before (the run names them from their text).
            if not from_python_worker(exc):
                raise
            line = explain(exc)
            with StateStore(self.checkpoint_dir).update() as st:
                st.failed(None, line, batch_id, detail=error_detail(exc))
            raise SinkFailed(self.name, None, line, batch_id=batch_id) from exc
        return self._summary(results)

    def show(self, df: Any) -> BatchSummary:
        """The console sink: the batch's first rows and its size (all the driver needs of it)."""
        from sluiceway.pipeline.sinks.console import ConsoleSink

        writer = self.writer
        assert isinstance(writer, ConsoleSink)
        total = df.count()
        writer.show(df.limit(writer.limit).toArrow(), total)
        return BatchSummary(total, 0)

    def write_batch(self, df: Any, batch_id: int, state: SinkState) -> list[PartResult]:
        """Write the batch from the executors (see the module docstring); record how it went."""
        plan, sink = self._plan(batch_id, state), self.sink
        kind = kind_of(sink)
        span = None
        if self.tracing is not None:
            from sluiceway.pipeline.sinks.tracing import BatchSpan

            span = BatchSpan(self.tracing, self.name, sink.type, batch_id)
        if kind.path is Path.TABLE:
            from sluiceway.pipeline.sinks.tables import write_lake

            results = write_lake(df, plan)
        elif kind.spark_writer and sink.dead_letter is None and state.step is None:
            assert isinstance(sink, FilesSinkSpec)
            results = write_parquet(df, plan, sink.path)
        else:
            parallelism = sink.parallelism or default_parallelism(df, kind.one_part)
            try:
                rows = prepare(df, kind.path, parallelism).mapInArrow(plan, RESULT_DDL).collect()
            except Exception as exc:
                fault = self._spill_fault(df, exc, batch_id)
                if fault is None:
                    raise
                raise fault from exc
            results = results_of(rows)
            if kind.path is Path.FILES:
                assert isinstance(sink, FilesSinkSpec)
                commit_files(sink.path, results)
        if span is not None:
            self._end_span(span, df, results)
        return self._record(batch_id, results)

    def _end_span(self, span: Any, df: Any, results: list[PartResult]) -> None:
        """The batch's span, continuing its records' traces: those the parts reported, or where
        Spark wrote the batch itself, those one more read of the batch's headers finds. Tracing
        never changes how a batch went: a failure of its own is a warning."""
        from sluiceway.pipeline.sinks.tracing import spark_traceparents

        try:
            parents = list(dict.fromkeys(p for r in results for p in r.traces))
            if not parents and any(r.by_spark and r.written for r in results):
                parents = spark_traceparents(df)
            failed = next((r.error for r in results if r.error is not None), None)
            span.end(parents, sum(r.rows for r in results), failed)
        except Exception as exc:
            log.warning("sink %s: no span for batch %d: %s", self.name, span.batch, one_line(exc))

    def _spill_fault(self, df: Any, exc: Exception, batch_id: int) -> SinkFailed | None:
        """A batch's shuffle or spill files that do not fit Spark's local directory (a full disk):
        one line naming it, not the JVM's trace. The sink's own writes report their faults as
        parts; what escapes the job is Spark's."""
        try:
            local = df.sparkSession.conf.get("spark.local.dir", None) or tempfile.gettempdir()
        except Exception:  # a session that cannot say: the JVM's default
            local = tempfile.gettempdir()
        fault = file_system_fault(exc, f"Spark's local directory {local} (spark.local.dir)")
        if fault is None:
            return None
        return SinkFailed(self.name, None, fault.problem, batch_id=batch_id)

    def write_here(self, table: pa.Table, batch_id: int, *, sleep: Any = None) -> BatchSummary:
        """The same batch step with the whole batch written here as one part, by this handler's
        writers: the handler's rules (replay, resume, skip, step, failure) tested without Spark."""
        state = self._begin(batch_id)
        if state is None:
            return BatchSummary(0, 0)
        plan = self._plan(batch_id, state)
        result = write_part(
            table,
            part=None,
            sink=self.name,
            writer=self.writer,
            dead_writer=self.dead_writer,
            policy=self.policy,
            run=plan.run,
            batch=batch_id,
            resume=plan.resume.get(0),
            skip=plan.skip,
            step=plan.step,
            sleep=sleep,
        )
        return self._summary(self._record(batch_id, [result]))

    # -- the batch step: before and after the parts are written ----------------------------------
    def _begin(self, batch_id: int) -> SinkState | None:
        """The sink's state for this batch; ``None`` if it is a replay of a batch written in full."""
        with StateStore(self.checkpoint_dir).update() as state:
            pass  # a first batch persists the run id its tokens are made of
        if state.batch == batch_id and state.done:
            log.info("sink %s: batch %d was already written; skipping its replay", self.name, batch_id)
            return None
        return state

    def _plan(self, batch_id: int, state: SinkState) -> TaskPlan:
        # A replay of the batch resumes each part where the previous attempt left it.
        resume: dict[int, tuple[int | None, int]] = (
            {int(p): (v[0], int(v[1])) for p, v in state.parts.items()} if state.batch == batch_id else {}
        )
        skip = frozenset(state.skip)
        return TaskPlan(
            self.pipeline, self.sink, state.run, batch_id, self.policy, resume, skip, state.step, self.tracing
        )

    def _record(self, batch_id: int, results: list[PartResult]) -> list[PartResult]:
        """Record how the batch went in the sink's state; raise if a part stopped or paused."""
        failed = [r for r in results if not r.ok]
        paused = any(r.paused for r in results)
        first = min(failed, key=lambda r: (r.failed_offset is None, r.failed_offset)) if failed else None
        with StateStore(self.checkpoint_dir).update() as st:
            st.batch, st.done = batch_id, not failed and not paused
            st.records += sum(r.written - r.dead for r in results)
            st.dead_lettered += sum(r.dead for r in results)
            written = [r.last_offset for r in results if r.last_offset is not None]
            if written:
                st.last_offset = max(written)
            st.last, st.rank = None, 0
            st.parts = {} if st.done else {str(r.part): [r.last, r.rank] for r in results}
            st.writers = [{"part": r.part, "pid": r.pid, "jvm": r.jvm, "records": r.written} for r in results]
            if st.step is not None:
                st.step = max(0, st.step - sum(r.written for r in results))
            if first is not None:
                st.failed(first.failed_offset, _stopped(first, len(failed)), batch_id)
            else:
                st.error = None
        if first is not None:
            raise SinkFailed(
                self.name,
                first.failed_offset,
                _stopped(first, len(failed)),
                batch_id=batch_id,
                last_good=first.last_good,
            )
        if paused:
            raise StepPaused(self.name)
        return results

    @staticmethod
    def _summary(results: list[PartResult]) -> BatchSummary:
        dead = sum(r.dead for r in results)
        return BatchSummary(sum(r.written for r in results) - dead, dead)

    def close(self) -> None:
        for w in (self._writer, self._dead):
            if w is not None:
                try:
                    w.close()
                except Exception as exc:  # closing is best effort; the data is already acknowledged
                    log.warning("sink %s: close failed: %s", self.name, exc)
        self._writer = self._dead = None


def _stopped(first: PartResult, parts: int) -> str:
    more = f" (and {parts - 1} more part(s) stopped)" if parts > 1 else ""
    return (first.error or "failed") + more
