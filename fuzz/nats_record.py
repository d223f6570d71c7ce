"""Fuzz target: the NATS source's record mapping (``from_nats``, ``message_row``, the Arrow batch).

The input describes one stored JetStream message as nats-py presents it: the headers (a
``str`` mapping, or none), the payload, the subject, the stream sequence (JetStream's is an
unsigned 64-bit number) and the stored time. Contract: a valid record batch, or
:class:`~sluiceway.pipeline.errors.SourceError`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import atheris

from sluiceway.brokers.message import KEY_HEADER, TOMBSTONE_HEADER
from sluiceway.brokers.nats import from_nats
from sluiceway.pipeline.errors import SourceError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import message_row, record_batch

MAX_LEN = 2048

#: Names the mapping treats specially, offered to the fuzzer alongside arbitrary ones.
_NAMES = (KEY_HEADER, TOMBSTONE_HEADER, "Nats-Msg-Id", "Nats-Expected-Stream", "Nats-Other", "h")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fuzz_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    headers: dict[str, str] | None = None
    if fdp.ConsumeBool():
        headers = {}
        for _ in range(fdp.ConsumeIntInRange(0, 6)):
            name = (
                fdp.PickValueInList(list(_NAMES))
                if fdp.ConsumeBool()
                else fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 16))
            )
            headers[name] = (
                fdp.PickValueInList(["true", "false", ""])
                if fdp.ConsumeBool()
                else (fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 32)))
            )
    payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 128))
    subject = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 32))
    sequence = fdp.ConsumeIntInRange(0, 2**64 - 1)
    # nats-py parses the stored time into an aware datetime: any instant datetime can hold.
    stored = _EPOCH + timedelta(
        microseconds=fdp.ConsumeIntInRange(-62135596800 * 10**6, 253402300799 * 10**6)
    )
    try:
        row = message_row(sequence, subject, from_nats(headers, payload), stored)
        batch = record_batch([row])
    except SourceError:
        return
    batch.validate(full=True)
    assert batch.schema == RECORD_SCHEMA and batch.num_rows == 1


def seeds() -> dict[str, bytes]:
    return {
        "keyed": b"\x01\x02\x01\x00order-1\x01\x00\x00{}orders.created" + bytes(16),
        "tombstone": b"\x01\x01\x01\x01\x01\x00" + bytes(24),
        "no-headers": b"\x00payload" + b"\xff" * 24,
    }
