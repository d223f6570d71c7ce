"""Journal batches built and parsed in memory, for the format, recovery and maintenance tests."""

from __future__ import annotations

import numpy as np

from sluiceway.journal import encode, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.parse import ParsedBatch


def build_batch(
    records: list[tuple[str, str, bytes | None, list[tuple[str, str]], int]],
    first: int,
    registers: dict[str, str] | None = None,
) -> bytes:
    frames = bytearray()
    lens = []
    for ns, key, value, headers, ts in records:
        lens.append(
            encode.append_record(frames, ns.encode(), key.encode(), value, fmt.encode_pairs(headers), ts)
        )
    arr = np.asarray(lens, dtype=np.uint32)
    encode.stamp_offsets(frames, arr, first)
    return b"".join(encode.encode_batch(bytes(frames), arr, first, 1234, registers))


def parse_ok(buf: bytes, pos: int = 0) -> ParsedBatch:
    parsed = parse.parse_batch(buf, pos)
    assert isinstance(parsed, ParsedBatch), parsed
    return parsed


def parse_all(buf: bytes) -> list[ParsedBatch]:
    out, pos = [], 0
    while pos < len(buf):
        b = parse_ok(buf, pos)
        out.append(b)
        pos = b.next_pos
    return out
