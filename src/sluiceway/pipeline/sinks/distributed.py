"""A micro-batch written from the executors: each Spark task writes its part, the driver keeps score.

Why ``foreachBatch`` with ``mapInArrow`` rather than the Python ``DataSourceStreamWriter`` API:
a sink needs the batch partitioned *by key and sorted by offset* before anything is written (a
shuffle the writer API leaves to the caller), the batch id for its idempotency tokens, the
operator's ``skip``/``step`` state, and the last word on failures — one clear error and the
sink's progress recorded, not a task retried blindly by Spark. ``foreachBatch`` gives all of
that and works unchanged under Spark Connect; ``mapInArrow`` runs the writes in the tasks and
returns one small row per task (records written, progress, the failure) — the only thing that
reaches the driver.

How a batch is split:

* **Ordered sinks** (journal, Kafka, Postgres, feed): ``repartition(n, key)`` then a sort by
  offset (and the record's place in the batch, for records sharing an offset) inside each part.
  Every key's records are in one task, in order; tasks write in parallel. The failure protocol
  applies per part: a part stops at its bad record with every earlier record *of that part*
  written and none after it — other parts (other keys) go on to their ends.
* **File sinks** (parquet, json, csv) keep the source's parts (no shuffle: files are ordered by
  name, not by when they were written). Tasks write to a staging directory; the driver then
  renames the files into place in part order, up to the first failure, so the files of a batch
  are always a prefix of it in offset order. A ``parquet`` sink without a dead-letter sink is
  written by Spark's own Parquet writer (no Python in the tasks at all): a Parquet file has no
  record a writer could refuse, so the batch is written whole or retried whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable, file_system_fault, from_python_worker
from sluiceway.pipeline.failures import RetryPolicy, backoff_delays, reaching
from sluiceway.pipeline.sinks.kinds import Path, kind_of, make_writer
from sluiceway.pipeline.sinks.part import PartResult, write_part

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.tracing import TraceSetup
    from sluiceway.pipeline.spec import SinkSpec

#: The column that keeps a record's place in its batch through the shuffle.
SEQ = "_sluice_seq"

RESULT_SCHEMA = pa.schema(
    [
        pa.field("part", pa.int32()),
        pa.field("rows", pa.int64()),
        pa.field("todo", pa.int64()),
        pa.field("written", pa.int64()),
        pa.field("dead", pa.int64()),
        pa.field("last", pa.int64()),
        pa.field("rank", pa.int64()),
        pa.field("last_offset", pa.int64()),
        pa.field("failed_offset", pa.int64()),
        pa.field("last_good", pa.int64()),
        pa.field("error", pa.string()),
        pa.field("paused", pa.bool_()),
        pa.field("staged", pa.list_(pa.string())),
        pa.field("pid", pa.int32()),
        pa.field("jvm", pa.string()),
        pa.field("traces", pa.list_(pa.string())),
        pa.field("by_spark", pa.bool_()),
    ]
)
RESULT_DDL = (
    "part INT, rows BIGINT, todo BIGINT, written BIGINT, dead BIGINT, last BIGINT, rank BIGINT, "
    "last_offset BIGINT, failed_offset BIGINT, last_good BIGINT, error STRING, paused BOOLEAN, "
    "staged ARRAY<STRING>, pid INT, jvm STRING, traces ARRAY<STRING>, by_spark BOOLEAN"
)


def part_sink_name(pipeline: str, sink: str, part: int) -> str:
    """The name a part's writer keeps its idempotency state under (journal register, Postgres row):
    one per part, since parts of one batch are written side by side."""
    return f"{pipeline}.{sink}#p{part}"


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one batch needs: a small, picklable value (the ``mapInArrow`` function)."""

    pipeline: str
    sink: SinkSpec
    run: str
    batch: int
    policy: RetryPolicy
    #: Progress a previous attempt of this batch reached, per part.
    resume: dict[int, tuple[int | None, int]]
    skip: frozenset[int]
    #: ``step``: records each part may write (``None``: all).
    step: int | None = None
    #: Tracing on: what the tasks' spans need (:mod:`sluiceway.pipeline.sinks.tracing`).
    tracing: TraceSetup | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        received = list(batches)
        if not received or sum(b.num_rows for b in received) == 0:
            yield result_batch(PartResult(part))
            return
        table = pa.Table.from_batches(received)
        if SEQ in table.column_names:
            table = table.drop_columns([SEQ])
        if self.tracing is None:
            result = self.write(part, table)
        else:
            from sluiceway.pipeline.sinks.tracing import traced_part

            result = traced_part(
                self.tracing, table, sink=self.sink.name, sink_kind=self.sink.type, batch=self.batch,
                part=part, write=lambda: self.write(part, table),
            )  # fmt: skip
        result.jvm = launching_jvm()
        yield result_batch(result)

    def write(self, part: int, table: pa.Table) -> PartResult:
        staged = kind_of(self.sink).path is Path.FILES
        name = part_sink_name(self.pipeline, self.sink.name, part)
        writer = make_writer(self.sink, sink_name=name, staged=staged)
        dead = (
            None
            if self.sink.dead_letter is None
            else make_writer(self.sink.dead_letter, sink_name=f"{name}.dead")
        )
        try:
            return write_part(
                table,
                part=part,
                sink=self.sink.name,
                writer=writer,
                dead_writer=dead,
                policy=self.policy,
                run=self.run,
                batch=self.batch,
                resume=self.resume.get(part),
                skip=self.skip,
                step=self.step,
            )
        finally:
            for w in (writer, dead):
                if w is not None:
                    with contextlib.suppress(Exception):  # the data is already acknowledged
                        w.close()


