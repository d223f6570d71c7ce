"""The journal's on-disk format: pure encode/decode functions, no file I/O.

A segment file is::

    SEGMENT_MAGIC (8 bytes) | SEGMENT frame | batch | batch | ...

and one batch (one committed append) is::

    BEGIN frame | RECORD frame * count | COMMIT frame

Every frame starts with ``u32 length`` (of the whole frame) and ``u32 crc32c``, and is padded
with zero bytes to a multiple of 8, so every frame starts 8-byte aligned in the file: the bulk
decoder gathers a record's fixed header as five 64-bit words instead of forty bytes. All
integers are little-endian.

RECORD frame (40-byte fixed header, then the variable fields back to back)::

    0  u32 length      4  u32 crc32c of bytes [16, length)
    8  i64 offset      16 i64 timestamp (µs since the epoch)
    24 u8  kind=2      25 u8 flags (1 = value is null, a tombstone)
    26 u16 namespace length   28 u32 key length   32 u32 value length   36 u32 headers length
    40 namespace | key | value | headers block | zero padding to a multiple of 8

The record CRC deliberately leaves out the offset: offsets are assigned when the append
commits, after the record was encoded, and leaving them out lets the committer stamp a whole
append's offsets with one vectorised store instead of re-checksumming every record on the
serialized commit path. The offset is still covered by the batch checksum in the COMMIT frame
and is checked for contiguity against BEGIN/COMMIT on every read.

BEGIN frame: ``len, crc, kind=1, flags, u16 0, u32 count, i64 first, i64 end, u64 records_len``
followed by ``count`` u32 record-frame lengths. The length index is what makes the bulk
(Arrow) decoder vectorised: record boundaries come from a cumulative sum, not a pointer chase.

COMMIT frame: ``len, crc, kind=3, flags, u16 0, u32 count, i64 first, i64 end,
u32 records_crc, u32 registers_len, i64 commit_time`` followed by the register updates. A batch
is committed if and only if its COMMIT frame is present and valid: recovery truncates anything
after the last valid COMMIT. ``records_crc`` is one crc32c over all record frames, so readers
verify a whole append with a single call; per-record CRCs locate the damage when it fails.

``end - first == count`` except in segments rewritten by compaction (flag ``COMPACTED``), where
records were removed and the surviving offsets keep their values (strictly increasing).

Register and header blocks use one "pairs" layout: ``u32 n``, ``n * (u32 klen, u32 vlen)``,
then ``k0 v0 k1 v1 ...`` as UTF-8.
"""

from __future__ import annotations

import operator
import re
import struct
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import NamedTuple, TypeAlias

import numpy as np
from google_crc32c import value as _crc32c

from sluiceway.journal.record import Record

SEGMENT_MAGIC = b"SLJSEG\x00\x01"
HEAD_MAGIC = b"SLJH"
CONSUMERS_MAGIC = b"SLJCON\x00\x01"
FORMAT_VERSION = 1

KIND_BEGIN = 1
KIND_RECORD = 2
KIND_COMMIT = 3
KIND_SEGMENT = 4

FLAG_NULL_VALUE = 1  # record: value is None (tombstone)
FLAG_COMPACTED = 1  # BEGIN/COMMIT: offsets in the batch may have gaps

HEAD_SYNCED = 1  # HEAD: the writer fsyncs, so HEAD's position is known durable

MAX_NAMESPACE_BYTES = 0xFFFF
MAX_FIELD_BYTES = 0xFFFFFFFF

# Field layouts. ``_REC_BODY`` is the part of the record header covered by the record CRC.
FRAME_PREFIX = struct.Struct("<II")
REC_HEADER = struct.Struct("<IIqqBBHIII")
REC_BODY = struct.Struct("<qBBHIII")
REC_PREFIX = struct.Struct("<IIq")
BEGIN = struct.Struct("<IIBBHIqqQ")
COMMIT = struct.Struct("<IIBBHIqqIIq")
SEGMENT_HEADER = struct.Struct("<IIBBHIqqI")
HEAD = struct.Struct("<4sBBHqqq")
CONSUMER_ENTRY = struct.Struct("<IIq")
_U32 = struct.Struct("<I")
_PAIR_LENS = struct.Struct("<II")

