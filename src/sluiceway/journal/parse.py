"""Parsing batches back out of segment bytes, and decoding their records: the read path.

Pure functions over a buffer, shared by everything that reads a segment: the record iterator,
the Arrow decoder (:mod:`sluiceway.journal.arrow`), recovery and compaction. Both batch
formats are read (``ParsedBatch.kind`` says which; :mod:`sluiceway.journal.format` describes
them). The split of work is deliberate: :func:`parse_batch` checks only a batch's structure
and its small header checksums (BEGIN and COMMIT, or the BATCH header), so seeking past
batches is cheap; the one checksum over a batch's records (``ParsedBatch.records_ok``) is
left to readers that use them, and :func:`locate_damage` says where a batch whose records
failed it is damaged: the record, in format 1 (which has a CRC per record); the append, in
format 2. A structural surprise after the checksums matched is a writer bug, so it fails
loudly (:class:`RecordProblem`) instead of being skipped.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise, repeat
from typing import NamedTuple

import numpy as np

from sluiceway.journal.format import (
    BATCH,
    BEGIN,
    COMMIT,
    DELTA_WIDTHS,
    FLAG_COMPACTED,
    FLAG_NULL_VALUE,
    KIND_BATCH,
    KIND_BEGIN,
    KIND_COMMIT,
    KIND_RECORD,
    LENGTH_WIDTHS,
    NAMESPACE_WIDTHS,
    REC_CRC_START,
    REC_HEADER,
    REC_HEADER_SIZE,
    RECORDS_NULLS,
    RECORDS_TRAILER,
    TRAILER_SIZE,
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
    lens_pos: int  # format 1: the u32 length index lives at [lens_pos, lens_pos + 4*count)
    records_pos: int  # format 1: the first RECORD frame; format 2: the records block
    records_end: int
    records_crc: int
    commit_time_us: int
    registers: dict[str, str]
    kind: int = KIND_BATCH  # KIND_BEGIN: format 1 (BEGIN…COMMIT); KIND_BATCH: format 2

    @property
    def compacted(self) -> bool:
        return bool(self.flags & FLAG_COMPACTED)

    def lens(self, buf: bytes) -> np.ndarray:
        """Format 1: the record frames' lengths."""
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
    """Parse the batch starting at ``buf[pos]`` without decoding its records.

    ``limit`` caps how far into ``buf`` the batch may extend (default: ``len(buf)``). Checks the
    header checksums (BEGIN and COMMIT, or BATCH); the records checksum is left to the caller
    (``ParsedBatch.records_ok``) because seeking past batches does not need it.
    """
    if limit is None:
        limit = len(buf)
    if pos + BEGIN.size > limit:
        return Incomplete(BEGIN.size)
    if buf[pos + 8] == KIND_BATCH:
        return _parse_batch_frame(buf, pos, limit)
    return _parse_begin_commit(buf, pos, limit)


def _parse_batch_frame(buf: bytes, pos: int, limit: int) -> ParsedBatch | Incomplete | Invalid:
    """Format 2: one BATCH frame."""
    if pos + BATCH.size > limit:
        return Incomplete(BATCH.size)
    length, crc, _kind, flags, _r, regs_len, first, end, ctime, count, rcrc, records_len, _r2 = (
        BATCH.unpack_from(buf, pos)
    )
    records_pos = pos + BATCH.size + pad8(regs_len)
    if length != records_pos - pos + records_len or records_len < TRAILER_SIZE or records_len & 7:
        return Invalid("bad BATCH frame")
    next_pos = pos + length
    if next_pos > limit:
        return Incomplete(length)
    if crc32c(bytes(buf[pos + 8 : records_pos])) != crc:
        return Invalid("BATCH header checksum mismatch")
    batch = ParsedBatch(pos, next_pos, first, end, count, flags, 0, records_pos, next_pos, rcrc, ctime, {})
    return _checked(buf, batch, pos + BATCH.size, regs_len)


