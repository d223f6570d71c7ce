"""The per-sink batch handler without Spark: order, resume after a failure, skip, step, replays."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sluiceway.journal import Journal
from sluiceway.pipeline import PipelineSpec, Record, SinkFailed, StepPaused
from sluiceway.pipeline.operator import skip
from sluiceway.pipeline.record import records_to_arrow
from sluiceway.pipeline.sinks.handler import BatchHandler, Stopping
from sluiceway.pipeline.state import StateStore


class FakeWriter:
    def __init__(self, poison: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.poison = set(poison)
        self.rows: list[tuple[int, str]] = []
        self.tokens: list[str] = []

    def write(self, table: pa.Table, token: str) -> None:
        keys = table.column("key").to_pylist()
        if self.poison & set(keys):
            raise ValueError(f"refused {sorted(self.poison & set(keys))}")
        self.rows.extend(zip(table.column("offset").to_pylist(), keys, strict=True))
        self.tokens.append(token)

    def close(self) -> None:
        pass


def make(
    tmp_path: Path, poison: set[str] = frozenset(), dead: bool = False
) -> tuple[BatchHandler, FakeWriter, FakeWriter, PipelineSpec]:  # type: ignore[assignment]
    sink: dict[str, Any] = {"retry": {"attempts": 2, "backoff": 0, "record_attempts": 1}}
    if dead:
        sink["dead_letter"] = {"type": "console"}
    spec = (
        PipelineSpec.builder("p")
        .source("journal", path=str(tmp_path / "j"))
        .sink("s", "console", **sink)
        .checkpoint(tmp_path)
        .build()
    )
    handler = BatchHandler("p", spec.sinks[0], str(spec.checkpoint_dir("s")))
    writer, dlq = FakeWriter(poison), FakeWriter()
    handler._writer = writer
    handler._dead = dlq
    return handler, writer, dlq, spec


def batch(*pairs: tuple[int, str]) -> pa.Table:
    return pa.Table.from_batches([records_to_arrow([Record(offset=o, key=k, value=b"v") for o, k in pairs])])


def test_records_are_written_in_offset_order(tmp_path: Path) -> None:
    handler, writer, _, _ = make(tmp_path)
    handler.write_here(batch((5, "a"), (3, "b"), (4, "a"), (3, "c")), 0)
    assert writer.rows == [(3, "b"), (3, "c"), (4, "a"), (5, "a")]  # stable: b before c at offset 3


def test_a_replayed_batch_that_was_written_is_skipped(tmp_path: Path) -> None:
    handler, writer, _, _ = make(tmp_path)
    handler.write_here(batch((1, "a"), (2, "b")), 7)
    handler.write_here(batch((1, "a"), (2, "b")), 7)  # Spark replays batch 7 after a crash
    assert writer.rows == [(1, "a"), (2, "b")]
    handler.write_here(batch((3, "a")), 8)
    assert writer.rows[-1] == (3, "a")


def test_failure_stops_at_the_bad_record_and_a_replay_resumes_after_the_good_ones(tmp_path: Path) -> None:
    handler, writer, _, spec = make(tmp_path, poison={"bad"})
    rows = batch((10, "a"), (11, "b"), (12, "bad"), (13, "c"))
    with pytest.raises(SinkFailed) as info:
        handler.write_here(rows, 3, sleep=lambda s: None)
    assert (info.value.sink, info.value.offset, info.value.last_good) == ("s", 12, 11)
    assert writer.rows == [(10, "a"), (11, "b")]
    state = StateStore(spec.checkpoint_dir("s")).load()
    assert state.error is not None and state.error["offset"] == 12 and state.last_offset == 11

    writer.rows.clear()
    with pytest.raises(SinkFailed):  # still poisoned: fails again without rewriting 10 and 11
        handler.write_here(rows, 3, sleep=lambda s: None)
    assert writer.rows == []

    with Journal.open(tmp_path / "j", fsync=False) as j, j.append() as tx:
        for i in range(14):  # the source holds offset 12 (skip refuses offsets it does not hold)
            tx.write(f"k{i}", b"v", namespace="n")
    skip(spec, "s", 12)  # the operator marks it done
    handler.write_here(rows, 3, sleep=lambda s: None)
    assert writer.rows == [(13, "c")]
    assert StateStore(spec.checkpoint_dir("s")).load().error is None


def test_dead_letter_sink_gets_the_record_with_the_reason(tmp_path: Path) -> None:
    handler, writer, dlq, _ = make(tmp_path, poison={"bad"}, dead=True)
    handler.write_here(batch((1, "a"), (2, "bad"), (3, "c")), 0, sleep=lambda s: None)
    assert writer.rows == [(1, "a"), (3, "c")]
    assert dlq.rows == [(2, "bad")]
    assert StateStore(handler.checkpoint_dir).load().dead_lettered == 1


def test_step_writes_one_record_then_pauses(tmp_path: Path) -> None:
    handler, writer, _, spec = make(tmp_path)
    store = StateStore(spec.checkpoint_dir("s"))
    with store.update() as st:
        st.step = 1
    rows = batch((1, "a"), (2, "b"), (3, "c"))
    with pytest.raises(StepPaused):
        handler.write_here(rows, 0)
    assert writer.rows == [(1, "a")]
    with pytest.raises(StepPaused):  # budget spent: the next attempt writes nothing
        handler.write_here(rows, 0)
    assert writer.rows == [(1, "a")]
    with store.update() as st:
        st.step = None
    handler.write_here(rows, 0)  # a normal run resumes after the stepped record
    assert writer.rows == [(1, "a"), (2, "b"), (3, "c")]


def test_tokens_are_deterministic_per_batch_and_slice(tmp_path: Path) -> None:
    handler, writer, _, spec = make(tmp_path)
    handler.write_here(batch((1, "a"), (2, "b")), 4)
    run = StateStore(spec.checkpoint_dir("s")).load().run
    assert writer.tokens == [f"{run}-0000000004-00000000-2"]


def test_stopping_refuses_new_batches(tmp_path: Path) -> None:
    handler, writer, _, _ = make(tmp_path)
    handler.stopping = threading.Event()
    handler.stopping.set()
    with pytest.raises(Stopping):
        handler(object(), 0)
    assert writer.rows == []


def test_one_runs_stop_does_not_stop_another(tmp_path: Path) -> None:
    stopped, running = make(tmp_path / "a"), make(tmp_path / "b")
    stopped[0].stopping, running[0].stopping = threading.Event(), threading.Event()
    stopped[0].stopping.set()
    with pytest.raises(Stopping):
        stopped[0](object(), 0)
    assert running[0].stopping is not None and not running[0].stopping.is_set()
    assert "stopping" not in {k for k, v in running[0].__getstate__().items() if v is not None}


def test_sink_states_read_as_their_words() -> None:
    """The states are enums, but JSON and text output show the same words as before."""
    import json

    from sluiceway.pipeline.state import RunState, SinkHealth

    dumped = json.dumps({"a": RunState.FAILED, "b": SinkHealth.IN_FLIGHT})
    assert dumped == '{"a": "failed", "b": "in-flight"}'
    assert f"{RunState.PAUSED}" == "paused" and RunState.FINISHED == "finished"
