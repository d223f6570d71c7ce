"""The capture's broker target (pipelined appends, the durable position) and the message mapping,
on a publisher that acknowledges when the test says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from sluiceway.capture.mapping import INDEX_BITS, TopicMap, to_records
from sluiceway.capture.target import DeliveryFailed, PositionFile, PublishTarget, UndeliverableChange
from sluiceway.harvest.ports import Delivery
from sluiceway.journal.record import ARROW_SCHEMA
from sluiceway.outbox.record import MarkedRecord


class HeldPublisher:
    """Keeps every send until the test acknowledges or fails it."""

    def __init__(self) -> None:
        self.sent: list[tuple[MarkedRecord, Callable[[Delivery], None]]] = []

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        self.sent.append((record, on_done))

    def ack(self, index: int, error: str | None = None, permanent: bool = False) -> None:
        record, on_done = self.sent[index]
        on_done(Delivery(record, error=error, permanent=permanent))

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass


def batch(offset: int, rows: list[tuple[str, str, str | None]]) -> pa.RecordBatch:
    """Changes of one transaction ending at ``offset``: (op, key, after JSON or None)."""
    headers = [
        {"key": "pg.lsn", "value": "0/10"},
        {"key": "pg.xid", "value": "7"},
        {"key": "sluice.mode", "value": "sync"},
    ]
    return pa.RecordBatch.from_pylist(
        [
            {
                "offset": offset, "namespace": "public.orders", "op": op, "key": key,
                "value": None if after is None else after.encode(), "headers": headers,
                "timestamp": datetime(2026, 11, 27, 1, 2, 3, tzinfo=UTC),
            }
            for op, key, after in rows
        ],
        schema=ARROW_SCHEMA,
    )  # fmt: skip


def target(publisher: HeldPublisher, **more: object) -> tuple[PublishTarget, list[int]]:
    durable: list[int] = []
    t = PublishTarget(publisher, TopicMap("cdc.{schema}.{table}"), **more)  # type: ignore[arg-type]
    t.on_durable = durable.append
    return t, durable


def test_an_append_is_durable_only_once_it_and_every_append_before_it_are_acknowledged() -> None:
    pub = HeldPublisher()
    t, durable = target(pub)
    t.append(batch(100, [("insert", "1", '{"id":1}'), ("insert", "2", '{"id":2}')]), 100)
    t.append(batch(200, [("update", "1", '{"id":1}')]), 200)  # sent before the first is acknowledged
    assert len(pub.sent) == 3 and durable == []
    pub.ack(2)  # the second append whole: not durable, the first still waits
    assert durable == []
    pub.ack(0)
    assert durable == []
    pub.ack(1)
    assert durable == [200]  # both at once
    t.append(batch(0, []), 250)  # a quiet position with nothing in flight: durable at once
    assert durable == [200, 250]


def test_a_failed_change_is_never_durable_and_ends_the_next_append() -> None:
    pub = HeldPublisher()
    t, durable = target(pub)
    t.append(batch(100, [("insert", "1", "{}"), ("insert", "2", "{}")]), 100)
    pub.ack(0, error="connection lost")
    pub.ack(1)
    assert durable == []
    with pytest.raises(DeliveryFailed, match="connection lost"):
        t.append(batch(200, [("insert", "3", "{}")]), 200)
    with pytest.raises(DeliveryFailed):
        t.check()


def test_a_permanent_refusal_stops_the_capture_and_leadership_lost_ends_the_term() -> None:
    pub = HeldPublisher()
    t, _ = target(pub)
    t.append(batch(100, [("insert", "1", "{}")]), 100)
    pub.ack(0, error="message too large", permanent=True)
    with pytest.raises(UndeliverableChange, match="never accept"):
        t.check()
    leading = [True]
    t2, _ = target(HeldPublisher(), may_continue=lambda: leading[0])
    t2.append(batch(100, [("insert", "1", "{}")]), 100)
    leading[0] = False
    with pytest.raises(DeliveryFailed, match="leadership"):
        t2.check()


def test_an_append_not_acknowledged_in_time_fails_and_in_flight_is_bounded() -> None:
    pub = HeldPublisher()
    t, _ = target(pub, timeout=0.05, max_in_flight=2)
    t.append(batch(100, [("insert", "1", "{}"), ("insert", "2", "{}")]), 100)
    # A third change does not fit: the append waits for room, and times out on the first append.
    with pytest.raises(DeliveryFailed, match="not acknowledged within"):
        t.append(batch(200, [("insert", "3", "{}")]), 200)
    assert len(pub.sent) == 2


def test_the_durable_position_is_kept_in_the_position_file(tmp_path: Path) -> None:
    pub = HeldPublisher()
    file = PositionFile(tmp_path / "published.lsn")
    t, _ = target(pub, position_file=file)
    assert t.position() is None
    t.append(batch(100, [("insert", "1", "{}")]), 100)
    assert t.position() is None
    pub.ack(0)
    assert t.position() == 100 and file.read() == 100
    (tmp_path / "published.lsn").write_text("nonsense")
    with pytest.raises(Exception, match="does not hold a stream position"):
        file.read()


def test_messages_carry_op_after_source_headers_and_a_sequence_id_per_change() -> None:
    rows = [("insert", "1", '{"id":1}'), ("delete", "2", None), ("truncate", None, None)]
    records = to_records(batch(0x10, rows), TopicMap("cdc.{table}"), leader="l", tombstones=True)
    assert [(r.topic, r.key) for r in records] == [
        ("cdc.orders", "1"),
        ("cdc.orders", "2"),
        ("cdc.orders", "2"),
        ("cdc.orders", ""),
    ]
    first = json.loads(records[0].value or b"")
    assert first == {
        "op": "insert", "before": None, "after": {"id": 1},
        "source": {"table": "public.orders", "lsn": "0/10", "xid": 7,
                   "commit_time": "2026-11-27T01:02:03+00:00", "mode": "sync"},
    }  # fmt: skip
    assert json.loads(records[1].value or b"")["after"] is None
    assert records[2].value is None  # the tombstone after the delete
    ids = [r.id for r in records]
    assert ids == [(0x10 << INDEX_BITS) + i for i in range(4)]
    assert dict(records[0].headers)["sluice.op"] == "insert" and dict(records[0].headers)["sluice-id"] == str(
        ids[0]
    )


def test_the_old_row_sent_whole_becomes_before_and_leaves_the_headers() -> None:
    rows = batch(0x20, [("update", "1", '{"id":1,"n":2}'), ("insert", "2", '{"id":2}')])
    headers = rows.column("headers").to_pylist()
    headers[0] = [*headers[0], {"key": "pg.before", "value": '{"id":1,"n":1}'}]
    index = rows.schema.get_field_index("headers")
    rows = rows.set_column(index, rows.schema.field(index), pa.array(headers, rows.schema.field(index).type))
    update, insert = to_records(rows, TopicMap("t"))
    assert json.loads(update.value or b"")["before"] == {"id": 1, "n": 1}
    assert json.loads(insert.value or b"")["before"] is None
    assert "pg.before" not in dict(update.headers) and dict(update.headers)["pg.xid"] == "7"


def test_a_refused_change_is_recorded_as_the_one_stopped_on_and_skipped_next_term(tmp_path: Path) -> None:
    from sluiceway.capture.refusals import RefusalLog

    log = RefusalLog(tmp_path)
    pub = HeldPublisher()
    t, durable = target(pub, refusals=log)
    t.append(batch(0x30, [("insert", "1", '{"id":1}'), ("insert", "2", '{"id":2}')]), 0x30)
    pub.ack(0)
    pub.ack(1, error="message too large", permanent=True)
    with pytest.raises(UndeliverableChange, match="skip --lsn 0/30"):
        t.check()
    stuck = log.read().stuck
    assert stuck is not None and (stuck.key, stuck.lsn, stuck.index) == ("2", 0x30, 1)
    with pytest.raises(Exception, match="not 0/31"):
        log.skip("0/31")
    assert log.skip("0/30").key == "2" and log.read().stuck is None
    # The next term passes over exactly that change, and forgets the skip once past its transaction.
    pub2 = HeldPublisher()
    t2, durable2 = target(pub2, refusals=log)
    t2.append(batch(0x30, [("insert", "1", '{"id":1}'), ("insert", "2", '{"id":2}')]), 0x30)
    assert [r.key for r, _ in pub2.sent] == ["1"]
    pub2.ack(0)
    assert durable2 == [0x30]
    refusals = log.read()
    assert refusals.skipped == 1 and refusals.skips == [] and durable == []


def test_a_dead_letter_stands_for_the_refused_change_and_a_refused_dead_letter_stops(tmp_path: Path) -> None:
    from sluiceway.capture.refusals import RefusalLog
    from sluiceway.capture.target import DeadLetter
    from sluiceway.testing import wait_until

    log = RefusalLog(tmp_path)
    pub, letters = HeldPublisher(), HeldPublisher()
    t, durable = target(pub, refusals=log, dead_letter=DeadLetter(letters, "dead"))
    t.append(batch(0x40, [("insert", "1", '{"id":1}'), ("insert", "2", '{"id":2}')]), 0x40)
    pub.ack(0, error="too large", permanent=True)
    wait_until(lambda: len(letters.sent) == 1, timeout=5)
    letter = letters.sent[0][0]
    assert (letter.topic, letter.key, dict(letter.headers)["sluice.refusal"]) == ("dead", "1", "too large")
    assert dict(letter.headers)["sluice.topic"] == "cdc.public.orders"
    pub.ack(1)
    assert durable == []  # the dead letter is not acknowledged yet
    letters.ack(0)
    assert durable == [0x40]
    t.check()  # the stream goes on
    assert log.read().dead_lettered == 1 and log.read().stuck is None
    t.append(batch(0x50, [("insert", "3", "{}")]), 0x50)
    pub.ack(2, error="too large", permanent=True)
    wait_until(lambda: len(letters.sent) == 2, timeout=5)
    letters.ack(1, error="dead letters refused as well")
    with pytest.raises(UndeliverableChange, match="dead letter destination refused it too"):
        t.check()
    t.close()
