"""Fuzz target: the Redis stream source's record mapping (``entry_row``, then the Arrow batch).

The input is one ``XRANGE`` entry as redis-py hands it over undecoded: an id and a flat list of
field names and values (any bytes: a stream entry is whatever some client's ``XADD`` wrote).
Contract: a row that makes a valid record batch, or
:class:`~sluiceway.pipeline.errors.SourceError`.
"""

from __future__ import annotations

import atheris

from sluiceway.pipeline.errors import SourceError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import record_batch
from sluiceway.pipeline.sources.redis import entry_row

MAX_LEN = 2048


def fuzz_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    raw_id = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 48))
    fields = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)) for _ in range(fdp.ConsumeIntInRange(0, 12))]
    try:
        row = entry_row("orders", raw_id, fields)
    except SourceError:
        return
    batch = record_batch([row])
    batch.validate(full=True)
    assert batch.schema == RECORD_SCHEMA and batch.num_rows == 1


def seeds() -> dict[str, bytes]:
    return {
        "entry": b"1700000000000-0key\x00order-1value{}header:h1",
        "tombstone": b"1700000000000-7key\x00order-2id\x00p/1",
        "repeated-header": b"5-1header:a\x001header:a\x002",
        "huge-id": b"18446744073709551615-18446744073709551615",
    }
