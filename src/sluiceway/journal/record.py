"""The record type readers get back, and the Arrow schema of the bulk reader."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import pyarrow as pa

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Schema of the batches yielded by :meth:`Journal.read_arrow` (the pipeline's common record shape).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64()),
        pa.field("namespace", pa.string()),
        pa.field("op", pa.string()),
        pa.field("key", pa.string()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.string())]))
        ),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

#: A record's ``op`` where it is not implied (the journal stores no op column): its first header.
#: Written by the CDC capture; restored by the pipeline's journal source.
OP_HEADER = "sluice.op"


class Record(NamedTuple):
    """One committed journal record.

    ``value`` is ``None`` for a tombstone. ``timestamp_us`` is microseconds since the Unix
    epoch; :attr:`timestamp` gives the same instant as an aware UTC ``datetime``.
    """

    offset: int
    namespace: str
    key: str
    value: bytes | None
    headers: list[tuple[str, str]]
    timestamp_us: int

    @property
    def timestamp(self) -> datetime:
        # Built on demand: most consumers never look at it, and a datetime per record is not free.
        return EPOCH + timedelta(microseconds=self.timestamp_us)