REC_HEADER_SIZE = REC_HEADER.size  # 40
REC_CRC_START = 16  # the record CRC covers [16, length): everything but length, crc and offset
HEAD_SIZE = HEAD.size + 4
SEGMENT_DATA_MIN = len(SEGMENT_MAGIC) + SEGMENT_HEADER.size

_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
_ZEROS = bytes(8)
_PADS = [bytes(i) for i in range(8)]
_LITTLE = sys.byteorder == "little"
_pack_offset = struct.Struct("<q").pack_into
_pack_i64 = struct.Struct("<q").pack
_pack_u32 = struct.Struct("<I").pack
_pack_frame_prefix = FRAME_PREFIX.pack
# BEGIN/COMMIT without their (length, crc) prefix, which is computed over these bytes.
_pack_begin_rest = struct.Struct("<BBHIqqQ").pack
_pack_commit_rest = struct.Struct("<BBHIqqIIq").pack

Lens: TypeAlias = "np.ndarray | array[int] | Sequence[int]"
"""Record frame lengths: a numpy array, an ``array('I')`` or any sequence of ints."""


def pad8(n: int) -> int:
    """``n`` rounded up to a multiple of 8 (frames are 8-byte aligned)."""
    return (n + 7) & ~7


def crc32c(data: bytes) -> int:
    """CRC32C of ``data`` (google-crc32c wants an immutable bytes object)."""
    return int(_crc32c(data))


# --- segment names --------------------------------------------------------------------------
def segment_name(base: int) -> str:
    """File name of the segment whose first offset is ``base`` (zero-padded so names sort)."""
    return f"{base:020d}.seg"


def parse_segment_name(name: str) -> int | None:
    m = _SEGMENT_NAME.match(name)
    return int(m.group(1)) if m else None


# --- pairs blocks (registers, headers) ------------------------------------------------------
def encode_pairs(pairs: Sequence[tuple[str, str]] | Mapping[str, str]) -> bytes:
    items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
    if not items:
        return b""
    encoded = [(k.encode(), v.encode()) for k, v in items]
    lens = b"".join(_PAIR_LENS.pack(len(k), len(v)) for k, v in encoded)
    return b"".join([_U32.pack(len(encoded)), lens, *(p for kv in encoded for p in kv)])


def decode_pairs(buf: bytes, pos: int, length: int) -> list[tuple[str, str]]:
    """Decode a pairs block of ``length`` bytes at ``pos``; ``ValueError`` if malformed."""
    if length == 0:
        return []
    end = pos + length
    if length < 4:
        raise ValueError("pairs block too short")
    (n,) = _U32.unpack_from(buf, pos)
    data = pos + 4 + 8 * n
    if data > end:
        raise ValueError("pairs block count overruns the block")
    out: list[tuple[str, str]] = []
    p = pos + 4
    for _ in range(n):
        kl, vl = _PAIR_LENS.unpack_from(buf, p)
        p += 8
        if data + kl + vl > end:
            raise ValueError("pairs block entry overruns the block")
        k = bytes(buf[data : data + kl]).decode()
        data += kl
        v = bytes(buf[data : data + vl]).decode()
        data += vl
        out.append((k, v))
    if data != end:
        raise ValueError("pairs block has trailing bytes")
    return out


# --- records --------------------------------------------------------------------------------
_pack_body = REC_BODY.pack
_pack_prefix = REC_PREFIX.pack


