"""The assembler on hand-built slot output: ranges and positions, batch limits at transaction
boundaries, key changes, TOAST, and the copy's chunk windows (which copied rows the stream has
already outdated, and where a batch may end)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pytest

from sluiceway.cdc.assemble import Assembly, assemble
from sluiceway.cdc.model import Chunk, Snapshot, TableInfo
from sluiceway.cdc.pgoutput import UNCHANGED
from sluiceway.cdc.values import PgType
from sluiceway.cdc.watermark import Watermark
from sluiceway.errors import InvariantViolation
from tests.support import pgoutput as pg

PREFIX = "sluice-cdc:s"
ORDERS = pg.relation(1, "public", "orders", [("id", 20, True), ("v", 23, False), ("body", 25, False)])
OTHER = pg.relation(2, "public", "other", [("id", 20, True)])
TABLES = {"public.orders": TableInfo(("id",))}


def types(oids: Iterable[int]) -> Mapping[int, PgType]:
    from sluiceway.cdc.values import resolve

    return {oid: resolve(oid, {}) for oid in oids}


def run(stream: pg.Stream, start: int = 0, chunks: Mapping[int, Chunk] | None = None, **kw: Any) -> Assembly:
    return assemble(
        stream.rows,
        start=start,
        prefix=PREFIX,
        tables=kw.pop("tables", TABLES),
        types=types,
        chunks=lambda cid: (chunks or {}).get(cid),
        **kw,
    )


def rows(asm: Assembly) -> list[tuple[str, str | None, Any]]:
    return [
        (r["op"], r["key"], None if r["value"] is None else json.loads(r["value"]))
        for r in asm.batch.to_pylist()
    ]


def offsets(asm: Assembly) -> list[int]:
    return list(asm.batch.column("offset").to_pylist())


def headers(asm: Assembly) -> list[list[tuple[str, str]]]:
    return [[(h["key"], h["value"]) for h in r] for r in asm.batch.column("headers").to_pylist()]


def test_transactions_after_start_become_records_at_their_commit_position() -> None:
    s = pg.Stream()
    first = s.transaction(pg.insert(1, ["1", "0", "a"]), relations=[ORDERS])
    second = s.transaction(pg.update(1, ["1", "1", "b"]), pg.delete(1, ["2", None, None]))
    asm = run(s, start=first)
    assert rows(asm) == [("update", "1", {"id": 1, "v": 1, "body": "b"}), ("delete", "2", None)]
    assert offsets(asm) == [second, second] and asm.end == second
    assert [k for k, _ in headers(asm)[0]] == ["pg.lsn", "pg.xid", "sluice.mode"]
    assert headers(asm)[0][2] == ("sluice.mode", "sync")


def test_other_tables_move_the_position_but_make_no_records() -> None:
    s = pg.Stream()
    end = s.transaction(pg.insert(2, ["5"]), relations=[OTHER])
    asm = run(s)
    assert asm.records == 0 and asm.end == end


def test_a_batch_ends_at_a_transaction_boundary_once_the_limit_is_reached() -> None:
    s = pg.Stream()
    first = s.transaction(*[pg.insert(1, [str(i), "0", "x"]) for i in range(3)], relations=[ORDERS])
    s.transaction(pg.insert(1, ["9", "0", "x"]))
    asm = run(s, limit=2)
    assert asm.records == 3 and asm.end == first  # a transaction is never split


def test_a_changed_key_deletes_the_old_key() -> None:
    s = pg.Stream()
    s.transaction(pg.update(1, ["2", "0", "x"], old=["1", None, None], kind="K"), relations=[ORDERS])
    assert [(op, key) for op, key, _ in rows(run(s))] == [("delete", "1"), ("update", "2")]


def test_unchanged_toast_is_filled_from_a_full_old_row_and_named_otherwise() -> None:
    s = pg.Stream()
    s.transaction(
        pg.update(1, ["1", "2", UNCHANGED], old=["1", "1", "big"], kind="O"),
        pg.update(1, ["3", "2", UNCHANGED]),
        relations=[ORDERS],
    )
    asm = run(s)
    assert rows(asm)[0][2] == {"id": 1, "v": 2, "body": "big"}
    assert rows(asm)[1][2] == {"id": 3, "v": 2}
    assert ("pg.unchanged-toast", "body") in headers(asm)[1]


def chunk(cid: int, snapshot: str, *keys: str) -> Chunk:
    values = [json.dumps({"id": int(k), "v": 0, "body": "copied"}).encode() for k in keys]
    return Chunk(
        cid, "public.orders", Snapshot.parse(snapshot), 0, pa.array(keys, pa.string()), pa.array(values)
    )


def test_copied_rows_arrive_at_h_less_the_keys_an_unseen_transaction_changed() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    s.transaction(pg.update(1, ["1", "5", "seen"]), xid=801)  # visible to the chunk's snapshot
    s.transaction(pg.update(1, ["2", "6", "unseen"]), xid=805)  # committed after the snapshot
    h = s.watermark(PREFIX, "H 1")
    s.transaction(pg.update(1, ["3", "7", "later"]), xid=806)  # after H: comes after the rows
    asm = run(s, chunks={1: chunk(1, "800:803:", "1", "2", "3")})
    assert [(op, key, (v or {}).get("body")) for op, key, v in rows(asm)] == [
        ("update", "1", "seen"),
        ("update", "2", "unseen"),
        ("insert", "1", "copied"),  # the copy already holds the seen change: kept
        ("insert", "3", "copied"),
        ("update", "3", "later"),
    ]
    assert offsets(asm)[2] == offsets(asm)[3] == h
    modes = [v for hs in headers(asm) for k, v in hs if k == "sluice.mode"]
    assert modes == ["sync", "sync", "copy", "copy", "sync"]


def test_a_transaction_invisible_to_the_snapshot_yet_before_l_is_caught_by_its_xid() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    # Committed in the WAL just before L, but still running when the chunk's snapshot was taken.
    s.transaction(pg.update(1, ["1", "9", "raced"]), xid=802)
    s.watermark(PREFIX, "L 1 public.orders")
    s.watermark(PREFIX, "H 1")
    asm = run(s, chunks={1: chunk(1, "800:803:802", "1", "2")})
    assert [(key, (v or {}).get("body")) for _, key, v in rows(asm)] == [("1", "raced"), ("2", "copied")]


def test_a_truncate_the_snapshot_missed_drops_every_copied_row_of_its_table() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    s.transaction(pg.truncate(1), xid=900)
    s.watermark(PREFIX, "H 1")
    assert [op for op, _, _ in rows(run(s, chunks={1: chunk(1, "800:803:", "1")}))] == ["truncate"]


def test_a_batch_stops_before_a_window_whose_close_is_not_decoded_yet() -> None:
    s = pg.Stream()
    before = s.transaction(pg.insert(1, ["1", "0", "a"]), relations=[ORDERS])
    s.watermark(PREFIX, "L 4 public.orders")
    s.transaction(pg.insert(1, ["2", "0", "b"]))
    asm = run(s)
    assert asm.pending == 4 and asm.end == before and [k for _, k, _ in rows(asm)] == ["1"]


def test_an_abandoned_window_emits_nothing_and_is_passed() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 4 public.orders")
    s.transaction(pg.insert(1, ["2", "0", "b"]))
    a = s.watermark(PREFIX, "A 4")
    asm = run(s)
    assert asm.pending is None and asm.end == a and [k for _, k, _ in rows(asm)] == ["2"]


def test_the_first_close_in_the_wal_wins() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    s.watermark(PREFIX, "H 1")
    s.watermark(PREFIX, "A 1")  # an abandoner that had not seen the H: too late to matter
    assert [k for _, k, _ in rows(run(s, chunks={1: chunk(1, "800:803:", "7")}))] == ["7"]


def test_a_limit_never_cuts_inside_a_window() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    s.transaction(*[pg.insert(1, [str(i), "0", "x"]) for i in range(10, 15)], xid=900)
    h = s.watermark(PREFIX, "H 1")
    s.transaction(pg.insert(1, ["99", "0", "x"]))
    asm = run(s, limit=2, chunks={1: chunk(1, "800:803:", "1")})
    assert asm.end == h and asm.records == 6


def test_a_close_whose_window_began_before_the_batch_is_an_invariant_violation() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    start = s.transaction(pg.insert(1, ["2", "0", "b"]))
    s.watermark(
        PREFIX, "L 2 public.orders"
    )  # a later chunk's window, so chunk 1's L is decoded but out of range
    s.watermark(PREFIX, "H 2")
    s.watermark(PREFIX, "H 1")
    with pytest.raises(InvariantViolation, match="window began before this batch"):
        run(s, start=start, chunks={1: chunk(1, "800:803:", "1"), 2: chunk(2, "800:803:", "2")})


def test_watermarks_of_other_slots_only_move_the_position() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    other = s.watermark("sluice-cdc:another", "L 1 public.orders")
    asm = run(s)
    assert asm.pending is None and asm.end == other


def test_relations_are_remembered_from_before_the_range() -> None:
    s = pg.Stream()
    start = s.transaction(pg.insert(1, ["1", "0", "a"]), relations=[ORDERS])
    s.transaction(pg.insert(1, ["2", "0", "b"]))  # no relation message: described earlier
    assert [k for _, k, _ in rows(run(s, start=start))] == ["2"]


def test_a_missing_chunk_file_for_a_closed_window_is_loud() -> None:
    s = pg.Stream()
    s.transaction(relations=[ORDERS])
    s.watermark(PREFIX, "L 1 public.orders")
    s.watermark(PREFIX, "H 1")
    with pytest.raises(InvariantViolation, match="its rows are missing"):
        run(s)


@pytest.mark.parametrize(
    ("xid", "seen"), [(799, True), (801, True), (802, False), (803, False), (2**32 - 5, True)]
)
def test_snapshot_visibility_by_32_bit_xid(xid: int, seen: bool) -> None:
    # The snapshot is near the start of epoch 1: a 32-bit xid just below 2**32 is from epoch 0.
    snap = Snapshot.parse(f"{2**32 + 800}:{2**32 + 803}:{2**32 + 802}")
    assert snap.sees(xid) is seen


@pytest.mark.parametrize(
    ("mark", "text"),
    [
        (Watermark.opened(7, "public.orders"), "L 7 public.orders"),
        (Watermark.closed(7), "H 7"),
        (Watermark.abandoned(7), "A 7"),
        (Watermark.completed("public.orders"), "T public.orders"),
        (Watermark.heartbeat(), "P"),
    ],
)
def test_watermarks_keep_their_wire_form_and_parse_back(mark: Watermark, text: str) -> None:
    assert mark.encode() == text  # the form earlier versions wrote: a slot may still hold them
    assert Watermark.parse(text.encode()) == mark


@pytest.mark.parametrize("text", ["X 1", "L one public.t", "L 1", "H", "T"])
def test_a_malformed_watermark_is_an_invariant_violation(text: str) -> None:
    with pytest.raises(InvariantViolation, match="not a copy watermark"):
        Watermark.parse(text)
