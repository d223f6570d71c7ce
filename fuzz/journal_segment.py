"""Fuzz target: the journal's segment reader and crash recovery, on a damaged segment.

The input is a control byte and then the bytes of segment 0 (libFuzzer's mutations flip, cut,
insert and append bytes). The control byte says:

* bit 0: reseal — recompute the segment header's and each batch's checksums after the damage,
  so the structure behind them (record columns, lengths, offsets) is reached too, as a writer
  bug or a collision would present it;
* bits 1-2: the ``HEAD`` file — none; synced, claiming the whole file durable (damage must
  then be refused, never truncated away); synced, claiming half of it; not synced.

The target reads the journal read-only (as another process would), then opens it as the writer
(recovery truncates a torn tail), reads it again, appends one record and reads that back.
Contract: each step ends normally or in a :class:`~sluiceway.journal.errors.JournalError`
(``CorruptRecordError`` names the file and byte); after a recovery the journal takes appends,
and the record appended is read back at the head recovery reported.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pyarrow as pa

from fuzz._common import scratch
from sluiceway.journal import Journal, JournalError, Record
from sluiceway.journal.format import (
    BATCH,
    KIND_BATCH,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
    HeadState,
    crc32c,
    encode_head,
    pad8,
    segment_name,
)

MAX_LEN = 16384

_U32 = struct.Struct("<I")
_RESEAL, _HEAD_MODES = 1, 6


def reseal(segment: bytearray) -> None:
    """Recompute the checksums of the segment header and of every whole format-2 batch in place."""
    p = len(SEGMENT_MAGIC)
    if len(segment) < p + SEGMENT_HEADER.size:
        return
    (length,) = _U32.unpack_from(segment, p)
    if length < 8 or p + length > len(segment):
        return
    _U32.pack_into(segment, p + 4, crc32c(bytes(segment[p + 8 : p + length])))
    pos = p + length
    while pos + BATCH.size <= len(segment) and segment[pos + 8] == KIND_BATCH:
        fields = BATCH.unpack_from(segment, pos)
        length, regs_len, records_len = fields[0], fields[5], fields[11]
        records_pos = pos + BATCH.size + pad8(regs_len)
        if length < BATCH.size or records_pos + records_len > len(segment) or pos + length > len(segment):
            return
        _U32.pack_into(segment, pos + 44, crc32c(bytes(segment[records_pos : records_pos + records_len])))
        _U32.pack_into(segment, pos + 4, crc32c(bytes(segment[pos + 8 : records_pos])))
        pos += length


def _lay_out(data: bytes) -> Path:
    directory = scratch() / "journal"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    control, segment = (data[0], bytearray(data[1:])) if data else (0, bytearray())
    if control & _RESEAL:
        reseal(segment)
    (directory / segment_name(0)).write_bytes(segment)
    mode = (control & _HEAD_MODES) >> 1
    if mode:
        position = len(segment) if mode == 1 else len(segment) // 2
        head = HeadState(head=1000, segment=0, position=position, synced=mode != 3)
        (directory / "HEAD").write_bytes(encode_head(head))
    return directory


def _read_everything(journal: Journal, *, resealed: bool) -> None:
    """Read every committed record as records and as Arrow; where both read, they agree.

    Arrow batches are always structurally valid. Their strings are checked to be UTF-8 only when
    the checksums were not recomputed: the Arrow decoder trusts checksummed text (the writer
    encodes ``str``; checking would cost a hot read path about 7 %), while the record
    iterator, which decodes each string anyway, reports it as corrupt.
    """
    try:
        records: list[Record] | None = list(journal.read(from_offset=0))
    except JournalError:
        records = None
    try:
        batches: list[pa.RecordBatch] | None = list(journal.read_arrow(from_offset=0))
    except JournalError:
        batches = None
    if batches is not None:
        for batch in batches:
            batch.validate(full=not resealed)
    if records is not None and batches is not None:  # (with resealed text, only records can refuse)
        offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
        assert offsets == [r.offset for r in records], (offsets, [r.offset for r in records])
    journal.registers()


def fuzz_one(data: bytes) -> None:
    directory = _lay_out(data)
    resealed = bool(data and data[0] & _RESEAL)
    try:
        with Journal.open(directory, read_only=True) as reader:
            _read_everything(reader, resealed=resealed)
    except JournalError:
        pass
    try:
        journal = Journal.open(directory, fsync=False)
    except JournalError:
        return  # refused to recover (acknowledged data damaged): said, nothing truncated
    with journal:
        head = journal.head
        _read_everything(journal, resealed=resealed)
        with journal.append() as tx:
            tx.write("fuzz", b"after recovery", namespace="fuzz")
        assert tx.offsets == range(head, head + 1), (tx.offsets, head)
        (record,) = journal.read(from_offset=head)
        assert (record.offset, record.key, record.value) == (head, "fuzz", b"after recovery")


def seeds() -> dict[str, bytes]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with Journal.open(tmp, fsync=False, clock=lambda: 1_700_000_000_000_000) as journal:
            with journal.append(set_registers={"epoch": "3"}) as tx:
                tx.write("order-1", b'{"total": 12}', namespace="orders", timestamp=1_700_000_000_000_000)
                tx.write("order-2", None, namespace="orders", timestamp=1_700_000_000_000_001)
            with journal.append() as tx:
                for i in range(5):
                    tx.write(f"k{i}", bytes([i]) * i, headers=[("h", str(i))], namespace=f"ns{i % 2}")
            with journal.append(set_registers={"epoch": "4", "leader": "a"}) as tx:
                tx.write("", "é text", namespace="")
        v2 = (Path(tmp) / segment_name(0)).read_bytes()
    v1 = (
        Path(__file__).parent.parent / "tests/integration/journal/v1_journal" / segment_name(0)
    ).read_bytes()
    torn = v2[: len(v2) - 20]
    return {
        "v2": b"\x00" + v2,
        "v2-head-durable": b"\x02" + v2,
        "v2-torn-head-half": b"\x04" + torn,
        "v2-resealed-head-unsynced": b"\x07" + v2,
        "v2-appended": b"\x00" + v2 + b"\x40\x00\x00\x00junk",
        "v1": b"\x00" + v1,
        "v1-head-durable": b"\x02" + v1,
    }
