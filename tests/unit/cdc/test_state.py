"""The copy's state on disk: ``state.json`` round trips, chunk files keep their rows and snapshot,
and a state written by an older version (fewer fields, or unknown ones) still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from sluiceway.cdc.model import Chunk, Snapshot
from sluiceway.cdc.state import CopyState, SourceState, TableCopy


def test_a_missing_state_file_is_a_fresh_copy(tmp_path: Path) -> None:
    assert SourceState(tmp_path / "state").load() == CopyState()


def test_save_then_load_gives_back_the_same_state(tmp_path: Path) -> None:
    store = SourceState(tmp_path / "state")
    state = CopyState(
        next_chunk=4,
        tables={
            "public.orders": TableCopy(last=["17", "b"], rows=1200, chunks=3),
            "public.items": TableCopy(last=None, rows=5, chunks=1, done=True, completed_at=9_000),
        },
        open=3,
        frontier=8_800,
        closes={"1": 8_100, "2": 8_500},
        done_at=None,
    )
    store.save(state)
    assert store.load() == state
    # Saved as plain JSON: the table copies are objects, the chunk ids keys.
    raw = json.loads((tmp_path / "state" / "state.json").read_text())
    assert raw["tables"]["public.orders"]["last"] == ["17", "b"] and raw["closes"] == {"1": 8100, "2": 8500}


def test_a_state_from_an_older_version_loads_with_defaults(tmp_path: Path) -> None:
    older = {
        "next_chunk": 2,
        "tables": {"public.orders": {"last": ["5"], "rows": 5, "chunks": 1}},
        "frontier": 700,
        "retired_field": "ignored",  # written by a version that no longer has it
    }
    state = CopyState.from_json(older)
    assert state == CopyState(
        next_chunk=2, tables={"public.orders": TableCopy(last=["5"], rows=5, chunks=1)}, frontier=700
    )
    assert (state.open, state.closes, state.done_at) == (None, {}, None)
    assert state.tables["public.orders"].done is False and state.tables["public.orders"].completed_at is None


def test_a_chunk_written_is_loaded_with_its_rows_snapshot_and_read_time(tmp_path: Path) -> None:
    store = SourceState(tmp_path / "state")
    snapshot = Snapshot(100, 105, frozenset({101, 103}))
    keys = pa.array(["1", "2", "3"])
    values = pa.array(['{"id": 1}', '{"id": 2}', None])  # JSON text, stored as binary
    store.write_chunk(7, "public.orders", snapshot, 1_700_000_000_000_000, keys, values)
    assert store.chunk_path(7).exists()
    assert not store.chunk_path(7).with_suffix(".tmp").exists()
    chunk = store.load_chunk(7)
    assert chunk == Chunk(
        7,
        "public.orders",
        snapshot,
        1_700_000_000_000_000,
        pa.array(["1", "2", "3"], pa.string()),
        pa.array([b'{"id": 1}', b'{"id": 2}', None], pa.binary()),
    )


def test_a_chunk_never_written_loads_as_none(tmp_path: Path) -> None:
    store = SourceState(tmp_path / "state")
    assert store.load_chunk(1) is None
    empty = pa.array([], pa.string())
    store.write_chunk(1, "public.orders", Snapshot(5, 5, frozenset()), 0, empty, pa.array([]))
    assert store.load_chunk(2) is None
    loaded = store.load_chunk(1)
    assert loaded is not None and len(loaded.keys) == 0 and loaded.snapshot == Snapshot(5, 5, frozenset())