def _parse_begin_commit(buf: bytes, pos: int, limit: int) -> ParsedBatch | Incomplete | Invalid:
    """Format 1: BEGIN, the record frames, COMMIT."""
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
    lens_pos = pos + BEGIN.size
    if count and int(np.frombuffer(buf, dtype="<u4", count=count, offset=lens_pos).sum(dtype=np.int64)) != (
        records_len
    ):
        return Invalid("record length index does not add up")
    batch = ParsedBatch(
        pos, next_pos, first, end, count, flags, lens_pos, rec_pos, commit_pos, rcrc, ctime, {}, KIND_BEGIN
    )
    return _checked(buf, batch, commit_pos + COMMIT.size, regs_len)


def _checked(buf: bytes, batch: ParsedBatch, regs_pos: int, regs_len: int) -> ParsedBatch | Invalid:
    """What both formats check once their header checksums hold: the offset range against the
    record count, and the register updates (decoded into ``batch``)."""
    span = batch.end - batch.first
    if span < batch.count or (not batch.compacted and span != batch.count):
        return Invalid("offset range does not match record count")
    if regs_len:
        try:
            batch.registers = dict(decode_pairs(buf, regs_pos, regs_len))
        except (ValueError, UnicodeDecodeError):
            return Invalid("malformed register updates")
    return batch


class RecordProblem(Exception):
    """A record inside a batch is malformed: ``position`` (buffer index) and ``offset``."""

    def __init__(self, position: int, offset: int | None, reason: str) -> None:
        self.position = position
        self.offset = offset
        self.reason = reason
        super().__init__(reason)


# --- format 2: the records block ------------------------------------------------------------
class RecordsLayout(NamedTuple):
    """Where a BATCH frame's columns and fields lie (buffer indexes), from its trailer.

    Widths are bytes per value in a column, 0 when the column is absent (see the format).
    (A named tuple: one is built per batch read.)
    """

    n: int  # records
    base_ts: int
    widths: tuple[int, ...]  # key, value, namespace and header lengths; timestamp and offset deltas
    has_nulls: bool
    columns: tuple[int, ...]  # where the six columns above start, then the null bitmap
    fields: tuple[int, ...]  # where the keys, values, namespaces and header blocks start
    sizes: tuple[int, ...]  # and their byte counts


_LENGTH_WIDTHS = frozenset(LENGTH_WIDTHS)
_NAMESPACE_WIDTHS = frozenset(NAMESPACE_WIDTHS)
_DELTA_WIDTHS = frozenset(DELTA_WIDTHS)
_unpack_trailer = RECORDS_TRAILER.unpack_from


def records_layout(buf: bytes, batch: ParsedBatch) -> RecordsLayout:
    """Read the records trailer of a (checksum-verified) BATCH frame and check that it adds up."""
    trailer = batch.records_end - TRAILER_SIZE
    n, kw, vw, nw, hw, base_ts, tw, ow, rflags, r0, ks, vs, ns, hs, r1 = _unpack_trailer(buf, trailer)
    if (
        n != batch.count
        or kw not in _LENGTH_WIDTHS
        or vw not in _LENGTH_WIDTHS
        or hw not in _LENGTH_WIDTHS
        or nw not in _NAMESPACE_WIDTHS
        or tw not in _DELTA_WIDTHS
        or ow not in _DELTA_WIDTHS
        or rflags & ~RECORDS_NULLS
        or r0
        or r1
    ):
        raise RecordProblem(trailer, None, "malformed records trailer")
    c0 = batch.records_pos
    c1 = c0 + n * kw
    c2 = c1 + n * vw
    c3 = c2 + n * nw
    c4 = c3 + n * hw
    c5 = c4 + n * tw
    c6 = c5 + n * ow
    f0 = c6 + ((n + 7) >> 3 if rflags else 0)
    f1 = f0 + ks
    f2 = f1 + vs
    f3 = f2 + ns
    if not 0 <= trailer - (f3 + hs) < 8:
        raise RecordProblem(c0, None, "records block does not add up")
    return RecordsLayout(
        n,
        base_ts,
        (kw, vw, nw, hw, tw, ow),
        bool(rflags),
        (c0, c1, c2, c3, c4, c5, c6),
        (f0, f1, f2, f3),
        (ks, vs, ns, hs),
    )


