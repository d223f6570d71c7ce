"""A pipeline run's metrics without Spark: what one sink's batch outcomes add up to, and the lag
read from its checkpoint and source as ``sluice pipeline status`` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluiceway.journal import Journal
from sluiceway.pipeline import PipelineSpec, Record
from sluiceway.pipeline.metrics import PipelineMetrics
from sluiceway.pipeline.record import records_to_arrow
from sluiceway.pipeline.sinks.handler import BatchHandler, Stopping


class Writer:
    def __init__(self, poison: str = "") -> None:
        self.poison = poison

    def write(self, table: pa.Table, token: str) -> None:
        if self.poison in table.column("key").to_pylist():
            raise ValueError("refused")

    def close(self) -> None:
        pass


class Frame:
    """What Spark hands ``foreachBatch``: a DataFrame that turns into Arrow."""

    def __init__(self, *keys: str, start: int = 0) -> None:
        records = [Record(offset=start + i, key=k, value=b"v") for i, k in enumerate(keys)]
        self.table = pa.Table.from_batches([records_to_arrow(records)])

    def toArrow(self) -> pa.Table:  # Spark's name
        return self.table


def setup(tmp_path: Path, poison: str = "") -> tuple[Any, PipelineMetrics, PipelineSpec]:
    journal = tmp_path / "j"
    with Journal.open(journal, fsync=False) as j, j.append() as tx:
        for i in range(10):
            tx.write(f"k{i}", b"v")
    spec = (
        PipelineSpec.builder("orders")
        .source("journal", path=str(journal))
        .sink("lake", "console", retry={"attempts": 1, "backoff": 0, "record_attempts": 1})
        .checkpoint(tmp_path / "cp")
        .build()
    )
    handler = BatchHandler("orders", spec.sinks[0], str(spec.checkpoint_dir("lake")))
    handler._writer = Writer(poison)
    metrics = PipelineMetrics(spec)
    return metrics.metered(handler), metrics, spec


def value(metrics: PipelineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pipeline": "orders", "sink": "lake", **labels})


def test_batches_records_and_duration_count_what_the_sink_wrote(tmp_path: Path) -> None:
    metered, metrics, _ = setup(tmp_path)
    metered(Frame("a", "b", "c"), 0)
    metered(Frame("d", "e", start=3), 1)
    assert value(metrics, "sluice_pipeline_batches_total") == 2
    assert value(metrics, "sluice_pipeline_records_total") == 5
    assert value(metrics, "sluice_pipeline_batch_duration_seconds_count") == 2
    assert value(metrics, "sluice_pipeline_failures_total") == 0


def test_a_batch_that_stops_the_sink_is_a_failure_and_a_stop_is_not(tmp_path: Path) -> None:
    metered, metrics, _ = setup(tmp_path, poison="bad")
    with pytest.raises(Exception, match="refused"):
        metered(Frame("a", "bad"), 0)
    assert value(metrics, "sluice_pipeline_failures_total") == 1
    assert value(metrics, "sluice_pipeline_batches_total") == 0
    metered.handler.stopping = type("Stopped", (), {"is_set": staticmethod(lambda: True)})()
    with pytest.raises(Stopping):
        metered(Frame("c"), 1)
    assert value(metrics, "sluice_pipeline_failures_total") == 1


def test_lag_is_read_from_the_checkpoint_and_the_source_when_scraped(tmp_path: Path) -> None:
    _, metrics, _ = setup(tmp_path)
    # No batch committed yet: the whole journal (10 records) is ahead of the sink.
    assert value(metrics, "sluice_pipeline_lag") == 10
