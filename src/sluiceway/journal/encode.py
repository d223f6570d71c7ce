"""Encoding RECORD frames and whole batches: the write path, tuned per record.

Everything here produces exactly the bytes :mod:`sluiceway.journal.format` describes, and is
shaped by one budget: an append spends most of its CPU here, once per record. Hence struct
``pack`` methods bound once at import, ``b"".join`` over pieces instead of growing a buffer,
a vectorised encoder for bulk input (:func:`encode_many`), and a one-step encoder for the
one-record append of group commit (:func:`encode_single`). :func:`append_record` is the
reference the fast paths are tested against, byte for byte; ``AppendTransaction.write``
inlines it, which is why the packers it uses are public here.

Records are encoded with offset 0 and stamped at commit (:func:`stamp_offsets`): the record
checksum leaves the offset out, so stamping needs no re-checksumming.
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from typing import TypeAlias

import numpy as np
from google_crc32c import value as _crc32c

from sluiceway.journal.format import (
    FLAG_NULL_VALUE,
    FRAME_PREFIX,
    KIND_BEGIN,
    KIND_COMMIT,
    KIND_RECORD,
    REC_BODY,
    REC_CRC_START,
    REC_HEADER_SIZE,
    REC_PREFIX,
    ZEROS,
    encode_pairs,
)

pack_record_body = REC_BODY.pack
"""Packs a RECORD frame's checksummed fixed fields: timestamp, kind, flags and the four lengths."""
pack_record_prefix = REC_PREFIX.pack
"""Packs a RECORD frame's first 16 bytes: length, crc32c and offset."""
pack_i64 = struct.Struct("<q").pack

_PADS = [bytes(i) for i in range(8)]
_LITTLE = sys.byteorder == "little"
_pack_offset = struct.Struct("<q").pack_into
_pack_u32 = struct.Struct("<I").pack
_pack_frame_prefix = FRAME_PREFIX.pack
# BEGIN/COMMIT without their (length, crc) prefix, which is computed over these bytes.
_pack_begin_rest = struct.Struct("<BBHIqqQ").pack
_pack_commit_rest = struct.Struct("<BBHIqqIIq").pack

Lens: TypeAlias = "np.ndarray | array[int] | Sequence[int]"
"""Record frame lengths: a numpy array, an ``array('I')`` or any sequence of ints."""


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
            pack_record_body(timestamp_us, KIND_RECORD, flags, nl, kl, vl, hl),
            namespace,
            key,
            value,
            headers,
            ZEROS[: -used & 7],
        )
    )
    length = len(body) + REC_CRC_START
    frames += pack_record_prefix(length, _crc32c(body), 0)
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
            ZEROS[: (count & 1) * 4],
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
                ZEROS[: -len(regs) & 7],
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
    frame = b"".join((prefix[:8], pack_i64(offset), body))
    begin = _pack_begin_rest(KIND_BEGIN, 0, 0, 1, offset, offset + 1, length) + _pack_u32(length) + ZEROS[:4]
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
