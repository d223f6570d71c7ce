"""The table sinks' two ways of writing a batch (see the package docstring): the driver's side
(:func:`write_lake`) and the single task's writer (:class:`LakeWriter`)."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable, PipelineError, file_system_fault, one_line
from sluiceway.pipeline.failures import backoff_delays
from sluiceway.pipeline.sinks.lakehouse.shape import SchemaConflict, lake_rows, mirror_changes
from sluiceway.pipeline.sinks.part import PartResult, batch_of_token

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.distributed import TaskPlan
    from sluiceway.pipeline.sinks.lakehouse.port import LakeTable
    from sluiceway.pipeline.spec import DeltaSinkSpec, IcebergSinkSpec

    LakeSinkSpec = DeltaSinkSpec | IcebergSinkSpec

log = logging.getLogger("sluiceway.pipeline.sink")

#: Failures of a table's store that waiting may cure (a commit race, a catalog or store that is
#: briefly away), by class name across the two libraries and their drivers.
_TRANSIENT = frozenset(
    {
        "CommitFailedError",
        "CommitFailedException",
        "OperationalError",
        "ConnectionError",
        "ConnectError",
        "TimeoutException",
        "ReadTimeout",
        "ServiceUnavailableError",
    }
)


class TableRefused(DestinationUnreachable):
    """A batch the table cannot take as it is (a column's type changed): permanent, and said
    plainly rather than as an unreachable destination."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem, permanent=True)
        PipelineError.__init__(self, f"the table refused the batch: {problem}")


def open_table(spec: LakeSinkSpec) -> LakeTable:
    if spec.type == "delta":
        from sluiceway.pipeline.sinks.lakehouse.delta import DeltaLake

        return DeltaLake(spec.path, storage_options=spec.storage_options, partition_by=spec.partition_by)
    from sluiceway.pipeline.sinks.lakehouse.iceberg import IcebergLake

    return IcebergLake(spec.catalog, spec.table, partition_by=spec.partition_by)


def app_id(sink: str, run: str) -> str:
    """The marker's application id: ``pipeline.sink`` and the checkpoint's life."""
    return f"sluice:{sink}:{run}"


def guarded(what: str, call: Any, *args: Any) -> Any:
    """``call(*args)``, its failures as the sink's: a batch that does not fit → :class:`TableRefused`;
    a full disk, a commit race, a store away → transient; anything else → permanent, named."""
    try:
        return call(*args)
    except DestinationUnreachable:
        raise
    except SchemaConflict as exc:
        raise TableRefused(str(exc)) from None
    except OSError as exc:
        fault = file_system_fault(exc, what)
        raise (fault or DestinationUnreachable(f"{what}: {one_line(exc)}")) from None
    except Exception as exc:
        transient = any(c.__name__ in _TRANSIENT for c in type(exc).__mro__)
        raise DestinationUnreachable(
            f"{what}: {type(exc).__name__}: {one_line(exc)}", permanent=not transient
        ) from None


def native(spec: LakeSinkSpec, staging: str | None) -> bool:
    """Written as files from the executors (see the package docstring)? ``staging``: the
    table's :meth:`~LakeTable.staging_dir`."""
    return (
        spec.mode == "append"
        and spec.columns == "record"
        and staging is not None
        and (spec.type == "delta" or not spec.partition_by)
    )


def where(spec: LakeSinkSpec) -> str:
    return spec.path if spec.type == "delta" else f"iceberg table {spec.table}"


class LakeWriter:
    """A table sink's writer in its one task: the whole part (the batch in offset order) in one
    commit, or none if the marker says the batch is in already."""

    def __init__(self, spec: LakeSinkSpec, sink_name: str) -> None:
        self.spec = spec
        #: ``pipeline.sink`` (the part's suffix off: a table sink's batch is one part).
        self.sink = sink_name.split("#", 1)[0]

    def write(self, table: pa.Table, token: str) -> None:
        run, batch = batch_of_token(token)
        app = app_id(self.sink, run)
        lake = open_table(self.spec)
        done = guarded(where(self.spec), lake.committed, app)
        if done is not None and done >= batch:
            log.info("sink %s: batch %d is in the table already; a replay commits nothing", self.sink, batch)
            return
        guarded(where(self.spec), self._commit, lake, table, app, batch)

    def _commit(self, lake: LakeTable, records: pa.Table, app: str, batch: int) -> None:
        spec = self.spec
        rows = lake_rows(records, spec.columns, lake.schema(), spec.schema_)
        if spec.mode == "mirror":
            changes, truncated = mirror_changes(rows, spec.keys)
            lake.mirror(changes, truncated, spec.keys, app, batch)
        else:
            lake.append(rows, app, batch)

    def close(self) -> None:
        pass


def write_lake(df: Any, plan: TaskPlan, spec: LakeSinkSpec) -> list[PartResult]:
    """One batch into a table sink, exactly once (see the package docstring)."""
    from sluiceway.pipeline.sinks.distributed import RESULT_DDL, prepare, results_of

    if plan.step is not None:
        raise PipelineError(
            f"sink {spec.name!r}: `step` writes record by record, and a table sink commits each batch "
            "whole; run the pipeline instead"
        )
    lake = open_table(spec)
    app = app_id(f"{plan.pipeline}.{spec.name}", plan.run)
    try:
        done = guarded(where(spec), lake.committed, app)
    except DestinationUnreachable as exc:
        return [PartResult(0, error=str(exc))]
    staging = lake.staging_dir()
    if done is not None and done >= plan.batch:
        log.info(
            "sink %s: batch %d is in the table already; its replay commits nothing", spec.name, plan.batch
        )
        if staging is not None:  # what the attempt that died left behind
            shutil.rmtree(os.path.join(staging, f"{plan.run}-{plan.batch:010d}"), ignore_errors=True)
        return [PartResult(0)]
    if native(spec, staging):
        assert staging is not None
        results = _from_executors(df, plan, spec, lake, app, staging)
    else:
        rows = prepare(df, spec.type, 1).mapInArrow(plan, RESULT_DDL).collect()
        results = results_of(rows)
    every = getattr(spec, "optimize_every", 0)
    if every and all(r.ok for r in results) and (plan.batch + 1) % every == 0:
        try:
            guarded(where(spec), lake.optimize)
        except DestinationUnreachable as exc:  # the data is committed; compaction can wait
            log.warning("sink %s: compaction failed: %s", spec.name, exc)
    return results


def _from_executors(
    df: Any, plan: TaskPlan, spec: LakeSinkSpec, lake: LakeTable, app: str, staging: str
) -> list[PartResult]:
    """Spark's Parquet writer into the staging directory, then one commit adding the files."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    from sluiceway.pipeline.sinks.distributed import file_result

    if plan.skip and "offset" in df.columns:
        df = df.filter(~F.col("offset").isin(list(plan.skip)))
    # The batch's columns with their types, partition columns included (Spark leaves those out
    # of the files: their values are in the directory names).
    schema = to_arrow_schema(df.schema, timezone="UTC")
    run_dir = os.path.join(staging, f"{plan.run}-{plan.batch:010d}")
    delays = backoff_delays(plan.policy.attempts, plan.policy.backoff, plan.policy.max_backoff)
    for attempt in itertools.count():
        try:
            if attempt:
                # The last attempt's commit may have landed before its call failed (a lost reply).
                done = guarded(where(spec), lake.committed, app)
                if done is not None and done >= plan.batch:
                    shutil.rmtree(run_dir, ignore_errors=True)
                    return [PartResult(0)]
            df.write.mode("overwrite").partitionBy(*spec.partition_by).parquet(run_dir)
            files = _parquet_files(run_dir)
            # Each attempt's own names: a file a committed version lists is never written over.
            nonce = uuid.uuid4().hex[:8]
            named = [_final_name(f, plan, i, nonce) for i, f in enumerate(files)]
            for old, new in zip(files, named, strict=True):
                if old != new:
                    os.replace(os.path.join(run_dir, old), os.path.join(run_dir, new))
            results = [file_result(i, os.path.join(run_dir, f)) for i, f in enumerate(named)]
            if named:
                guarded(where(spec), lake.add_files, run_dir, named, schema, app, plan.batch)
            shutil.rmtree(run_dir, ignore_errors=True)
            return results
        except Exception as exc:  # retried whole; the last error stops the sink at the batch's start
            delay = next(delays, None)
            permanent = isinstance(exc, DestinationUnreachable) and exc.permanent
            if delay is None or permanent:
                return [
                    PartResult(
                        0,
                        error=str(exc)
                        if isinstance(exc, PipelineError)
                        else f"{type(exc).__name__}: {one_line(exc)}",
                    )
                ]
            time.sleep(delay)
    raise AssertionError("unreachable")


def _parquet_files(root: str) -> list[str]:
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(".parquet"):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def _final_name(relative: str, plan: TaskPlan, index: int, nonce: str) -> str:
    folder = os.path.dirname(relative)
    name = f"part-{plan.run}-{plan.batch:010d}-{nonce}-p{index:04d}.parquet"
    return os.path.join(folder, name) if folder else name
