"""Fuzz target: the Kafka source's record mapping (``_append`` per message, then ``_batch``).

The input describes one consumed message as confluent-kafka presents it: the key and value
(bytes or ``None``), the headers (names are ``str``, values bytes or ``None``), the timestamp
(any 64-bit number of milliseconds: a producer sets it) and the topic. Contract: a valid record
batch, or :class:`~sluiceway.pipeline.errors.SourceError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import atheris

from sluiceway.pipeline.errors import SourceError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.kafka import _append, _batch

MAX_LEN = 2048


@dataclass
class _Message:
    """The part of ``confluent_kafka.Message`` the mapping reads."""

    _key: bytes | None
    _value: bytes | None
    _headers: list[tuple[str, bytes | None]] | None
    _timestamp: tuple[int, int]
    _topic: str

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def topic(self) -> str:
        return self._topic


def _maybe_bytes(fdp: atheris.FuzzedDataProvider) -> bytes | None:
    return None if fdp.ConsumeBool() else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))


def fuzz_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    key, value = _maybe_bytes(fdp), _maybe_bytes(fdp)
    headers = None
    if fdp.ConsumeBool():
        headers = [
            (fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 16)), _maybe_bytes(fdp))
            for _ in range(fdp.ConsumeIntInRange(0, 6))
        ]
    timestamp = (fdp.ConsumeIntInRange(0, 2), fdp.ConsumeIntInRange(-(2**63), 2**63 - 1))
    topic = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 32))
    offset = fdp.ConsumeIntInRange(0, 2**63 - 1)
    cols: dict[str, list[object]] = {name: [] for name in RECORD_SCHEMA.names}
    try:
        _append(cols, _Message(key, value, headers, timestamp, topic), offset)
        batch = _batch(cols)
    except SourceError:
        return
    batch.validate(full=True)
    assert batch.schema == RECORD_SCHEMA and batch.num_rows == 1
    assert batch.column("op")[0].as_py() == ("delete" if value is None else "insert")


def seeds() -> dict[str, bytes]:
    return {
        "plain": b'\x00\x07order-1\x00\x0d{"total": 12}\x01\x01\x02h1\x00\x011' + bytes(16) + b"orders",
        "tombstone": b"\x00\x05key-2\x01\x00" + bytes(8) + b"\x7f" * 8 + b"topic",
        "late": b"\x01\x01" + b"\xff" * 24,
    }
