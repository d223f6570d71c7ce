"""A pipeline run's metrics without Spark: what one sink's batch outcomes add up to, and the lag
read from its checkpoint and source as ``sluice pipeline status`` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluiceway.journal import Journal
from sluiceway.pipeline import PipelineSpec, SinkFailed
from sluiceway.pipeline.metrics import PipelineMetrics
from sluiceway.pipeline.sinks.handler import BatchSummary, Stopping


class Handler:
    """Stands in for a sink's batch handler: writes a batch's keys unless one is the poison."""

    name = "lake"

    def __init__(self, poison: str = "") -> None:
        self.poison = poison
        self.stopping = False

    def __call__(self, df: list[str], batch_id: int) -> BatchSummary:
        if self.stopping:
            raise Stopping(self.name)
        if self.poison in df:
            raise SinkFailed(self.name, batch_id, "ValueError: refused")
        return BatchSummary(len(df), 0)


def setup(tmp_path: Path, poison: str = "") -> tuple[Any, PipelineMetrics, PipelineSpec]:
    journal = tmp_path / "j"
    with Journal.open(journal, fsync=False) as j, j.append() as tx:
        for i in range(10):
            tx.write(f"k{i}", b"v")
    spec = (
        PipelineSpec.builder("orders")
        .source("journal", path=str(journal))
        .sink("lake", "console")
        .checkpoint(tmp_path / "cp")
        .build()
    )
    metrics = PipelineMetrics(spec)
    return metrics.metered(Handler(poison)), metrics, spec  # type: ignore[arg-type]


def value(metrics: PipelineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pipeline": "orders", "sink": "lake", **labels})


def test_batches_records_and_duration_count_what_the_sink_wrote(tmp_path: Path) -> None:
    metered, metrics, _ = setup(tmp_path)
    metered(["a", "b", "c"], 0)
    metered(["d", "e"], 1)
    assert value(metrics, "sluice_pipeline_batches_total") == 2
    assert value(metrics, "sluice_pipeline_records_total") == 5
    assert value(metrics, "sluice_pipeline_batch_duration_seconds_count") == 2
    assert value(metrics, "sluice_pipeline_failures_total") == 0


def test_a_batch_that_stops_the_sink_is_a_failure_and_a_stop_is_not(tmp_path: Path) -> None:
    metered, metrics, _ = setup(tmp_path, poison="bad")
    with pytest.raises(Exception, match="refused"):
        metered(["a", "bad"], 0)
    assert value(metrics, "sluice_pipeline_failures_total") == 1
    assert value(metrics, "sluice_pipeline_batches_total") == 0
    metered.handler.stopping = True
    with pytest.raises(Stopping):
        metered(["c"], 1)
    assert value(metrics, "sluice_pipeline_failures_total") == 1


def test_lag_is_read_from_the_checkpoint_and_the_source_when_scraped(tmp_path: Path) -> None:
    _, metrics, _ = setup(tmp_path)
    # No batch committed yet: the whole journal (10 records) is ahead of the sink.
    assert value(metrics, "sluice_pipeline_lag") == 10


def test_a_sink_stopped_on_a_failed_batch_is_a_one_until_its_error_is_cleared(tmp_path: Path) -> None:
    from sluiceway.pipeline.state import StateStore

    _, metrics, spec = setup(tmp_path)
    assert value(metrics, "sluice_pipeline_sink_stopped") == 0
    with StateStore(spec.checkpoint_dir("lake")).update() as state:
        state.failed(3, "ValueError: refused", 0)
    assert value(metrics, "sluice_pipeline_sink_stopped") == 1
    with StateStore(spec.checkpoint_dir("lake")).update() as state:
        state.error = None
    assert value(metrics, "sluice_pipeline_sink_stopped") == 0