def append_record(
    frames: bytearray, namespace: bytes, key: bytes, value: bytes | None, headers: bytes, timestamp_us: int
) -> int:
    """Append one RECORD frame (offset 0: stamped at commit, see module doc) to ``frames``.

    Returns the frame's length. This is the per-record hot path of every append, hence the
    bound methods and the two in-place extends instead of building the frame twice.
    """
    if value is None:
        flags = FLAG_NULL_VALUE
        value = b""
    else:
        flags = 0
    nl, kl, vl, hl = len(namespace), len(key), len(value), len(headers)
    used = REC_HEADER_SIZE + nl + kl + vl + hl
    body = b"".join(
        (
            _pack_body(timestamp_us, KIND_RECORD, flags, nl, kl, vl, hl),
            namespace,
            key,
            value,
            headers,
            _ZEROS[: -used & 7],
        )
    )
    length = len(body) + REC_CRC_START
    frames += _pack_prefix(length, _crc32c(body), 0)
    frames += body
    return length


def encode_many(
    namespace: bytes,
    keys: Sequence[str],
    values: Sequence[bytes | None],
    timestamp_us: int,
    *,
    has_null: bool = True,
) -> tuple[bytearray, np.ndarray]:
    """RECORD frames (offset 0) for many records sharing a namespace and a timestamp, no headers.

    Byte for byte what :func:`append_record` produces one at a time, built without a Python
    loop per record: the fixed headers as one numpy array, the frames with one ``join`` over an
    interleaving built by ``itertools`` in C, and the per-record CRCs by mapping ``crc32c`` over
    slices (also in C). Returns ``(frames, frame lengths)``. Keys must be ``str`` and values
    ``bytes`` or ``None`` (the caller checks; ``has_null=False`` promises there is no ``None``);
    ``UnicodeEncodeError`` for unencodable keys.
    """
    n = len(keys)
    if "".join(keys).isascii():
        kb: list[bytes] = list(map(str.encode, keys))
    else:
        kb = [k.encode() for k in keys]
    if has_null:
        null = np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool, count=n)
        has_null = bool(null.any())
    else:
        null = np.zeros(n, dtype=bool)
    vals: Sequence[bytes | None] = [b"" if v is None else v for v in values] if has_null else values
    klen = np.fromiter(map(len, kb), dtype=np.int64, count=n)
    vlen = np.fromiter(map(len, vals), dtype=np.int64, count=n)  # type: ignore[arg-type]
    nl = len(namespace)
    used = REC_HEADER_SIZE + nl + klen + vlen
    flen = (used + 7) & ~7
    hdr = np.zeros((n, 5), dtype="<u8")
    hdr[:, 0] = flen  # the CRC (high half of this word) is filled in below
    hdr[:, 2] = np.int64(timestamp_us).view(np.uint64)
    hdr[:, 3] = (
        (KIND_RECORD | (nl << 16))
        | (null.astype(np.uint64) << np.uint64(8))
        | (klen.astype(np.uint64) << np.uint64(32))
    )
    hdr[:, 4] = vlen  # headers length 0 in the high half
    headers = hdr.view("V40").reshape(n).tolist()
    pads = list(map(_PADS.__getitem__, (flen - used).tolist()))
    pieces = (
        zip(headers, repeat(namespace), kb, vals, pads) if nl else zip(headers, kb, vals, pads, strict=True)
    )
    joined = b"".join(chain.from_iterable(pieces))  # type: ignore[arg-type]
    starts = np.cumsum(flen) - flen
    crcs = np.fromiter(
        map(
            _crc32c,
            map(joined.__getitem__, map(slice, (starts + REC_CRC_START).tolist(), (starts + flen).tolist())),
        ),
        dtype=np.uint32,
        count=n,
    )
    frames = bytearray(joined)
    np.frombuffer(frames, dtype="<u4")[(starts >> 2) + 1] = crcs
    return frames, flen.astype(np.uint32)


def encode_record(
    namespace: bytes, key: bytes, value: bytes | None, headers: bytes, timestamp_us: int
) -> bytes:
    """One RECORD frame with offset 0 (see :func:`append_record`)."""
    out = bytearray()
    append_record(out, namespace, key, value, headers, timestamp_us)
    return bytes(out)


