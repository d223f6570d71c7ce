"""A frozen copy of the format-1 encoder (BEGIN | RECORD… | COMMIT), for tests only.

The journal reads format 1 but no longer writes it; tests build format-1 bytes with this copy
(reduced from ``encode.py`` at commit d6e653e, without its fast paths). Its fidelity to what
that version really wrote is checked against ``tests/integration/journal/v1_journal``, which
that version wrote (``test_compat.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from sluiceway.journal.format import (
    FLAG_NULL_VALUE,
    FRAME_PREFIX,
    KIND_BEGIN,
    KIND_COMMIT,
    KIND_RECORD,
    KIND_SEGMENT,
    REC_BODY,
    REC_CRC_START,
    REC_HEADER_SIZE,
    REC_PREFIX,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    ZEROS,
    crc32c,
    encode_pairs,
)

Rec = tuple[str, str, bytes | None, Sequence[tuple[str, str]], int]
"""namespace, key, value, headers, timestamp (µs)"""

_BEGIN_REST = struct.Struct("<BBHIqqQ")
_COMMIT_REST = struct.Struct("<BBHIqqIIq")


def record_frame(rec: Rec, offset: int) -> bytes:
    ns, key, value, headers, ts = rec
    nsb, kb, hb = ns.encode(), key.encode(), encode_pairs(headers)
    flags = FLAG_NULL_VALUE if value is None else 0
    vb = value or b""
    used = REC_HEADER_SIZE + len(nsb) + len(kb) + len(vb) + len(hb)
    body = b"".join(
        (
            REC_BODY.pack(ts, KIND_RECORD, flags, len(nsb), len(kb), len(vb), len(hb)),
            nsb,
            kb,
            vb,
            hb,
            ZEROS[: -used & 7],
        )
    )
    return REC_PREFIX.pack(len(body) + REC_CRC_START, crc32c(body), offset) + body


def encode_batch(
    records: Sequence[Rec],
    first: int,
    commit_time_us: int = 1234,
    registers: Mapping[str, str] | None = None,
    *,
    offsets: Sequence[int] | None = None,
    end: int | None = None,
    flags: int = 0,
) -> bytes:
    """One whole format-1 batch; ``offsets`` default to ``first, first + 1, …``."""
    offsets = list(offsets) if offsets is not None else list(range(first, first + len(records)))
    frames = [record_frame(rec, off) for rec, off in zip(records, offsets, strict=True)]
    count = len(frames)
    end = first + count if end is None else end
    body = b"".join(frames)
    lens = struct.pack(f"<{count}I", *map(len, frames))
    begin = b"".join(
        (_BEGIN_REST.pack(KIND_BEGIN, flags, 0, count, first, end, len(body)), lens, ZEROS[: (count & 1) * 4])
    )
    regs = encode_pairs(registers or {})
    commit = b"".join(
        (
            _COMMIT_REST.pack(
                KIND_COMMIT, flags, 0, count, first, end, crc32c(body), len(regs), commit_time_us
            ),
            regs,
            ZEROS[: -len(regs) & 7],
        )
    )
    return b"".join(
        (
            FRAME_PREFIX.pack(len(begin) + 8, crc32c(begin)),
            begin,
            body,
            FRAME_PREFIX.pack(len(commit) + 8, crc32c(commit)),
            commit,
        )
    )


def segment_header(base: int, created_us: int, registers: Mapping[str, str]) -> bytes:
    """A version-1 segment header."""
    regs = encode_pairs(registers)
    rest = SEGMENT_HEADER.pack(0, 0, KIND_SEGMENT, 1, 0, 0, base, created_us, len(regs))[8:] + regs
    rest += ZEROS[: -(len(rest) + 8) & 7]
    return SEGMENT_MAGIC + FRAME_PREFIX.pack(len(rest) + 8, crc32c(rest)) + rest
