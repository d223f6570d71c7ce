"""Parsing batches back out of segment bytes, and decoding their records: the read path.

Pure functions over a buffer, shared by everything that reads a segment: the record iterator,
the Arrow decoder (:mod:`sluiceway.journal.arrow`), recovery and compaction. The split of
work is deliberate: :func:`parse_batch` checks only a batch's structure and its small BEGIN
and COMMIT checksums, so seeking past batches is cheap; the one checksum over a batch's
records (``ParsedBatch.records_ok``) is left to readers that use them, and per-record
checksums are only consulted to say *where* a batch is damaged (:func:`locate_damage`).
A structural surprise after the checksums matched is a writer bug, so it fails loudly
(:class:`RecordProblem`) instead of being skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sluiceway.journal.format import (
    BEGIN,
    COMMIT,
    FLAG_COMPACTED,
    FLAG_NULL_VALUE,
    KIND_BEGIN,
    KIND_COMMIT,
    KIND_RECORD,
    REC_CRC_START,
    REC_HEADER,
    REC_HEADER_SIZE,
    crc32c,
    decode_pairs,
    pad8,
)
from sluiceway.journal.record import Record


@dataclass(slots=True)
class ParsedBatch:
    """A structurally valid batch located in a buffer (positions are buffer indexes)."""

    pos: int
    next_pos: int
    first: int
    end: int
    count: int
    flags: int
    lens_pos: int  # the u32 length index lives at [lens_pos, lens_pos + 4*count)
    records_pos: int
    records_end: int
    records_crc: int
    commit_time_us: int
    registers: dict[str, str]

    @property
    def compacted(self) -> bool:
        return bool(self.flags & FLAG_COMPACTED)

    def lens(self, buf: bytes) -> np.ndarray:
        return np.frombuffer(buf, dtype="<u4", count=self.count, offset=self.lens_pos)

    def records_ok(self, buf: bytes) -> bool:
        return crc32c(bytes(buf[self.records_pos : self.records_end])) == self.records_crc


@dataclass(frozen=True, slots=True)
class Incomplete:
    """The batch at ``pos`` runs past the available bytes; ``needed`` bytes from ``pos`` would do."""

    needed: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """The bytes at ``pos`` are not a valid batch (torn write or corruption)."""

    reason: str


def parse_batch(buf: bytes, pos: int, limit: int | None = None) -> ParsedBatch | Incomplete | Invalid:
    """Parse the BEGIN…COMMIT batch starting at ``buf[pos]`` without decoding its records.

    ``limit`` caps how far into ``buf`` the batch may extend (default: ``len(buf)``). Checks the
    BEGIN and COMMIT checksums and that they agree; the records checksum is left to the caller
    (``ParsedBatch.records_ok``) because seeking past batches does not need it.
    """
    if limit is None:
        limit = len(buf)
    if pos + BEGIN.size > limit:
        return Incomplete(BEGIN.size)
    blen, bcrc, kind, flags, _r, count, first, end, records_len = BEGIN.unpack_from(buf, pos)
    if kind != KIND_BEGIN or blen != pad8(BEGIN.size + 4 * count) or records_len & 7:
        return Invalid("bad BEGIN frame")
    rec_pos = pos + blen
    commit_pos = rec_pos + records_len
    if commit_pos + COMMIT.size > limit:
        return Incomplete(blen + records_len + COMMIT.size)
    clen, ccrc, ckind, cflags, _r2, ccount, cfirst, cend, rcrc, regs_len, ctime = COMMIT.unpack_from(
        buf, commit_pos
    )
    if ckind != KIND_COMMIT or clen != pad8(COMMIT.size + regs_len):
        return Invalid("missing or malformed COMMIT frame")
    next_pos = commit_pos + clen
    if next_pos > limit:
        return Incomplete(next_pos - pos)
    if crc32c(bytes(buf[pos + 8 : rec_pos])) != bcrc:
        return Invalid("BEGIN checksum mismatch")
    if crc32c(bytes(buf[commit_pos + 8 : next_pos])) != ccrc:
        return Invalid("COMMIT checksum mismatch")
    if (ccount, cfirst, cend, cflags) != (count, first, end, flags):
        return Invalid("COMMIT does not match BEGIN")
    if end - first < count or (not flags & FLAG_COMPACTED and end - first != count):
        return Invalid("offset range does not match record count")
    lens_pos = pos + BEGIN.size
    if count and int(np.frombuffer(buf, dtype="<u4", count=count, offset=lens_pos).sum(dtype=np.int64)) != (
        records_len
    ):
        return Invalid("record length index does not add up")
    try:
        regs = dict(decode_pairs(buf, commit_pos + COMMIT.size, regs_len)) if regs_len else {}
    except (ValueError, UnicodeDecodeError):
        return Invalid("malformed register updates")
    return ParsedBatch(
        pos=pos,
        next_pos=next_pos,
        first=first,
        end=end,
        count=count,
        flags=flags,
        lens_pos=lens_pos,
        records_pos=rec_pos,
        records_end=commit_pos,
        records_crc=rcrc,
        commit_time_us=ctime,
        registers=regs,
    )


# --- record decoding (per record, for the iterator) -----------------------------------------
class RecordProblem(Exception):
    """A record frame inside a batch is malformed: ``position`` (buffer index) and ``offset``."""

    def __init__(self, position: int, offset: int | None, reason: str) -> None:
        self.position = position
        self.offset = offset
        self.reason = reason
        super().__init__(reason)


def iter_records(buf: bytes, batch: ParsedBatch, lo: int, hi: int) -> Iterator[Record]:
    """Decode the records of a verified batch whose offsets fall in ``[lo, hi)``.

    Raises :class:`RecordProblem` on a structural inconsistency (these cannot happen once the
    batch checksum matched, short of a writer bug, so they fail loudly rather than skip).
    """
    unpack = REC_HEADER.unpack_from
    pos = batch.records_pos
    prev = batch.first - 1
    end = batch.end
    for flen in batch.lens(buf).tolist():
        _l, _c, offset, ts, kind, flags, nsl, kl, vl, hl = unpack(buf, pos)
        if kind != KIND_RECORD or _l != flen or pad8(REC_HEADER_SIZE + nsl + kl + vl + hl) != flen:
            raise RecordProblem(pos, offset, "malformed record frame")
        if offset <= prev or offset >= end:
            raise RecordProblem(pos, offset, "record offset out of sequence")
        prev = offset
        if offset >= hi:
            return
        if offset >= lo:
            p = pos + REC_HEADER_SIZE
            ns = buf[p : p + nsl].decode() if nsl else ""
            p += nsl
            key = buf[p : p + kl].decode()
            p += kl
            value = None if flags & FLAG_NULL_VALUE else buf[p : p + vl]
            p += vl
            headers = decode_pairs(buf, p, hl) if hl else []
            yield Record(offset, ns, key, value, headers, ts)
        pos += flen


def locate_damage(buf: bytes, batch: ParsedBatch) -> tuple[int, int | None, str]:
    """Find the first bad record of a batch whose records checksum failed.

    Returns ``(buffer position, offset or None, reason)``. Offsets are reported from the batch's
    own range, never from the (possibly damaged) frame, unless the batch is compacted.
    """
    pos = batch.records_pos
    prev = batch.first - 1
    for i, flen in enumerate(batch.lens(buf).tolist()):
        expected = None if batch.compacted else batch.first + i
        if pos + REC_HEADER_SIZE > batch.records_end or flen < REC_HEADER_SIZE:
            return pos, expected, "record frame is truncated"
        _l, crc, offset, *_rest = REC_HEADER.unpack_from(buf, pos)
        if _l != flen:
            return pos, expected, "record length does not match the index"
        if crc32c(bytes(buf[pos + REC_CRC_START : pos + flen])) != crc:
            return pos, expected, "record checksum mismatch"
        if offset <= prev or offset >= batch.end or (expected is not None and offset != expected):
            return pos, expected, "record offset does not match its batch"
        prev = offset
        pos += flen
    return batch.records_pos, None, "batch checksum mismatch"


def iter_keys(buf: bytes, batch: ParsedBatch) -> Iterator[tuple[int, bytes, bytes, int, int]]:
    """``(offset, namespace, key, frame position, frame length)`` of each record, for compaction."""
    unpack = REC_HEADER.unpack_from
    pos = batch.records_pos
    for flen in batch.lens(buf).tolist():
        _l, _c, offset, _ts, kind, _f, nsl, kl, _vl, _hl = unpack(buf, pos)
        if kind != KIND_RECORD or _l != flen:
            raise RecordProblem(pos, offset, "malformed record frame")
        p = pos + REC_HEADER_SIZE
        yield offset, buf[p : p + nsl], buf[p + nsl : p + nsl + kl], pos, flen
        pos += flen
