"""The journal's on-disk format: pure encode/decode functions, no file I/O.

A segment file is::

    SEGMENT_MAGIC (8 bytes) | SEGMENT frame | batch | batch | ...

and one batch is one committed append. Every frame starts with ``u32 length`` (of the whole
frame) and ``u32 crc32c``, and is padded with zero bytes to a multiple of 8, so every frame
starts 8-byte aligned in the file. All integers are little-endian. Two batch formats exist;
the kind byte at offset 8 of a batch tells them apart, so one segment can hold both.

**Format 2: one BATCH frame per append** (written by this version; segment version 2). As in
Kafka's record batch, one CRC32C covers all of an append's records and the per-record framing
is lean. The frame is a commit header, the register updates and the records block::

    0  u32 length        4  u32 crc32c of [8, records block): header and register updates
    8  u8  kind=5        9  u8 flags (1 = COMPACTED)   10 u16 0   12 u32 registers length
    16 i64 first offset  24 i64 end offset             32 i64 commit time (µs)
    40 u32 count         44 u32 records crc32c         48 u32 records length   52 u32 0
    56 register updates (pairs block) | zero padding to 8 | records block

The records block is built and checksummed by the appending thread before the append joins a
commit group; the committer adds only the 56-byte header (offsets, time, registers), whose
CRC covers the records CRC. It is columnar — every record's lengths first, then each field's
bytes back to back — and closes with a 40-byte trailer that says how to cut it::

    key lengths | value lengths | namespace lengths | header-block lengths
    | timestamp deltas | offset deltas | null bitmap
    | keys | values | namespaces | header blocks | zero padding to 8 | trailer

    trailer: 0 u32 count   4 u8 key, value, namespace and header length widths
             8 i64 base timestamp   16 u8 timestamp-delta width   17 u8 offset-delta width
             18 u8 flags (1 = a null bitmap is present)   19 u8 0
             20 u32 key bytes   24 u32 value bytes   28 u32 namespace bytes
             32 u32 header bytes   36 u32 0

Each per-record column is ``count`` unsigned integers of one width chosen per append — the
smallest of 1, 2, 4 (8 for deltas) bytes that holds the column's largest value, or 0 bytes
when every value is 0: Kafka's varints, but laid out so that both the encoder and the Arrow
decoder handle a whole column with one numpy operation instead of a loop per record. So a
namespace shared by the whole append is stored once (width 0, the ``namespace bytes`` are
that one namespace); equal timestamps cost nothing (width 0: every record has the base
timestamp, else base + delta, the base being the smallest); offsets are ``first + i`` unless
compaction removed records (width > 0: ``first + delta``); the null bitmap (bit ``i``, least
significant first: value ``i`` is null, a tombstone) is present only if some value is null.
The trailer sits at the end so that every field has at least 12 readable bytes after its
start, which the Arrow decoder's binary views rely on, and 8-byte aligned, so the decoder
gathers the trailers of many appends as 64-bit words.

A damaged records block is located to its append (one checksum covers it); the header, which
a reader checks when it only seeks past a batch, has its own checksum.

**Format 1: BEGIN | RECORD * count | COMMIT** (segment version 1; read, never written).

RECORD frame (40-byte fixed header, then the variable fields back to back)::

    0  u32 length      4  u32 crc32c of bytes [16, length)
    8  i64 offset      16 i64 timestamp (µs since the epoch)
    24 u8  kind=2      25 u8 flags (1 = value is null, a tombstone)
    26 u16 namespace length   28 u32 key length   32 u32 value length   36 u32 headers length
    40 namespace | key | value | headers block | zero padding to a multiple of 8

The record CRC leaves out the offset (assigned at commit, after the record was encoded); the
offset is covered by the batch checksum in the COMMIT frame and checked for contiguity.

BEGIN frame: ``len, crc, kind=1, flags, u16 0, u32 count, i64 first, i64 end, u64 records_len``
followed by ``count`` u32 record-frame lengths.

COMMIT frame: ``len, crc, kind=3, flags, u16 0, u32 count, i64 first, i64 end,
u32 records_crc, u32 registers_len, i64 commit_time`` followed by the register updates.
``records_crc`` is one crc32c over all record frames; per-record CRCs locate damage to a record.

**Both formats.** A batch is committed if and only if it is complete and its checksums hold:
recovery truncates a torn tail after the last valid batch. ``end - first == count`` except in
batches rewritten by compaction (flag ``COMPACTED``), where records were removed and the
surviving offsets keep their values (strictly increasing).

Register and header blocks use one "pairs" layout: ``u32 n``, ``n * (u32 klen, u32 vlen)``,
then ``k0 v0 k1 v1 ...`` as UTF-8.

This module is the layout (constants and struct layouts) and the small frames that are
written rarely: segment header, HEAD, offset-log entries. The two hot paths live apart, so
tuning one cannot disturb the other: :mod:`sluiceway.journal.encode` builds batches (the
append path), :mod:`sluiceway.journal.parse` reads them back (readers, recovery,
compaction) and :mod:`sluiceway.journal.arrow` decodes them in bulk.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from google_crc32c import value as _crc32c

SEGMENT_MAGIC = b"SLJSEG\x00\x01"
HEAD_MAGIC = b"SLJH"
CONSUMERS_MAGIC = b"SLJCON\x00\x01"
SEGMENT_VERSION = 2
"""New segments hold BATCH frames (format 2); older versions stay readable."""
READABLE_SEGMENT_VERSIONS = (1, 2)
HEAD_VERSION = 1

KIND_BEGIN = 1
KIND_RECORD = 2
KIND_COMMIT = 3
KIND_SEGMENT = 4
KIND_BATCH = 5

FLAG_NULL_VALUE = 1  # format 1 record: value is None (tombstone)
FLAG_COMPACTED = 1  # BEGIN/COMMIT/BATCH: offsets in the batch may have gaps
RECORDS_NULLS = 1  # records trailer: a null bitmap is present

MAX_FRAME_BYTES = 0xFFFFFFFF  # a BATCH frame's length is a u32: an append is at most 4 GiB on disk
LENGTH_WIDTHS = (0, 1, 2, 4)  # bytes per key, value and header-block length
NAMESPACE_WIDTHS = (0, 1, 2)  # namespaces are at most 0xFFFF bytes
DELTA_WIDTHS = (0, 1, 2, 4, 8)  # timestamp and offset deltas

HEAD_SYNCED = 1  # HEAD: the writer fsyncs, so HEAD's position is known durable

MAX_NAMESPACE_BYTES = 0xFFFF
MAX_FIELD_BYTES = 0xFFFFFFFF

# Field layouts. ``REC_BODY`` is the part of the record header covered by the record CRC.
FRAME_PREFIX = struct.Struct("<II")
REC_HEADER = struct.Struct("<IIqqBBHIII")
REC_BODY = struct.Struct("<qBBHIII")
REC_PREFIX = struct.Struct("<IIq")
BEGIN = struct.Struct("<IIBBHIqqQ")
COMMIT = struct.Struct("<IIBBHIqqIIq")
BATCH = struct.Struct("<IIBBHIqqqIIII")
RECORDS_TRAILER = struct.Struct("<I4Bq4B5I")
SEGMENT_HEADER = struct.Struct("<IIBBHIqqI")
HEAD = struct.Struct("<4sBBHqqq")
CONSUMER_ENTRY = struct.Struct("<IIq")
_U32 = struct.Struct("<I")
_PAIR_LENS = struct.Struct("<II")

REC_HEADER_SIZE = REC_HEADER.size  # 40
BATCH_HEADER_SIZE = BATCH.size  # 56
TRAILER_SIZE = RECORDS_TRAILER.size  # 40
REC_CRC_START = 16  # the record CRC covers [16, length): everything but length, crc and offset
HEAD_SIZE = HEAD.size + 4
SEGMENT_DATA_MIN = len(SEGMENT_MAGIC) + SEGMENT_HEADER.size

_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
ZEROS = bytes(8)
"""Zero padding: ``ZEROS[: -n & 7]`` pads ``n`` bytes to the next multiple of 8."""


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


# --- segment header -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SegmentHeader:
    base: int
    created_us: int
    registers: dict[str, str]
    data_start: int  # file position of the first batch
    version: int = SEGMENT_VERSION


def encode_segment_header(base: int, created_us: int, registers: Mapping[str, str]) -> bytes:
    regs = encode_pairs(registers)
    rest = (
        SEGMENT_HEADER.pack(0, 0, KIND_SEGMENT, SEGMENT_VERSION, 0, 0, base, created_us, len(regs))[8:] + regs
    )
    rest += ZEROS[: -(len(rest) + 8) & 7]
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
    if version not in READABLE_SEGMENT_VERSIONS:
        raise ValueError(f"unsupported segment format version {version}")
    if p + length > len(buf):
        raise ValueError("segment header is truncated")
    if crc32c(bytes(buf[p + 8 : p + length])) != crc:
        raise ValueError("segment header checksum mismatch")
    regs = dict(decode_pairs(buf, p + SEGMENT_HEADER.size, regs_len))
    return SegmentHeader(
        base=base, created_us=created, registers=regs, data_start=p + length, version=version
    )


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
        HEAD_VERSION,
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
    if magic != HEAD_MAGIC or version != HEAD_VERSION:
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