_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _uints(buf: bytes, pos: int, n: int, width: int) -> tuple[int, ...]:
    """``n`` little-endian unsigned integers of ``width`` (> 0) bytes at ``pos``."""
    return struct.unpack_from(f"<{n}{_CODES[width]}", buf, pos)


def _spans(buf: bytes, layout: RecordsLayout, column: int, field: int) -> list[int]:
    """Boundaries of one field of every record: ``n + 1`` positions, from the field's lengths."""
    n, start, width = layout.n, layout.fields[field], layout.widths[column]
    bounds = (
        list(accumulate(_uints(buf, layout.columns[column], n, width), initial=start))
        if width
        else [start] * (n + 1)
    )
    if bounds[-1] != start + layout.sizes[field]:
        raise RecordProblem(layout.columns[column], None, "record lengths do not add up")
    return bounds


def _offsets(buf: bytes, batch: ParsedBatch, layout: RecordsLayout) -> Sequence[int]:
    first, n, width = batch.first, layout.n, layout.widths[5]
    if not width:
        return range(first, first + n)
    offsets = [first + d for d in _uints(buf, layout.columns[5], n, width)]
    if n and (offsets[-1] >= batch.end or any(a >= b for a, b in pairwise(offsets))):
        raise RecordProblem(layout.columns[5], None, "record offsets out of sequence")
    return offsets


def _iter_batch_records(buf: bytes, batch: ParsedBatch, lo: int, hi: int) -> Iterator[Record]:
    """Format 2: decode the records of a verified BATCH frame, one field at a time."""
    layout = records_layout(buf, batch)
    if layout.n == 1:
        yield from _one_record(buf, batch, layout, lo, hi)
        return
    offsets = _offsets(buf, batch, layout)
    i, j = bisect_left(offsets, lo), bisect_left(offsets, hi)
    if i >= j:
        return
    n = layout.n
    kb = _spans(buf, layout, 0, 0)
    keys = [buf[a:b].decode() for a, b in pairwise(kb[i : j + 1])]
    vb = _spans(buf, layout, 1, 1)
    values: list[bytes | None] = [buf[a:b] for a, b in pairwise(vb[i : j + 1])]
    if layout.has_nulls:
        bits = np.unpackbits(
            np.frombuffer(buf, np.uint8, (n + 7) >> 3, layout.columns[6]), bitorder="little"
        )[i:j]
        for k in np.flatnonzero(bits).tolist():
            values[k] = None
    if layout.widths[2]:
        nb = _spans(buf, layout, 2, 2)
        namespaces: Iterator[str] = (buf[a:b].decode() for a, b in pairwise(nb[i : j + 1]))
    else:
        ns_pos = layout.fields[2]
        namespaces = repeat(buf[ns_pos : ns_pos + layout.sizes[2]].decode())
    if layout.widths[3]:
        hb = _spans(buf, layout, 3, 3)
        headers: Iterator[list[tuple[str, str]]] = (
            decode_pairs(buf, a, b - a) for a, b in pairwise(hb[i : j + 1])
        )
    else:
        headers = ([] for _ in range(i, j))  # one list per record: callers may change theirs
    if layout.widths[4]:
        base = layout.base_ts
        timestamps: Iterator[int] = (
            base + d for d in _uints(buf, layout.columns[4], n, layout.widths[4])[i:j]
        )
    else:
        timestamps = repeat(layout.base_ts)
    yield from map(Record, offsets[i:j], namespaces, keys, values, headers, timestamps)


