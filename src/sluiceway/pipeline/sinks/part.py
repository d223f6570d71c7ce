"""Writing one part of a micro-batch: resume, skip, step, retry, one record at a time, dead letters.

The same rules wherever a part is written — a Spark task writing its share of a batch on an
executor, or the handler writing a whole batch as one part without Spark (its unit tests): sort
by offset (stable), resume after the records a previous attempt of the same batch already wrote
in this part, leave out records an operator skipped, then
:func:`~sluiceway.pipeline.failures.deliver` the rest. The result is a small value (counts, the
progress reached, the failure) that the driver records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.failures import RetryPolicy, deliver, progress_at, resume_position
from sluiceway.pipeline.sinks.base import SinkWriter

log = logging.getLogger("sluiceway.pipeline.sink")


@dataclass
class PartResult:
    """How writing one part went (picklable; a few numbers and strings)."""

    part: int
    rows: int = 0
    #: Records to write after resuming and skipping.
    todo: int = 0
    #: Of those, written (dead-lettered ones included), as a prefix in offset order.
    written: int = 0
    dead: int = 0
    #: Progress: every record below ``last``, plus ``rank`` records at ``last`` (``None``: none).
    last: int | None = None
    rank: int = 0
    #: Offset of the last record written.
    last_offset: int | None = None
    #: The record that stopped the part, the last one written before it, and why.
    failed_offset: int | None = None
    last_good: int | None = None
    error: str | None = None
    #: ``step``: the budget ran out before the part did.
    paused: bool = False
    #: File sinks: the files written, in order, waiting to be put in place by the driver.
    staged: list[str] = field(default_factory=list)
    #: Where the part was written: the process, and the JVM that started it (``SparkSubmit`` on
    #: the driver in local mode, ``CoarseGrainedExecutorBackend`` on a cluster's executors).
    pid: int = field(default_factory=os.getpid)
    jvm: str = ""
    #: Tracing: the sampled ``traceparent`` values of the part's records (the driver's batch span
    #: continues them; :mod:`sluiceway.pipeline.sinks.tracing`).
    traces: list[str] = field(default_factory=list)
    #: Written by Spark itself (its Parquet writer): no Python task saw the records.
    by_spark: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


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


def token_of(run: str, batch: int, part: int | None, first: int, count: int) -> str:
    """The idempotency token of one write: this checkpoint's life, batch, part and slice."""
    where = "" if part is None else f"p{part:04d}-"
    return f"{run}-{batch:010d}-{where}{first:08d}-{count}"


def batch_of_token(token: str) -> tuple[str, int]:
    """The checkpoint's life and the batch a token names (see :func:`token_of`)."""
    run, batch = token.split("-", 2)[:2]
    return run, int(batch)


def write_part(
    table: pa.Table,
    *,
    part: int | None,
    sink: str,
    writer: SinkWriter,
    dead_writer: SinkWriter | None,
    policy: RetryPolicy,
    run: str,
    batch: int,
    resume: tuple[int | None, int] | None = None,
    skip: frozenset[int] | set[int] = frozenset(),
    step: int | None = None,
    sleep: Callable[[float], None] | None = None,
) -> PartResult:
    """Write ``table`` (one part, or a whole batch when ``part`` is None); see the module docstring.

    ``resume``: progress a previous attempt of this batch reached in this part. ``step``: write at
    most this many records (then ``paused``).
    """
    table = sort_by_offset(table)
    n = table.num_rows
    offsets: list[int] = (
        table.column("offset").to_pylist() if "offset" in table.column_names else list(range(n))
    )
    start = resume_position(offsets, *resume) if resume is not None else 0
    todo = [i for i in range(start, n) if offsets[i] not in skip]
    result = PartResult(part if part is not None else 0, rows=n)
    if step is not None and len(todo) > step:
        todo, result.paused = todo[:step], True
    result.todo = len(todo)

    def write(lo: int, hi: int) -> None:
        idx = todo[lo:hi]
        piece = table.slice(idx[0], len(idx)) if idx[-1] - idx[0] == len(idx) - 1 else table.take(idx)
        writer.write(piece, token_of(run, batch, part, idx[0], len(idx)))

    def dead(pos: int, error: str) -> None:
        assert dead_writer is not None
        i = todo[pos]
        rows = dead_letter_rows(table.slice(i, 1), sink=sink, error=error)
        dead_writer.write(rows, token_of(run, batch, part, i, 1) + "-dead")
        log.warning("sink %s: record at offset %s sent to the dead-letter sink: %s", sink, offsets[i], error)

    kwargs: dict[str, Any] = {"what": f"sink {sink}" + ("" if part is None else f" (part {part})")}
    if dead_writer is not None:
        kwargs["dead_letter"] = dead
    if sleep is not None:
        kwargs["sleep"] = sleep
    outcome = deliver(len(todo), write, policy, **kwargs)

    result.written, result.dead = outcome.written, len(outcome.dead)
    if outcome.written:
        result.last_offset = offsets[todo[outcome.written - 1]]
    if outcome.ok:
        # Paused (``step``): progress ends after the last record written, or where this attempt
        # began when the budget was already spent — never at the part's end, past unwritten records.
        end = (todo[-1] + 1 if todo else start) if result.paused else n
        result.last, result.rank = progress_at(offsets, end)
    elif outcome.unreachable is not None:
        # No record is to blame: progress up to the first record not written, no failed offset.
        result.last, result.rank = progress_at(offsets, todo[outcome.written])
        result.last_good = result.last_offset
        result.error = outcome.unreachable
    else:
        assert outcome.failed_at is not None
        failed = todo[outcome.failed_at]
        result.last, result.rank = progress_at(offsets, failed)
        result.failed_offset = offsets[failed]
        result.last_good = offsets[failed - 1] if failed > 0 else None
        result.error = outcome.error or "failed"
    result.staged = list(getattr(writer, "staged", []))
    return result
