"""The binlog's assembly (pure): units → records, the copy's chunks placed at their ``H`` without
the keys the window's changes touched, windows never split, values and keys encoded as the
PostgreSQL capture's."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pytest

from sluiceway.cdc.model import Chunk, Snapshot
from sluiceway.cdc.mysql.assemble import Change, Unit, assemble, position, ready, split_position
from sluiceway.cdc.mysql.values import binlog_time, json_value, key_text, row_json
from sluiceway.cdc.watermark import Watermark
from sluiceway.errors import InvariantViolation

NS = "shop.orders"


def txn(pos: int, *changes: Change) -> Unit:
    return Unit(position(1, pos), "binlog.000001", pos, 1_000_000, f"0-1-{pos}", list(changes))


def mark(pos: int, watermark: Watermark) -> Unit:
    return Unit(position(1, pos), "binlog.000001", pos, 1_000_000, mark=watermark)


def ins(key: str, value: int) -> Change:
    return Change(NS, "insert", key, json.dumps({"id": int(key), "v": value}).encode())


def chunk(keys: list[str]) -> Chunk:
    values = [json.dumps({"id": int(k), "v": 0}).encode() for k in keys]
    return Chunk(
        7, NS, Snapshot(0, 0, frozenset()), 5, pa.array(keys, pa.string()), pa.array(values, pa.binary())
    )


def rows(
    units: list[Unit], chunks: dict[int, Chunk] | None = None, **kw: int
) -> list[tuple[str, str | None, int]]:
    batch = assemble(units, (chunks or {}).get, **kw).batch
    return [
        (op, key, value and json.loads(value)["v"])
        for op, key, value in zip(
            batch.column("op").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        )
    ]


def test_a_chunks_rows_take_their_place_at_h_without_the_keys_changed_in_the_window() -> None:
    units = [
        txn(100, ins("1", 1)),
        mark(200, Watermark.opened(7, NS)),
        txn(300, ins("2", 5)),  # a key of the chunk changed in the window: the change wins
        mark(400, Watermark.closed(7)),
        txn(500, ins("3", 9)),  # after H: applied after the chunk's row
    ]
    assert rows(units, {7: chunk(["2", "3", "4"])}) == [
        ("insert", "1", 1), ("insert", "2", 5), ("insert", "3", 0), ("insert", "4", 0), ("insert", "3", 9),
    ]  # fmt: skip


def test_a_truncate_in_the_window_drops_the_chunk_and_an_abandoned_window_has_no_rows() -> None:
    truncate = Change(NS, "truncate", None)
    units = [mark(1, Watermark.opened(7, NS)), txn(2, truncate), mark(3, Watermark.closed(7))]
    assert rows(units, {7: chunk(["1"])}) == [("truncate", None, None)]
    abandoned = [mark(1, Watermark.opened(7, NS)), mark(3, Watermark.abandoned(7))]
    assert rows(abandoned, {7: chunk(["1"])}) == []


def test_an_open_window_holds_back_the_units_from_its_l() -> None:
    units = [txn(1, ins("1", 1)), mark(2, Watermark.opened(7, NS)), txn(3, ins("2", 2))]
    assert ready(units) == 1
    done = assemble(units, {}.get)
    assert (done.units, done.end) == (1, position(1, 1))


def test_a_changed_primary_key_deletes_the_old_key_first() -> None:
    moved = Change(NS, "update", "9", b'{"id":9,"v":3}', b'{"id":2,"v":2}', old_key="2")
    assert rows([txn(1, moved)]) == [("delete", "2", None), ("update", "9", 3)]
    batch = assemble([txn(1, moved)], {}.get).batch
    headers = dict((h["key"], h["value"]) for h in batch.column("headers").to_pylist()[1])
    assert headers["mysql.before"] == '{"id":2,"v":2}' and headers["mysql.gtid"] == "0-1-1"


def test_a_close_without_its_rows_is_an_invariant_violation() -> None:
    with pytest.raises(InvariantViolation, match="rows are missing"):
        assemble([mark(1, Watermark.opened(7, NS)), mark(2, Watermark.closed(7))], {}.get)


def test_limit_stops_at_a_transaction_boundary() -> None:
    units = [txn(1, ins("1", 1), ins("2", 2)), txn(2, ins("3", 3))]
    done = assemble(units, {}.get, limit=1)
    assert done.units == 1 and done.batch.num_rows == 2


def test_positions_order_files_then_offsets() -> None:
    assert position(2, 4) > position(1, 2**31)
    assert split_position(position(42, 1234)) == (42, 1234)


def test_values_and_keys() -> None:
    assert json_value(dt.datetime(2024, 5, 1, 12, 0, 0, 500000)) == '"2024-05-01T12:00:00.5"'
    assert json_value(b"\x00\xff") == '"\\\\x00ff"' and json.loads(json_value(b"\x00\xff")) == "\\x00ff"
    assert json_value(Decimal("1.50")) == "1.50" and json_value(float("nan")) == '"NaN"'
    assert json_value(dt.timedelta(seconds=-5400.25)) == '"-01:30:00.25"'
    assert key_text([5]) == "5" and key_text(['a"b']) == 'a"b' and key_text([1, "x"]) == '[1,"x"]'
    assert row_json(["a", "b"], {"a": 1, "b": None}) == b'{"a":1,"b":null}'
    # python-mysql-replication's -01:30:00.75 is the server's -01:30:00.25
    assert binlog_time(-dt.timedelta(seconds=5400.75)) == -dt.timedelta(seconds=5400.25)
    assert binlog_time(-dt.timedelta(seconds=7)) == -dt.timedelta(seconds=7)
