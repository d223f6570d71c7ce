"""The outbox record and the checks it must pass before anything is written."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from sluiceway.errors import InvalidRecordError

#: Kafka's own limit on topic names, and the characters it accepts.
MAX_TOPIC_LENGTH = 249
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")

#: goharvest's reference schema: ``kafka_key VARCHAR(100)``, ``kafka_value VARCHAR(10000)``.
DEFAULT_MAX_KEY_LENGTH = 100
DEFAULT_MAX_VALUE_BYTES = 10_000

#: How much of a delivery error a dead letter keeps (the rest of a long error is cut off).
MAX_ERROR_LENGTH = 4000

Header = tuple[str, str]


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """A message to publish: written to the outbox in the caller's transaction.

    ``value=None`` publishes a tombstone. ``headers`` is a list of ``(key, value)`` string pairs.
    ``partition`` (optional column ``kafka_partition``) pins a partition; ``None`` = by key.

    >>> OutboxRecord("orders.created", "order-17", '{"total": 12}', [("source", "shop")]).topic
    'orders.created'
    """

    topic: str
    key: str
    value: str | bytes | None = None
    headers: Sequence[Header] = field(default_factory=list)
    partition: int | None = None


class MarkedRecord(NamedTuple):
    """An outbox row as the harvester claims it (``mark``). A tuple: one is built per row on the
    hot path, and tuples are the cheapest immutable record Python has."""

    id: int
    create_time: datetime | None
    topic: str
    key: str
    value: bytes | None
    headers: tuple[Header, ...]
    leader_id: str | None
    partition: int | None = None


@dataclass(slots=True)
class RecordColumns:
    """Records to publish, column-wise: record ``i`` is ``ids[i]``, ``topics[i]``, ``keys[i]``…,
    all under one ``leader_id``. Made where many records are made at once (``sluice capture``'s
    appends), so a publisher that offers ``send_columns`` sends them with no object per record;
    :meth:`record` gives one as a :class:`MarkedRecord` where it is needed (a failure).
    ``headers`` are lists: confluent-kafka takes nothing else for a message's headers.

    >>> columns = RecordColumns([7], [None], ["t"], ["k"], [b"v"], [[("h", "1")]], "leader")
    >>> len(columns), columns.record(0).headers
    (1, (('h', '1'),))
    """

    ids: list[int]
    create_times: list[datetime | None]
    topics: list[str]
    keys: list[str]
    values: list[bytes | None]
    headers: list[list[Header]]
    leader_id: str | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def record(self, index: int) -> MarkedRecord:
        i = index
        return MarkedRecord(
            self.ids[i],
            self.create_times[i],
            self.topics[i],
            self.keys[i],
            self.values[i],
            tuple(self.headers[i]),
            self.leader_id,
        )

    def records(self) -> list[MarkedRecord]:
        return [self.record(i) for i in range(len(self.ids))]

    def index_of(self, topic: str, key: str, value: bytes | None) -> int:
        """The first record with this topic, key and value (-1 if none): how a Kafka delivery
        report, which carries no headers, is traced back to its record."""
        for i, (t, k, v) in enumerate(zip(self.topics, self.keys, self.values, strict=True)):
            if k == key and v == value and t == topic:
                return i
        return -1


def validate_record(
    record: OutboxRecord,
    *,
    max_key_length: int = DEFAULT_MAX_KEY_LENGTH,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> bytes | None:
    """Check ``record``; return its value as bytes. Raise :class:`InvalidRecordError` naming the field."""
    if not isinstance(record, OutboxRecord):
        raise InvalidRecordError(f"expected an OutboxRecord, got {type(record).__name__}", field="record")
    validate_topic(record.topic)
    key = record.key
    if not isinstance(key, str):
        raise InvalidRecordError(f"must be a string, got {type(key).__name__}", field="key")
    if key == "":
        raise InvalidRecordError(
            "must not be empty (every record needs a key; it decides order)", field="key"
        )
    if len(key) > max_key_length:
        raise InvalidRecordError(f"is {len(key)} characters; the maximum is {max_key_length}", field="key")
    value = record.value
    raw: bytes | None
    if value is None:
        raw = None
    elif isinstance(value, str):
        raw = value.encode("utf-8")
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
    else:
        raise InvalidRecordError(f"must be str, bytes or None, got {type(value).__name__}", field="value")
    if raw is not None and len(raw) > max_value_bytes:
        raise InvalidRecordError(f"is {len(raw)} bytes; the maximum is {max_value_bytes}", field="value")
    if isinstance(record.headers, str | bytes) or not isinstance(record.headers, Sequence):
        raise InvalidRecordError("must be a list of (key, value) string pairs", field="headers")
    for i, header in enumerate(record.headers):
        if (
            not isinstance(header, tuple | list)
            or len(header) != 2
            or not all(isinstance(part, str) for part in header)
        ):
            raise InvalidRecordError(f"item {i} is {header!r}; expected a pair of strings", field="headers")
    if record.partition is not None and (
        isinstance(record.partition, bool) or not isinstance(record.partition, int) or record.partition < -1
    ):
        raise InvalidRecordError(
            f"must be a partition number or None, got {record.partition!r}", field="partition"
        )
    return raw


def validate_topic(topic: object) -> str:
    if not isinstance(topic, str):
        raise InvalidRecordError(f"must be a string, got {type(topic).__name__}", field="topic")
    if not topic:
        raise InvalidRecordError("must not be empty", field="topic")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidRecordError(
            f"is {len(topic)} characters; Kafka allows {MAX_TOPIC_LENGTH}", field="topic"
        )
    if topic in (".", "..") or not _TOPIC.match(topic):
        raise InvalidRecordError(
            f"{topic!r} has characters Kafka rejects; use letters, digits, '.', '_' and '-'", field="topic"
        )
    return topic
