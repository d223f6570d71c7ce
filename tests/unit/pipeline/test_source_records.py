"""The broker sources' record mapping, without a broker: what a message becomes as a record row.

Each case was found by fuzzing the mapping (fuzz/kafka_record.py, nats_record.py,
redis_record.py): a value any producer may write escaped the mapping as OverflowError.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from sluiceway.brokers.nats import from_nats
from sluiceway.pipeline.errors import SourceError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import message_row, record_batch
from sluiceway.pipeline.sources.kafka import _append, _batch
from sluiceway.pipeline.sources.redis import entry_row


class KafkaMessage:
    """What ``_append`` reads of a ``confluent_kafka.Message``."""

    def __init__(self, timestamp_ms: int, value: bytes | None = b"v") -> None:
        self.timestamp_ms, self._value = timestamp_ms, value

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return [("h", b"1"), ("none", None)]

    def timestamp(self) -> tuple[int, int]:
        return 1, self.timestamp_ms

    def topic(self) -> str:
        return "orders"


def kafka_batch(timestamp_ms: int) -> pa.RecordBatch:
    cols: dict[str, list[object]] = {name: [] for name in RECORD_SCHEMA.names}
    _append(cols, KafkaMessage(timestamp_ms), 41)
    return _batch(cols)


def micros(batch: pa.RecordBatch) -> int | None:
    """The timestamp as stored (a datetime cannot hold the latest ones)."""
    value: int | None = batch.column("timestamp").cast(pa.int64())[0].as_py()
    return value


def test_a_kafka_timestamp_past_what_microseconds_hold_reads_as_none() -> None:
    latest = (2**63 - 1) // 1000
    assert micros(kafka_batch(latest)) == latest * 1000
    assert micros(kafka_batch(latest + 1)) is None  # was OverflowError (1000 times it is past 2^63)
    assert micros(kafka_batch(-1)) is None  # no timestamp given, as before
    row = kafka_batch(1_700_000_000_000).to_pylist()[0]
    assert row["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert row["headers"] == [{"key": "h", "value": "1"}, {"key": "none", "value": None}]


def test_a_nats_sequence_past_a_record_offset_is_a_source_error() -> None:
    decoded = from_nats({"Sluice-Key": "k"}, b"v")
    stored = datetime(2026, 1, 1, tzinfo=UTC)
    assert record_batch([message_row(2**63 - 1, "orders", decoded, stored)]).num_rows == 1
    with pytest.raises(SourceError, match="position 9223372036854775808 does not fit"):  # was OverflowError
        message_row(2**63, "orders", decoded, stored)


@pytest.mark.parametrize(
    ("entry_id", "fragment"),
    [
        (b"8--37002603700206037002030", "is not a stream entry id"),  # was OverflowError
        (b"-5-1", "is not a stream entry id"),
        (b"18446744073709551615-0", "does not fit a 63-bit offset"),  # XADD takes it; was ValueError
        (b"\xff-1", "codec can't decode"),
    ],
)
def test_a_redis_entry_id_that_is_no_offset_is_a_source_error(entry_id: bytes, fragment: str) -> None:
    with pytest.raises(SourceError, match=fragment):
        entry_row("orders", entry_id, [b"key", b"k"])


def test_a_redis_entry_maps_to_a_record_row() -> None:
    row = entry_row("orders", b"1700000000000-3", [b"key", b"k", b"value", b"v", b"header:h", b"1"])
    assert (row["offset"], row["key"], row["value"], row["headers"]) == (
        1700000000000 << 20 | 3,
        "k",
        b"v",
        [{"key": "h", "value": "1"}],
    )
    assert row["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
