"""A table sink's batch, the driver's side: skipped when the table's marker has it already, then
written as files from the executors and added in one commit, or sent whole to one task whose
writer (:class:`~sluiceway.pipeline.sinks.lakehouse.sink.LakeWriter`) commits it — see
:mod:`~sluiceway.pipeline.sinks.lakehouse` for which and why."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any

from sluiceway.pipeline.errors import DestinationUnreachable, PipelineError, one_line
from sluiceway.pipeline.failures import backoff_delays
from sluiceway.pipeline.sinks.distributed import RESULT_DDL, TaskPlan, file_result, prepare, results_of
from sluiceway.pipeline.sinks.kinds import Path
from sluiceway.pipeline.sinks.lakehouse.sink import app_id, guarded, native, open_table, where
from sluiceway.pipeline.sinks.part import PartResult
from sluiceway.pipeline.spec import DeltaSinkSpec, IcebergSinkSpec

if TYPE_CHECKING:
    from sluiceway.pipeline.sinks.lakehouse.port import LakeTable

    LakeSinkSpec = DeltaSinkSpec | IcebergSinkSpec

log = logging.getLogger("sluiceway.pipeline.sink")


def write_lake(df: Any, plan: TaskPlan) -> list[PartResult]:
    """One batch into the table sink of ``plan``, exactly once (see
    :mod:`~sluiceway.pipeline.sinks.lakehouse`)."""
    spec = plan.sink
    assert isinstance(spec, DeltaSinkSpec | IcebergSinkSpec), spec.type
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
        rows = prepare(df, Path.TABLE, 1).mapInArrow(plan, RESULT_DDL).collect()
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
