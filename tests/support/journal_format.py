"""Journal batches built and parsed in memory, for the format, recovery, Arrow and maintenance
tests: format 2 (what the journal writes) and format 1 (older versions, by the frozen encoder in
``journal_v1``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import strategies as st

from sluiceway.journal import encode, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.parse import ParsedBatch
from sluiceway.journal.record import Record
from tests.support import journal_v1

Rec = tuple[str, str, bytes | None, list[tuple[str, str]], int]

text = st.text(max_size=20)
record_st = st.tuples(
    text,  # namespace
    text,  # key
    st.one_of(st.none(), st.binary(max_size=60)),
    st.lists(st.tuples(text, text), max_size=3),
    st.integers(min_value=-(2**62), max_value=2**62),
)
records_st = st.lists(record_st, max_size=12)


def encode_recs(records: list[Rec], offsets: list[int] | None = None) -> encode.EncodedRecords:
    return encode.encode_records(
        [key.encode() for _ns, key, _v, _h, _t in records],
        [value for _ns, _k, value, _h, _t in records],
        [ns.encode() for ns, _k, _v, _h, _t in records],
        [fmt.encode_pairs(headers) for _ns, _k, _v, headers, _t in records],
        [ts for _ns, _k, _v, _h, ts in records],
        offsets=offsets,
    )


def build_batch(
    records: list[Rec],
    first: int,
    registers: dict[str, str] | None = None,
    *,
    offsets: list[int] | None = None,
    end: int | None = None,
    flags: int = 0,
) -> bytes:
    """One format-2 batch (what the journal writes); ``offsets`` are absolute, for compacted batches."""
    deltas = None if offsets is None else [o - first for o in offsets]
    return b"".join(
        encode.encode_batch(encode_recs(records, deltas), first, 1234, registers, end=end, flags=flags)
    )


def build_batch_v1(records: list[Rec], first: int, registers: dict[str, str] | None = None) -> bytes:
    return journal_v1.encode_batch(records, first, 1234, registers)


BUILDERS: dict[str, Callable[[list[Rec], int, dict[str, str] | None], bytes]] = {
    "format2": build_batch,
    "format1": build_batch_v1,
}
both_formats = pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())


def parse_ok(buf: bytes, pos: int = 0) -> ParsedBatch:
    parsed = parse.parse_batch(buf, pos)
    assert isinstance(parsed, ParsedBatch), parsed
    return parsed


def as_records(records: list[Rec], first: int) -> list[Record]:
    return [Record(first + i, ns, k, v, h, ts) for i, (ns, k, v, h, ts) in enumerate(records)]


def parse_all(buf: bytes) -> list[ParsedBatch]:
    out, pos = [], 0
    while pos < len(buf):
        b = parse_ok(buf, pos)
        out.append(b)
        pos = b.next_pos
    return out


def as_rows(records: list[Record]) -> list[dict[str, object]]:
    return [
        {
            "offset": r.offset,
            "namespace": r.namespace,
            "op": "insert",
            "key": r.key,
            "value": r.value,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
            "timestamp": r.timestamp,
        }
        for r in records
    ]
