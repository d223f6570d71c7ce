"""``build_records``, the last step of assembly, on hand-built stretches: records in stream order,
a chunk's rows at its ``H``, the copied keys that transactions invisible to the chunk's snapshot
changed left out, truncates in their place. Positions and xids come from a ``pg.Stream`` (laid
out as a WAL lays them out); the decoded changes are given as columns directly."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sluiceway.cdc.columnar import Group
from sluiceway.cdc.model import Chunk, Snapshot, Stretch
from sluiceway.cdc.records import build_records
from sluiceway.cdc.watermark import Watermark
from sluiceway.errors import InvariantViolation
from tests.support import pgoutput as pg

PREFIX = "sluice-cdc:s"
ORDERS = pg.relation(1, "public", "orders", [("id", 20, True), ("v", 23, False)])
NAMESPACES = ["public.orders"]
INS, UPD, DEL = ord("I"), ord("U"), ord("D")  # the message kinds


class Script:
    """A stretch built in stream order: transactions with their changes, truncates and watermarks."""

    def __init__(self) -> None:
        self.wal = pg.Stream()
        self.stretch = Stretch()
        self.ops: list[int] = []
        self.keys: list[str | None] = []
        self.values: list[bytes | None] = []
        self.old_keys: list[str | None] = []

    def txn(self, *changes: tuple[int, str | None, str | None, str | None], truncate: bool = False) -> int:
        """One transaction of ``(kind, key, value, old key)`` changes to orders; its position."""
        messages = [pg.truncate(1)] if truncate else [pg.insert(1, ["0", "0"]) for _ in changes]
        position = self.wal.transaction(*messages, relations=[ORDERS])
        st, t = self.stretch, len(self.stretch.positions)
        st.positions.append(position)
        st.xids.append(self.wal.xid)
        st.times.append(1_000_000 * (t + 1))
        st.first_item.append(len(st.item_seq))
        for kind, key, value, old in changes:
            st.item_group.append(0)
            st.item_row.append(len(self.ops))
            st.item_txn.append(t)
            st.item_seq.append(st.next_seq())
            self.ops.append(kind)
            self.keys.append(key)
            self.values.append(None if value is None else value.encode())
            self.old_keys.append(old)
        if truncate:
            st.truncates.append((st.next_seq(), t, 0))
        st.commit_seq.append(st.next_seq())
        return position

    def mark(self, watermark: Watermark) -> int:
        position = self.wal.watermark(PREFIX, watermark.encode())
        self.stretch.marks.append((self.stretch.next_seq(), position, watermark))
        return position

    def build(self, live: dict[int, Chunk] | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
        group = Group(
            pa.array(self.keys, pa.string()),
            pa.array(self.values, pa.binary()),
            pa.array(self.old_keys, pa.string()),
        )
        batch, completed = build_records(self.stretch, NAMESPACES, [self.ops], [group], live or {})
        return batch.to_pylist(), completed


def chunk(cid: int, snapshot: Snapshot, **rows: str) -> Chunk:
    return Chunk(
        cid,
        "public.orders",
        snapshot,
        5_000_000,
        pa.array(list(rows), pa.string()),
        pa.array([v.encode() for v in rows.values()], pa.binary()),
    )


def brief(records: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None, str]]:
    """(op, key, value, mode) of each record, in order."""
    return [
        (
            r["op"],
            r["key"],
            None if r["value"] is None else r["value"].decode(),
            dict((h["key"], h["value"]) for h in r["headers"])["sluice.mode"],
        )
        for r in records
    ]


def test_changes_come_in_stream_order_with_a_changed_keys_delete_just_before_it() -> None:
    s = Script()
    first = s.txn((INS, "1", "a", None), (INS, "2", "b", None))
    second = s.txn((UPD, "3", "b2", "2"), (DEL, "1", None, None))
    records, completed = s.build()
    assert brief(records) == [
        ("insert", "1", "a", "sync"),
        ("insert", "2", "b", "sync"),
        ("delete", "2", None, "sync"),  # key 2 became 3: the old key is gone first
        ("update", "3", "b2", "sync"),
        ("delete", "1", None, "sync"),
    ]
    assert [r["offset"] for r in records] == [first, first, second, second, second]
    assert completed == {}


def test_a_chunks_rows_come_at_its_h_between_the_changes_around_it() -> None:
    s = Script()
    s.mark(Watermark.opened(1, "public.orders"))
    before = s.txn((INS, "9", "x", None))
    h = s.mark(Watermark.closed(1))
    after = s.txn((UPD, "9", "y", None))
    t = s.mark(Watermark.completed("public.orders"))
    # The snapshot saw the transaction before H (it committed below xmin): nothing is dropped.
    seen_all = Snapshot(s.wal.xid + 10, s.wal.xid + 10, frozenset())
    records, completed = s.build({1: chunk(1, seen_all, **{"1": "c1", "2": "c2"})})
    assert brief(records) == [
        ("insert", "9", "x", "sync"),
        ("insert", "1", "c1", "copy"),
        ("insert", "2", "c2", "copy"),
        ("update", "9", "y", "sync"),
    ]
    assert [r["offset"] for r in records] == [before, h, h, after]
    copied = records[1]
    assert copied["timestamp"].timestamp() == 5.0  # the chunk's read time
    assert completed == {"public.orders": t}


def test_keys_changed_by_a_transaction_the_snapshot_did_not_see_are_dropped_from_the_chunk() -> None:
    s = Script()
    s.mark(Watermark.opened(1, "public.orders"))
    s.txn((UPD, "1", "newer", None))  # committed while the chunk was read, invisible to it
    invisible = s.wal.xid
    s.txn((UPD, "4", "k4", "2"))  # moved key 2 to 4: both keys are the stream's now
    moved = s.wal.xid
    s.txn((UPD, "3", "seen", None))  # visible to the snapshot: the chunk's row 3 is as new
    visible = s.wal.xid
    s.mark(Watermark.closed(1))
    s.txn((UPD, "5", "late", None))  # after H: not the chunk's business
    snapshot = Snapshot(invisible, visible + 1, frozenset({invisible, moved}))
    assert snapshot.sees(visible) and not snapshot.sees(invisible) and not snapshot.sees(moved)
    records, _ = s.build({1: chunk(1, snapshot, **{"1": "old", "2": "old", "3": "c3", "5": "c5"})})
    copied = [(op, key, value) for op, key, value, mode in brief(records) if mode == "copy"]
    assert copied == [("insert", "3", "c3"), ("insert", "5", "c5")]


def test_a_truncate_before_h_by_an_invisible_transaction_drops_the_whole_chunk() -> None:
    s = Script()
    s.mark(Watermark.opened(1, "public.orders"))
    s.txn((INS, "7", "a", None))
    s.txn(truncate=True)
    truncated = s.stretch.positions[-1]
    s.mark(Watermark.closed(1))
    s.txn((INS, "8", "b", None))
    snapshot = Snapshot(1, 2, frozenset())  # saw none of these transactions
    records, _ = s.build({1: chunk(1, snapshot, **{"1": "c1"})})
    assert brief(records) == [
        ("insert", "7", "a", "sync"),
        ("truncate", None, None, "sync"),
        ("insert", "8", "b", "sync"),
    ]
    assert records[1]["offset"] == truncated and records[1]["namespace"] == "public.orders"


def test_a_chunk_that_closes_without_its_open_in_the_stretch_is_an_invariant_violation() -> None:
    s = Script()
    s.txn((INS, "1", "a", None))
    s.mark(Watermark.closed(1))
    with pytest.raises(InvariantViolation, match="chunk 1 closes"):
        s.build({1: chunk(1, Snapshot(1, 1, frozenset()), **{"1": "c"})})


def test_a_chunk_not_live_adds_no_rows() -> None:
    s = Script()
    s.mark(Watermark.opened(1, "public.orders"))
    s.mark(Watermark.closed(1))  # its rows already went out (the chunk file is gone)
    s.txn((INS, "1", "a", None))
    records, _ = s.build({})
    assert brief(records) == [("insert", "1", "a", "sync")]