def launching_jvm(pid: int | None = None) -> str:
    """The main class of the JVM this Python worker descends from (Linux ``/proc``; ``""`` if unknown)."""
    pid = os.getpid() if pid is None else pid
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return ""
        if argv and argv[0].endswith("java"):
            mains = [a for a in argv if a.startswith("org.apache.spark.")]
            return mains[-1].rsplit(".", 1)[-1] if mains else "java"
        if parent <= 1:
            return ""
        pid = parent
    return ""


def result_batch(result: PartResult) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([asdict(result)], schema=RESULT_SCHEMA)


def results_of(rows: Sequence[Any]) -> list[PartResult]:
    """The tasks' result rows (Spark ``Row``s), as results in part order."""
    out = [PartResult(**(r.asDict() if hasattr(r, "asDict") else dict(r))) for r in rows]
    return sorted(out, key=lambda r: r.part)


def prepare(df: Any, path: Path, parallelism: int) -> Any:
    """The batch split as a sink of ``path`` needs it (see the module docstring)."""
    if path is Path.FILES:
        return df
    from pyspark.sql import functions as F

    order = ["offset", SEQ] if "offset" in df.columns else [SEQ]
    return (
        df.withColumn(SEQ, F.monotonically_increasing_id())
        .repartition(parallelism, df["key"] if "key" in df.columns else SEQ)
        .sortWithinPartitions(*order)
    )


def default_parallelism(df: Any, one_part: bool) -> int:
    """Tasks per batch for ordered sinks: the cluster's cores (Spark's default parallelism) — or
    one for a kind written as one part (:attr:`~sluiceway.pipeline.sinks.kinds.SinkKind.one_part`)."""
    if one_part:
        return 1
    try:
        return max(1, int(df.sparkSession.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext on the client
        return 4


def write_parquet(df: Any, plan: TaskPlan, path: str) -> list[PartResult]:
    """The batch through Spark's own Parquet writer into ``<path>/.staging/<run>-<batch>``, then
    its files put in place by name (``part-<run>-<batch>-pNNNN.parquet``), in part order.

    Retried whole with the sink's backoff; rows and offsets are read from the files' footers, so
    nothing but file names and footers reaches the driver. Returns one result per file.
    """
    from pyspark.sql import functions as F

    if plan.skip and "offset" in df.columns:
        df = df.filter(~F.col("offset").isin(list(plan.skip)))
    run_dir = os.path.join(path, ".staging", f"{plan.run}-{plan.batch:010d}")

    def spark_write(lo: int, hi: int) -> None:
        try:
            df.write.mode("overwrite").parquet(run_dir)
        except Exception as exc:
            # A full disk, a directory Spark may not write to: waited out for ``retry.outage``
            # (a full disk) or stopped at once, in one line naming the place, not a JVM trace.
            fault = file_system_fault(exc, run_dir)
            if fault is None:
                raise
            raise fault from exc

    write = reaching(spark_write, plan.policy, time.sleep, time.monotonic, f"sink {plan.sink.name}")
    delays = backoff_delays(plan.policy.attempts, plan.policy.backoff, plan.policy.max_backoff)
    for _ in range(plan.policy.attempts):
        try:
            write(0, 1)
            break
        except DestinationUnreachable as exc:
            return [PartResult(0, error=str(exc))]
        except Exception as exc:  # retried whole; the last error stops the sink at the batch's start
            delay = next(delays, None)
            if delay is None:
                if from_python_worker(exc):
                    raise  # the handler says why in one line and keeps the whole text
                return [PartResult(0, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")]
            time.sleep(delay)
    results = []
    files = sorted(f for f in os.listdir(run_dir) if f.endswith(".parquet"))
    for index, name in enumerate(files):
        results.append(file_result(index, os.path.join(run_dir, name)))
        final = f"part-{plan.run}-{plan.batch:010d}-p{index:04d}.parquet"
        os.replace(os.path.join(run_dir, name), os.path.join(path, final))
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def file_result(index: int, path: str) -> PartResult:
    """A Parquet file Spark wrote, as a part's result: its rows and its last offset, read from
    the footer (the data itself never reaches the driver)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    rows, last = meta.num_rows, None
    column = meta.schema.names.index("offset") if "offset" in meta.schema.names else None
    for group in range(meta.num_row_groups) if column is not None else ():
        stats = meta.row_group(group).column(column).statistics
        if stats is not None and stats.has_min_max:
            last = stats.max if last is None else max(last, stats.max)
    return PartResult(index, rows=rows, todo=rows, written=rows, last_offset=last, by_spark=True)


def commit_files(path: str, results: Sequence[PartResult]) -> int:
    """Put staged files in place in part order, up to and including the first failed part's
    written prefix; the rest are removed (a replay writes them again). Returns files committed."""
    staging = os.path.join(path, ".staging")
    committed = 0
    stopped = False
    for result in results:
        for name in result.staged:
            source = os.path.join(staging, name)
            if stopped:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(source)
                continue
            os.replace(source, os.path.join(path, name))
            committed += 1
        if not result.ok:
            stopped = True
    return committed
