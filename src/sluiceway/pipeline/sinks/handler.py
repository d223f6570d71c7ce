"""The ``foreachBatch`` function of a sink's query: order, resume, skip, step, retry, dead letters.

For each micro-batch: collect it as Arrow, sort it by offset (a stable sort: records a transform
fanned out keep their place, and a key's records stay in order), resume after the records a
previous attempt of the same batch already wrote, leave out records an operator skipped, then
:func:`~sluiceway.pipeline.failures.deliver` the rest. The sink's state file records the
outcome; a failure raises :class:`SinkFailed`, which stops this sink's query only — every sink
has its own query and checkpoint.

The handler is a small picklable object (specs and paths); writers are opened lazily where the
batch runs and are never pickled, so it works unchanged under Spark Connect.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import PipelineError, SinkFailed, StepPaused
from sluiceway.pipeline.failures import Outcome, RetryPolicy, deliver, progress_at, resume_position
from sluiceway.pipeline.sinks.base import SinkWriter, make_writer
from sluiceway.pipeline.state import StateStore

log = logging.getLogger("sluiceway.pipeline.sink")


class Stopping(PipelineError):
    MARKER = "sluice-stopping"

    def __init__(self, sink: str) -> None:
        super().__init__(f"{self.MARKER}: sink {sink!r} stopped before its next batch")


def policy_of(spec: Any) -> RetryPolicy:
    r = spec.retry
    return RetryPolicy(r.attempts, r.backoff, r.max_backoff, r.record_attempts)


def sort_by_offset(table: pa.Table) -> pa.Table:
    if "offset" not in table.column_names or table.num_rows < 2:
        return table
    return table.sort_by([("offset", "ascending")])


def dead_letter_rows(table: pa.Table, *, sink: str, error: str) -> pa.Table:
    """The failing record with headers saying where and why it failed."""
    rows = table.to_pylist()
    for row in rows:
        headers = list(row.get("headers") or [])
        headers += [
            {"key": "sluice.sink", "value": sink},
            {"key": "sluice.offset", "value": str(row.get("offset"))},
            {"key": "sluice.error", "value": error[:1000]},
        ]
        row["headers"] = headers
    return pa.Table.from_pylist(rows, schema=table.schema)


class BatchHandler:
    """``foreachBatch`` callable for one sink of one pipeline."""

    def __init__(
        self, pipeline: str, sink: Any, checkpoint_dir: str, *, stopping: threading.Event | None = None
    ) -> None:
        self.pipeline = pipeline
        self.sink = sink
        self.name = sink.name
        self.checkpoint_dir = checkpoint_dir
        self.policy = policy_of(sink)
        #: Set when the run is stopping (SIGTERM): batches that have not started write nothing.
        #: The run's own event — two pipelines in one process stop independently.
        self.stopping = stopping
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

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise Stopping(self.name)
        self.handle(df.toArrow(), batch_id)

    def close(self) -> None:
        for w in (self._writer, self._dead):
            if w is not None:
                try:
                    w.close()
                except Exception as exc:  # closing is best effort; the data is already acknowledged
                    log.warning("sink %s: close failed: %s", self.name, exc)
        self._writer = self._dead = None

    # -- the batch -------------------------------------------------------------------------------
    def handle(self, table: pa.Table, batch_id: int, *, sleep: Any = None) -> Outcome:
        store = StateStore(self.checkpoint_dir)
        with store.update() as state:
            pass  # a first batch persists the run id its tokens are made of
        if state.batch == batch_id and state.done:
            log.info("sink %s: batch %d was already written; skipping its replay", self.name, batch_id)
            return Outcome(0)
        table = sort_by_offset(table)
        n = table.num_rows
        offsets: list[int] = (
            table.column("offset").to_pylist() if "offset" in table.column_names else list(range(n))
        )
        start = resume_position(offsets, state.last, state.rank) if state.batch == batch_id else 0
        skip = set(state.skip)
        todo = [i for i in range(start, n) if offsets[i] not in skip]
        paused = False
        if state.step is not None:
            if state.step <= 0 and todo:
                raise StepPaused(self.name)
            if len(todo) > state.step:
                todo, paused = todo[: state.step], True
        run = state.run

        def write(lo: int, hi: int) -> None:
            idx = todo[lo:hi]
            part = table.slice(idx[0], len(idx)) if idx[-1] - idx[0] == len(idx) - 1 else table.take(idx)
            self.writer.write(part, f"{run}-{batch_id:010d}-{idx[0]:08d}-{len(idx)}")

        def progress(written: int) -> None:
            last, rank = progress_at(offsets, todo[written - 1] + 1)
            with store.update() as st:
                st.batch, st.done, st.last, st.rank = batch_id, False, last, rank

        dead_writer = self.dead_writer

        def dead(pos: int, error: str) -> None:
            assert dead_writer is not None
            i = todo[pos]
            rows = dead_letter_rows(table.slice(i, 1), sink=self.name, error=error)
            dead_writer.write(rows, f"{run}-{batch_id:010d}-{i:08d}-dead")
            log.warning(
                "sink %s: record at offset %s sent to the dead-letter sink: %s", self.name, offsets[i], error
            )

        kwargs: dict[str, Any] = {"progress": progress, "what": f"sink {self.name}"}
        if dead_writer is not None:
            kwargs["dead_letter"] = dead
        if sleep is not None:
            kwargs["sleep"] = sleep
        outcome = deliver(len(todo), write, self.policy, **kwargs)

        with store.update() as st:
            st.batch = batch_id
            st.records += outcome.written - len(outcome.dead)
            st.dead_lettered += len(outcome.dead)
            if outcome.written:
                st.last_offset = offsets[todo[outcome.written - 1]]
            if outcome.ok:
                end = todo[-1] + 1 if (paused and todo) else n
                st.last, st.rank = progress_at(offsets, end)
                st.done = not paused
                st.error = None
                if st.step is not None:
                    st.step = max(0, st.step - len(todo))
            else:
                assert outcome.failed_at is not None
                failed = todo[outcome.failed_at]
                st.last, st.rank = progress_at(offsets, failed)
                st.done = False
                st.failed(offsets[failed], outcome.error or "failed", batch_id)
        if not outcome.ok:
            assert outcome.failed_at is not None
            failed = todo[outcome.failed_at]
            last_good = offsets[failed - 1] if failed > 0 else None
            raise SinkFailed(
                self.name, offsets[failed], outcome.error or "failed", batch_id=batch_id, last_good=last_good
            )
        if paused:
            raise StepPaused(self.name)
        return outcome