def stamp_offsets(frames: bytearray, lens: Lens, first: int) -> None:
    """Write offsets ``first, first+1, …`` into consecutive record frames held in ``frames``."""
    n = len(lens)
    if n <= 16:  # numpy's fixed cost only pays off for bigger appends
        pos = 0
        for i, length in enumerate(lens):
            _pack_offset(frames, pos + 8, first + i)
            pos += int(length)
        return
    lens = np.asarray(lens, dtype=np.int64)
    # Frames are 8-byte aligned, so each offset field is one whole 64-bit word (the second).
    words = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1] // 8, out=words[1:])
    target = np.frombuffer(frames, dtype="<i8", count=len(frames) // 8)
    target[words + 1] = np.arange(first, first + n, dtype=np.int64)


def encode_begin(first: int, end: int, lens: bytes, records_len: int, flags: int = 0) -> bytes:
    count = len(lens) // 4
    rest = b"".join(
        (
            _pack_begin_rest(KIND_BEGIN, flags, 0, count, first, end, records_len),
            lens,
            _ZEROS[: (count & 1) * 4],
        )
    )
    return _pack_frame_prefix(len(rest) + 8, _crc32c(rest)) + rest


def encode_commit(
    first: int,
    end: int,
    count: int,
    records_crc: int,
    commit_time_us: int,
    registers: Mapping[str, str] | None = None,
    flags: int = 0,
) -> bytes:
    if registers:
        regs = encode_pairs(registers)
        rest = b"".join(
            (
                _pack_commit_rest(
                    KIND_COMMIT, flags, 0, count, first, end, records_crc, len(regs), commit_time_us
                ),
                regs,
                _ZEROS[: -len(regs) & 7],
            )
        )
    else:
        rest = _pack_commit_rest(KIND_COMMIT, flags, 0, count, first, end, records_crc, 0, commit_time_us)
    return _pack_frame_prefix(len(rest) + 8, _crc32c(rest)) + rest


def lens_to_bytes(lens: Lens) -> bytes:
    """The BEGIN frame's length index: little-endian u32s."""
    if isinstance(lens, array) and lens.typecode == "I" and lens.itemsize == 4 and _LITTLE:
        return lens.tobytes()
    return np.asarray(lens, dtype="<u4").tobytes()


# --- segment header -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SegmentHeader:
    base: int
    created_us: int
    registers: dict[str, str]
    data_start: int  # file position of the first batch


def encode_segment_header(base: int, created_us: int, registers: Mapping[str, str]) -> bytes:
    regs = encode_pairs(registers)
    rest = (
        SEGMENT_HEADER.pack(0, 0, KIND_SEGMENT, FORMAT_VERSION, 0, 0, base, created_us, len(regs))[8:] + regs
    )
    rest += _ZEROS[: -(len(rest) + 8) & 7]
    return SEGMENT_MAGIC + FRAME_PREFIX.pack(len(rest) + 8, _crc32c(rest)) + rest


def decode_segment_header(buf: bytes) -> SegmentHeader:
    """Parse the start of a segment file; ``ValueError`` says what is wrong."""
    if len(buf) < SEGMENT_DATA_MIN:
        raise ValueError("segment header is truncated")
    if buf[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
        raise ValueError("not a journal segment (bad magic)")
    p = len(SEGMENT_MAGIC)
    length, crc, kind, version, _flags, _res, base, created, regs_len = SEGMENT_HEADER.unpack_from(buf, p)
    if kind != KIND_SEGMENT or length != pad8(SEGMENT_HEADER.size + regs_len):
        raise ValueError("segment header is malformed")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported segment format version {version}")
    if p + length > len(buf):
        raise ValueError("segment header is truncated")
    if crc32c(bytes(buf[p + 8 : p + length])) != crc:
        raise ValueError("segment header checksum mismatch")
    regs = dict(decode_pairs(buf, p + SEGMENT_HEADER.size, regs_len))
    return SegmentHeader(base=base, created_us=created, registers=regs, data_start=p + length)


# --- batches --------------------------------------------------------------------------------
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


def encode_batch(
    frames: bytes | bytearray,
    lens: Lens,
    first: int,
    commit_time_us: int,
    registers: Mapping[str, str] | None = None,
    *,
    end: int | None = None,
    flags: int = 0,
) -> list[bytes | bytearray]:
    """The buffers of one batch (to be written with one vectored write): BEGIN, records, COMMIT.

    ``frames`` must already carry their offsets (see :func:`stamp_offsets`).
    """
    count = len(lens)
    if end is None:
        end = first + count
    lens_b = lens_to_bytes(lens)
    records_crc = _crc32c(frames if type(frames) is bytes else bytes(frames))
    begin = encode_begin(first, end, lens_b, len(frames), flags)
    commit = encode_commit(first, end, count, records_crc, commit_time_us, registers, flags)
    return [begin, frames, commit] if count else [begin, commit]


def encode_single(
    prefix: bytes | bytearray, body: bytes | bytearray, offset: int, commit_time_us: int
) -> bytes:
    """A whole one-record batch, BEGIN to COMMIT, from the record's (prefix, body) halves.

    Exactly what :func:`encode_batch` produces for one record, in about half the calls: this is
    the per-append cost of many threads appending one record each (group commit).
    """
    length = len(body) + REC_CRC_START
    frame = b"".join((prefix[:8], _pack_i64(offset), body))
    begin = _pack_begin_rest(KIND_BEGIN, 0, 0, 1, offset, offset + 1, length) + _pack_u32(length) + _ZEROS[:4]
    commit = _pack_commit_rest(KIND_COMMIT, 0, 0, 1, offset, offset + 1, _crc32c(frame), 0, commit_time_us)
    return b"".join(
        (
            _pack_frame_prefix(len(begin) + 8, _crc32c(begin)),
            begin,
            frame,
            _pack_frame_prefix(len(commit) + 8, _crc32c(commit)),
            commit,
        )
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


# --- HEAD (the writer's published durable position) -----------------------------------------
class HeadState(NamedTuple):
    """What the writer last made durable: next offset, and the end of data in the active segment.

    (A named tuple rather than a dataclass: one is built per commit group.)
    """

    head: int
    segment: int
    position: int
    synced: bool


def encode_head(state: HeadState) -> bytes:
    body = HEAD.pack(
        HEAD_MAGIC,
        FORMAT_VERSION,
        HEAD_SYNCED if state.synced else 0,
        0,
        state.head,
        state.segment,
        state.position,
    )
    return body + _U32.pack(crc32c(body))


def decode_head(buf: bytes) -> HeadState | None:
    """``None`` when the bytes are not a complete, valid HEAD (e.g. a torn concurrent read)."""
    if len(buf) < HEAD_SIZE:
        return None
    body = bytes(buf[: HEAD.size])
    if _U32.unpack_from(buf, HEAD.size)[0] != crc32c(body):
        return None
    magic, version, flags, _r, head, segment, position = HEAD.unpack(body)
    if magic != HEAD_MAGIC or version != FORMAT_VERSION:
        return None
    return HeadState(head=head, segment=segment, position=position, synced=bool(flags & HEAD_SYNCED))


# --- consumer offset log --------------------------------------------------------------------
def encode_consumer_entry(name: str, offset: int) -> bytes:
    """One offset-log entry; ``offset == -1`` removes the consumer."""
    rest = struct.pack("<q", offset) + name.encode()
    return FRAME_PREFIX.pack(len(rest) + 8, crc32c(rest)) + rest


def decode_consumer_entries(buf: bytes, pos: int) -> tuple[list[tuple[str, int]], int]:
    """Decode entries from ``pos``; returns them and the end of the last valid one (a torn tail stops it)."""
    out: list[tuple[str, int]] = []
    n = len(buf)
    while pos + CONSUMER_ENTRY.size <= n:
        length, crc, offset = CONSUMER_ENTRY.unpack_from(buf, pos)
        if length < CONSUMER_ENTRY.size or pos + length > n:
            break
        if crc32c(bytes(buf[pos + 8 : pos + length])) != crc:
            break
        try:
            name = bytes(buf[pos + CONSUMER_ENTRY.size : pos + length]).decode()
        except UnicodeDecodeError:
            break
        out.append((name, offset))
        pos += length
    return out, pos


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