def _one_record(buf: bytes, batch: ParsedBatch, layout: RecordsLayout, lo: int, hi: int) -> Iterator[Record]:
    """Format 2, one record (every single-record append): its fields are the whole sections."""
    _kw, _vw, _nw, _hw, tw, ow = layout.widths
    offset = batch.first + (_uints(buf, layout.columns[5], 1, ow)[0] if ow else 0)
    if offset >= batch.end:
        raise RecordProblem(layout.columns[5], offset, "record offset out of its batch's range")
    if not lo <= offset < hi:
        return
    (kp, vp, np_, hp), (ks, vs, ns, hs) = layout.fields, layout.sizes
    yield Record(
        offset,
        buf[np_ : np_ + ns].decode() if ns else "",
        buf[kp : kp + ks].decode(),
        None if layout.has_nulls else buf[vp : vp + vs],
        decode_pairs(buf, hp, hs) if hs else [],
        layout.base_ts + (_uints(buf, layout.columns[4], 1, tw)[0] if tw else 0),
    )


# --- record decoding (per record, for the iterator) -----------------------------------------
def iter_records(buf: bytes, batch: ParsedBatch, lo: int, hi: int) -> Iterator[Record]:
    """Decode the records of a verified batch whose offsets fall in ``[lo, hi)``.

    Raises :class:`RecordProblem` on a structural inconsistency (these cannot happen once the
    batch checksum matched, short of a writer bug, so they fail loudly rather than skip).
    """
    try:
        if batch.kind == KIND_BATCH:
            yield from _iter_batch_records(buf, batch, lo, hi)
            return
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
    except ValueError as exc:
        # Text that is not UTF-8 (UnicodeDecodeError) or a malformed header block: the record
        # checks cover lengths and offsets, not what the fields hold.
        raise RecordProblem(batch.pos, None, f"malformed record: {exc}") from None


def locate_damage(buf: bytes, batch: ParsedBatch) -> tuple[int, int | None, str]:
    """Say where a batch whose records checksum failed is damaged.

    Returns ``(buffer position, offset or None, reason)``. Format 2 has one checksum over an
    append's records, so the damage is located to the append: the BATCH frame and its first
    offset. Format 1 finds the first bad record; its offset is reported from the batch's own
    range, never from the (possibly damaged) frame, unless the batch is compacted.
    """
    if batch.kind == KIND_BATCH:
        if not batch.count:
            return batch.pos, None, "append checksum mismatch"
        return batch.pos, batch.first, f"append checksum mismatch (offsets {batch.first} to {batch.end - 1})"
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


def iter_keys(buf: bytes, batch: ParsedBatch) -> Iterator[tuple[int, bytes, bytes]]:
    """``(offset, namespace, key)`` of each record, for compaction."""
    if batch.kind == KIND_BATCH:
        layout = records_layout(buf, batch)
        kb = _spans(buf, layout, 0, 0)
        if layout.widths[2]:
            nb = _spans(buf, layout, 2, 2)
            namespaces: Iterator[bytes] = (buf[a:b] for a, b in pairwise(nb))
        else:
            namespaces = repeat(buf[layout.fields[2] : layout.fields[2] + layout.sizes[2]])
        keys = (buf[a:b] for a, b in pairwise(kb))
        yield from zip(_offsets(buf, batch, layout), namespaces, keys, strict=False)
        return
    unpack = REC_HEADER.unpack_from
    pos = batch.records_pos
    for flen in batch.lens(buf).tolist():
        _l, _c, offset, _ts, kind, _f, nsl, kl, _vl, _hl = unpack(buf, pos)
        if kind != KIND_RECORD or _l != flen:
            raise RecordProblem(pos, offset, "malformed record frame")
        p = pos + REC_HEADER_SIZE
        yield offset, buf[p : p + nsl], buf[p + nsl : p + nsl + kl]
        pos += flen
