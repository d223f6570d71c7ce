"""The on-disk format: frames, batches, HEAD and offset-log entries, without any file I/O.

Format 2 (BATCH frames) is what the journal writes; format 1 (BEGIN…COMMIT, built here with the
frozen encoder in ``tests/support/journal_v1.py``) is what older versions wrote and must stay readable.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.journal import encode, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.append import AppendTransaction
from sluiceway.journal.errors import InvalidJournalRecord
from sluiceway.journal.format import FLAG_COMPACTED, HeadState
from sluiceway.journal.parse import Incomplete, Invalid, ParsedBatch, RecordProblem
from tests.support import journal_v1
from tests.support.journal_format import (
    Rec,
    as_records,
    both_formats,
    build_batch,
    build_batch_v1,
    encode_recs,
    parse_ok,
    record_st,
    records_st,
    text,
)


# --- pairs ----------------------------------------------------------------------------------
@settings(deadline=None)
@given(st.lists(st.tuples(text, text), max_size=6))
def test_pairs_round_trip(pairs: list[tuple[str, str]]) -> None:
    block = fmt.encode_pairs(pairs)
    assert fmt.decode_pairs(block, 0, len(block)) == pairs


def test_pairs_reject_overruns_and_trailing_bytes() -> None:
    block = fmt.encode_pairs([("a", "bc")])
    with pytest.raises(ValueError):
        fmt.decode_pairs(block, 0, len(block) - 1)
    with pytest.raises(ValueError):
        fmt.decode_pairs(block + b"x", 0, len(block) + 1)
    with pytest.raises(ValueError):
        fmt.decode_pairs(b"\x05\x00\x00\x00", 0, 4)


# --- batches, both formats ------------------------------------------------------------------
@both_formats
@settings(max_examples=60, deadline=None)
@given(
    records=records_st,
    first=st.integers(min_value=0, max_value=2**40),
    registers=st.dictionaries(text, text, max_size=3),
)
def test_batch_round_trip(
    build: Callable[[list[Rec], int, dict[str, str] | None], bytes],
    records: list[Rec],
    first: int,
    registers: dict[str, str],
) -> None:
    buf = build(records, first, registers)
    assert len(buf) % 8 == 0
    batch = parse_ok(buf)
    assert (batch.first, batch.end, batch.count, batch.next_pos) == (
        first,
        first + len(records),
        len(records),
        len(buf),
    )
    assert batch.registers == registers
    assert batch.records_ok(buf)
    assert list(parse.iter_records(buf, batch, 0, 2**63 - 1)) == as_records(records, first)
    assert [(o, ns, k) for o, ns, k in parse.iter_keys(buf, batch)] == [
        (first + i, ns.encode(), key.encode()) for i, (ns, key, _v, _h, _t) in enumerate(records)
    ]
    # Range filtering.
    if records:
        lo, hi = first + len(records) // 3, first + len(records) - 1
        assert [r.offset for r in parse.iter_records(buf, batch, lo, hi)] == list(range(lo, hi))


@both_formats
def test_empty_batch_carries_registers(
    build: Callable[[list[Rec], int, dict[str, str] | None], bytes],
) -> None:
    buf = build([], 7, {"epoch": "3"})
    batch = parse_ok(buf)
    assert (batch.first, batch.end, batch.count, batch.registers) == (7, 7, 0, {"epoch": "3"})
    assert batch.records_ok(buf) and list(parse.iter_records(buf, batch, 0, 100)) == []


@both_formats
@settings(max_examples=30, deadline=None)
@given(records=records_st.filter(bool))
def test_every_truncation_is_incomplete_never_a_batch(
    build: Callable[[list[Rec], int, dict[str, str] | None], bytes], records: list[Rec]
) -> None:
    buf = build(records, 0, None)
    for cut in range(len(buf)):
        assert isinstance(parse.parse_batch(buf[:cut], 0), Incomplete | Invalid)


@both_formats
@settings(max_examples=40, deadline=None)
@given(records=records_st.filter(bool), data=st.data())
def test_any_flipped_byte_is_detected(
    build: Callable[[list[Rec], int, dict[str, str] | None], bytes], records: list[Rec], data: st.DataObject
) -> None:
    buf = bytearray(build(records, 10, {"r": "1"}))
    i = data.draw(st.integers(min_value=0, max_value=len(buf) - 1))
    buf[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    damaged = bytes(buf)
    parsed = parse.parse_batch(damaged, 0)
    if isinstance(parsed, ParsedBatch):
        # Only the records can be damaged without the header checksums noticing; then the
        # records checksum fails and the damage is located.
        assert parsed.records_pos <= i < parsed.records_end
        assert not parsed.records_ok(damaged)
        pos, _offset, reason = parse.locate_damage(damaged, parsed)
        assert pos <= i and reason


# --- format 2 -------------------------------------------------------------------------------
def test_batch_frame_layout() -> None:
    """The header is 56 bytes and checksums everything the committer adds; the records block
    ends with its 40-byte trailer and is covered by the records checksum."""
    records: list[Rec] = [("ns", "key", b"v" * 13, [("h", "1")], 42), ("ns", "k2", None, [], 43)]
    buf = build_batch(records, 100, {"epoch": "2"})
    length, crc, kind, flags, _r, regs_len, first, end, ctime, count, rcrc, rlen, _r2 = fmt.BATCH.unpack_from(
        buf
    )
    regs_end = fmt.BATCH_HEADER_SIZE + fmt.pad8(regs_len)
    assert (length, kind, flags, first, end, ctime, count) == (len(buf), fmt.KIND_BATCH, 0, 100, 102, 1234, 2)
    assert crc == fmt.crc32c(buf[8:regs_end]) and rlen == len(buf) - regs_end
    assert rcrc == fmt.crc32c(buf[regs_end:])
    trailer = fmt.RECORDS_TRAILER.unpack_from(buf, len(buf) - fmt.TRAILER_SIZE)
    # count, key/value/namespace/header widths, base ts, ts/offset delta widths, flags, 0, sizes, 0
    assert trailer == (
        2,
        1,
        1,
        0,
        1,
        42,
        1,
        0,
        fmt.RECORDS_NULLS,
        0,
        5,
        13,
        2,
        len(fmt.encode_pairs([("h", "1")])),
        0,
    )


def test_widths_grow_with_the_values() -> None:
    records: list[Rec] = [("", "k" * 300, b"v" * 70_000, [], -(2**62)), ("", "", b"", [], 2**62)]
    buf = build_batch(records, 0)
    trailer = fmt.RECORDS_TRAILER.unpack_from(buf, len(buf) - fmt.TRAILER_SIZE)
    assert trailer[1:5] == (2, 4, 0, 0) and trailer[5] == -(2**62) and trailer[6] == 8
    batch = parse_ok(buf)
    assert list(parse.iter_records(buf, batch, 0, 10)) == as_records(records, 0)


def test_the_committer_checksums_only_the_header() -> None:
    """The records block is encoded (and checksummed) once, by the appending thread; the same
    block committed at different offsets differs only in the header."""
    records = encode_recs([("", "a", b"1", [], 5), ("", "b", b"2", [], 5)])
    one = b"".join(encode.encode_batch(records, 0, 1))
    two = b"".join(encode.encode_batch(records, 500, 2, {"r": "x"}))
    assert one[fmt.BATCH_HEADER_SIZE :] == two[-len(one) + fmt.BATCH_HEADER_SIZE :]
    assert [r.offset for r in parse.iter_records(two, parse_ok(two), 0, 1000)] == [500, 501]


def test_damage_is_located_to_the_append() -> None:
    recs: list[Rec] = [("", f"k{i}", b"x" * 30, [], 0) for i in range(5)]
    buf = bytearray(build_batch(recs, 100))
    batch = parse_ok(bytes(buf))
    buf[batch.records_pos + 100] ^= 0xFF
    assert not batch.records_ok(bytes(buf))
    pos, offset, reason = parse.locate_damage(bytes(buf), batch)
    assert (pos, offset) == (0, 100) and reason == "append checksum mismatch (offsets 100 to 104)"


@settings(max_examples=60, deadline=None)
@given(records=st.lists(record_st, min_size=1, max_size=40), data=st.data())
def test_small_and_bulk_encoders_agree(records: list[Rec], data: st.DataObject) -> None:
    """Appends up to 16 records take a pure-Python encoder (one record a shorter one), bigger
    ones numpy: same bytes."""
    offsets = None
    if data.draw(st.booleans()):
        offsets = sorted(
            data.draw(st.sets(st.integers(0, 2**40), min_size=len(records), max_size=len(records)))
        )
    columns = (
        [k.encode() for _n, k, _v, _h, _t in records],
        [v for _n, _k, v, _h, _t in records],
        [n.encode() for n, _k, _v, _h, _t in records],
        [fmt.encode_pairs(h) for _n, _k, _v, h, _t in records],
        [t for _n, _k, _v, _h, t in records],
    )
    keys = b"".join(columns[0])
    small = b"".join(encode._block(len(records), keys, encode._columns_small(*columns, offsets)))
    bulk = b"".join(encode._block(len(records), keys, encode._columns_bulk(*columns, offsets, True)))
    assert small == bulk and len(small) % 8 == 0
    if len(records) == 1 and offsets is None:
        assert encode._encode_one(*(column[0] for column in columns)).parts == [small]  # type: ignore[arg-type]
    encoded = encode.encode_records(*columns, offsets=offsets)
    assert b"".join(encoded.parts) == small
    assert (encoded.count, encoded.size, encoded.crc) == (len(records), len(small), fmt.crc32c(small))


def test_oversized_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        encode.encode_records([b"a", b"b"], [b"", b""], [b"", b"n" * 0x10000], [b"", b""], [0, 0])


class _FakeWriter:
    clock = staticmethod(lambda: 7)


def test_transaction_columns_encode_as_the_reference() -> None:
    """``write`` and ``write_many`` (per record and column-wise) gather the same columns."""
    tx = AppendTransaction(_FakeWriter())  # type: ignore[arg-type]
    cases = [
        ("k", b"value", None, "", 5),
        ("ключ", None, [("h", "v"), ("é", "")], "ns", -3),
        ("", b"", [], "", 0),
        ("k2", bytearray(b"x" * 13), None, "", None),  # default timestamp: the injected clock
        ("k3", "välue", None, "", 1),  # str: stored as UTF-8
    ]
    want: list[Rec] = []
    for key, value, headers, ns, ts in cases:
        tx.write(key, value, headers=headers, namespace=ns, timestamp=ts)
        v = value.encode() if isinstance(value, str) else bytes(value) if value is not None else None
        want.append((ns, key, v, headers or [], 7 if ts is None else ts))
    small = [("a", b"1"), ("bb", None), ("c", memoryview(b"22"))]  # the per-record path
    assert tx.write_many(small, namespace="n", timestamp=9) == 3
    want += [("n", key, value, [], 9) for key, value in [("a", b"1"), ("bb", None), ("c", b"22")]]
    bulk = [(f"k{i}" if i % 7 else f"ключ{i}", None if i % 5 == 0 else b"v" * i) for i in range(100)]
    assert tx.write_many(bulk, timestamp=-1) == 100  # the column-wise path
    want += [("", key, value, [], -1) for key, value in bulk]
    encoded = tx._encode()
    assert tx.count == encoded.count == 108
    assert b"".join(encoded.parts) == b"".join(encode_recs(want).parts)


@pytest.mark.parametrize("n", [2, 100])
def test_write_many_is_all_or_nothing_per_call(n: int) -> None:
    tx = AppendTransaction(_FakeWriter())  # type: ignore[arg-type]
    tx.write("first", b"")
    good = [(f"k{i}", b"v") for i in range(n)]
    with pytest.raises(InvalidJournalRecord, match="value"):
        tx.write_many([*good, ("bad", "not bytes")])  # type: ignore[list-item]
    with pytest.raises(InvalidJournalRecord, match="key"):
        tx.write_many([*good, (3, b"")])  # type: ignore[list-item]
    with pytest.raises(InvalidJournalRecord, match="key"):
        tx.write_many([*good, ("\ud800", b"")])  # a lone surrogate cannot be UTF-8
    assert tx.count == 1


def test_compacted_offsets_must_increase_within_the_batch() -> None:
    recs: list[Rec] = [("", "a", b"", [], 0), ("", "b", b"", [], 0)]
    buf = build_batch(recs, 5, offsets=[7, 6], end=9, flags=FLAG_COMPACTED)
    with pytest.raises(RecordProblem, match="out of sequence"):
        list(parse.iter_records(buf, parse_ok(buf), 0, 100))


def test_malformed_records_trailer_fails_loudly() -> None:
    buf = bytearray(build_batch([("", "a", b"1", [], 0), ("", "b", b"2", [], 0)], 0))
    trailer = len(buf) - fmt.TRAILER_SIZE
    buf[trailer + 5] = 3  # value-length width 3 does not exist
    batch = parse_ok(bytes(buf))
    batch.records_crc = fmt.crc32c(bytes(buf[batch.records_pos :]))  # as if the writer had done it
    with pytest.raises(RecordProblem, match="trailer"):
        list(parse.iter_records(bytes(buf), batch, 0, 10))


# --- format 1 -------------------------------------------------------------------------------
def test_format1_locate_damage_names_the_record() -> None:
    recs: list[Rec] = [("", f"k{i}", b"x" * 30, [], 0) for i in range(5)]
    buf = bytearray(build_batch_v1(recs, 100))
    batch = parse_ok(bytes(buf))
    third = batch.records_pos + 2 * int(batch.lens(bytes(buf))[0])
    buf[third + 50] ^= 0xFF
    pos, offset, reason = parse.locate_damage(bytes(buf), batch)
    assert (pos, offset, reason) == (third, 102, "record checksum mismatch")
    # A damaged offset field is outside the record CRC but still caught.
    buf = bytearray(build_batch_v1(recs, 100))
    buf[batch.records_pos + 8] ^= 1
    pos, offset, reason = parse.locate_damage(bytes(buf), batch)
    assert (pos, offset) == (batch.records_pos, 100) and "offset" in reason


def test_format1_iter_records_rejects_out_of_sequence_offsets() -> None:
    buf = bytearray(build_batch_v1([("", "a", b"", [], 0), ("", "b", b"", [], 0)], 5))
    batch = parse_ok(bytes(buf))
    fmt.REC_PREFIX.pack_into(
        buf, batch.records_pos, *fmt.REC_PREFIX.unpack_from(buf, batch.records_pos)[:2], 6
    )
    with pytest.raises(RecordProblem, match="out of sequence"):
        list(parse.iter_records(bytes(buf), batch, 0, 100))


def test_format1_commit_that_disagrees_with_begin_is_invalid() -> None:
    a = build_batch_v1([("", "a", b"1", [], 0)], 0)
    b = build_batch_v1([("", "a", b"1", [], 0)], 1)
    begin_and_records = parse_ok(a).records_end
    mixed = a[:begin_and_records] + b[begin_and_records:]
    assert isinstance(parse.parse_batch(mixed, 0), Invalid)


def test_compacted_flag_allows_offset_gaps_only_when_set() -> None:
    recs: list[Rec] = [("", "k", b"v", [], 0)] * 2
    gap = journal_v1.encode_batch(recs, 0, end=5, flags=FLAG_COMPACTED)
    assert parse_ok(gap).compacted
    assert isinstance(parse.parse_batch(journal_v1.encode_batch(recs, 0, end=5), 0), Invalid)
    gap2 = build_batch(recs, 0, offsets=[1, 3], end=5, flags=FLAG_COMPACTED)
    batch = parse_ok(gap2)
    assert batch.compacted and [r.offset for r in parse.iter_records(gap2, batch, 0, 9)] == [1, 3]
    assert isinstance(parse.parse_batch(build_batch(recs, 0, end=5), 0), Invalid)


# --- segment header, HEAD, offset log -------------------------------------------------------
def test_older_segment_versions_are_read_newer_refused() -> None:
    old = journal_v1.segment_header(10, 5, {"a": "1"})
    header = fmt.decode_segment_header(old)
    assert (header.version, header.base, header.registers) == (1, 10, {"a": "1"})
    assert fmt.decode_segment_header(fmt.encode_segment_header(10, 5, {})).version == fmt.SEGMENT_VERSION == 2
    newer = bytearray(old)
    newer[8 + 9] = 3  # the version byte of the SEGMENT frame
    rest = bytes(newer[16 : 8 + fmt.FRAME_PREFIX.unpack_from(newer, 8)[0]])
    fmt.FRAME_PREFIX.pack_into(newer, 8, len(rest) + 8, fmt.crc32c(rest))
    with pytest.raises(ValueError, match="unsupported segment format version 3"):
        fmt.decode_segment_header(bytes(newer))


def test_segment_header_round_trip_and_damage() -> None:
    raw = fmt.encode_segment_header(4096, 99, {"leader": "n1", "epoch": "4"})
    assert len(raw) % 8 == 0
    header = fmt.decode_segment_header(raw + b"rest")
    assert (header.base, header.created_us, header.registers, header.data_start) == (
        4096,
        99,
        {"leader": "n1", "epoch": "4"},
        len(raw),
    )
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x40
        with pytest.raises(ValueError):
            fmt.decode_segment_header(bytes(bad))
    with pytest.raises(ValueError):
        fmt.decode_segment_header(raw[:-1])


def test_segment_names_sort_by_offset() -> None:
    names = [fmt.segment_name(b) for b in (10, 9, 100, 0)]
    assert [fmt.parse_segment_name(n) for n in sorted(names)] == [0, 9, 10, 100]
    assert fmt.parse_segment_name("0.seg") is None
    assert fmt.parse_segment_name(fmt.segment_name(5) + ".tmp") is None


def test_head_round_trip_and_torn_read() -> None:
    state = HeadState(head=123, segment=100, position=4096, synced=True)
    raw = fmt.encode_head(state)
    assert fmt.decode_head(raw) == state
    torn = fmt.encode_head(HeadState(200, 100, 8000, True))[:20] + raw[20:]
    assert fmt.decode_head(torn) is None
    assert fmt.decode_head(raw[:-1]) is None


def test_consumer_entries_stop_at_a_torn_tail() -> None:
    log = fmt.encode_consumer_entry("a", 5) + fmt.encode_consumer_entry("b", 7)
    torn = log + fmt.encode_consumer_entry("c", 9)[:-3]
    entries, end = fmt.decode_consumer_entries(torn, 0)
    assert entries == [("a", 5), ("b", 7)] and end == len(log)
    flipped = bytearray(log)
    flipped[-1] ^= 1
    assert fmt.decode_consumer_entries(bytes(flipped), 0)[0] == [("a", 5)]


@settings(max_examples=60, deadline=None)
@given(records=st.lists(record_st, min_size=17, max_size=60), data=st.data())
def test_the_arrow_encoder_makes_the_bytes_the_list_encoder_makes(
    records: list[Rec], data: st.DataObject
) -> None:
    """``write_arrow``'s column pieces (one or several tables in one append) encode to exactly
    the records block ``encode_records`` makes of the same records."""
    import pyarrow as pa

    from sluiceway.journal.columns import arrow_piece
    from sluiceway.journal.record import ARROW_SCHEMA

    rows = [
        {"offset": 0, "namespace": n, "op": "insert", "key": k, "value": v,
         "headers": [{"key": hk, "value": hv} for hk, hv in h], "timestamp": t}
        for n, k, v, h, t in records
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA.set(6, pa.field("timestamp", pa.int64())))
    cut = data.draw(st.integers(0, len(records)))
    pieces = [arrow_piece(part, 0) for part in (table.slice(0, cut), table.slice(cut)) if part.num_rows]
    columns = (
        [k.encode() for _n, k, _v, _h, _t in records],
        [v for _n, _k, v, _h, _t in records],
        [n.encode() for n, _k, _v, _h, _t in records],
        [fmt.encode_pairs(h) for _n, _k, _v, h, _t in records],
        [t for _n, _k, _v, _h, t in records],
    )
    expected = encode.encode_records(*columns)
    got = encode.encode_pieces(pieces)
    assert b"".join(got.parts) == b"".join(expected.parts)
    assert (got.count, got.size, got.crc) == (expected.count, expected.size, expected.crc)
