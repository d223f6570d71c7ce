"""The on-disk format: frames, batches, HEAD and offset-log entries, without any file I/O."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.journal import encode, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.append import AppendTransaction
from sluiceway.journal.errors import InvalidJournalRecord
from sluiceway.journal.format import FLAG_COMPACTED, HeadState
from sluiceway.journal.parse import Incomplete, Invalid, ParsedBatch, RecordProblem
from sluiceway.journal.record import Record
from tests.support.journal_format import build_batch, parse_ok

text = st.text(max_size=20)
records_st = st.lists(
    st.tuples(
        text,  # namespace
        text,  # key
        st.one_of(st.none(), st.binary(max_size=60)),
        st.lists(st.tuples(text, text), max_size=3),
        st.integers(min_value=-(2**62), max_value=2**62),
    ),
    max_size=12,
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


# --- records and batches --------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(records_st, st.integers(min_value=0, max_value=2**40), st.dictionaries(text, text, max_size=3))
def test_batch_round_trip(
    records: list[tuple[str, str, bytes | None, list[tuple[str, str]], int]],
    first: int,
    registers: dict[str, str],
) -> None:
    buf = build_batch(records, first, registers)
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
    got = list(parse.iter_records(buf, batch, 0, 2**63 - 1))
    want = [
        Record(first + i, ns, key, value, headers, ts)
        for i, (ns, key, value, headers, ts) in enumerate(records)
    ]
    assert got == want
    # Range filtering.
    if records:
        lo, hi = first + len(records) // 3, first + len(records) - 1
        assert [r.offset for r in parse.iter_records(buf, batch, lo, hi)] == list(range(lo, hi))


def test_frames_are_8_byte_aligned_and_crc_skips_only_the_offset() -> None:
    frame = bytearray(encode.encode_record(b"ns", b"key", b"v" * 13, b"", 42))
    assert len(frame) % 8 == 0
    length, crc = fmt.FRAME_PREFIX.unpack_from(frame, 0)
    assert length == len(frame)
    assert crc == fmt.crc32c(bytes(frame[fmt.REC_CRC_START :]))
    frame[20] ^= 1  # the timestamp is covered
    assert crc != fmt.crc32c(bytes(frame[fmt.REC_CRC_START :]))


class _FakeWriter:
    clock = staticmethod(lambda: 7)


def test_transaction_writes_produce_the_reference_encoding() -> None:
    """``write`` and ``write_many`` inline ``append_record`` for speed; all must agree byte for byte."""
    tx = AppendTransaction(_FakeWriter())  # type: ignore[arg-type]
    cases = [
        ("k", b"value", None, "", 5),
        ("ключ", None, [("h", "v"), ("é", "")], "ns", -3),
        ("", b"", [], "", 0),
        ("k2", bytearray(b"x" * 13), None, "", None),  # default timestamp: the injected clock
        ("k3", "välue", None, "", 1),  # str: stored as UTF-8
    ]
    want = bytearray()
    for key, value, headers, ns, ts in cases:
        tx.write(key, value, headers=headers, namespace=ns, timestamp=ts)
        v = value.encode() if isinstance(value, str) else bytes(value) if value is not None else None
        encode.append_record(
            want, ns.encode(), key.encode(), v, fmt.encode_pairs(headers or []), 7 if ts is None else ts
        )
    small = [("a", b"1"), ("bb", None), ("c", memoryview(b"22"))]  # the per-record path
    assert tx.write_many(small, namespace="n", timestamp=9) == 3
    for key, value in [("a", b"1"), ("bb", None), ("c", b"22")]:
        encode.append_record(want, b"n", key.encode(), value, b"", 9)
    bulk = [(f"k{i}" if i % 7 else f"ключ{i}", None if i % 5 == 0 else b"v" * i) for i in range(100)]
    assert tx.write_many(bulk, timestamp=-1) == 100  # the vectorised path
    for key, value in bulk:
        encode.append_record(want, b"", key.encode(), value, b"", -1)
    assert b"".join(tx._parts) == bytes(want)
    assert tx.count == len(tx._lens) == 108 and sum(tx._lens) == len(want)


@settings(max_examples=40, deadline=None)
@given(
    st.binary(max_size=10),
    st.lists(
        st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=40))), min_size=1, max_size=50
    ),
    st.integers(min_value=-(2**62), max_value=2**62),
)
def test_encode_many_matches_append_record(
    namespace: bytes, records: list[tuple[str, bytes | None]], ts: int
) -> None:
    keys, values = [k for k, _ in records], [v for _, v in records]
    frames, lens = encode.encode_many(namespace, keys, values, ts)
    want = bytearray()
    want_lens = [encode.append_record(want, namespace, k.encode(), v, b"", ts) for k, v in records]
    assert frames == bytes(want)
    assert lens.tolist() == want_lens


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


def test_stamp_offsets_writes_consecutive_offsets() -> None:
    buf = build_batch([("", "a", b"1", [], 0), ("", "bb", b"22" * 9, [], 0), ("", "c", None, [], 0)], 1000)
    batch = parse_ok(buf)
    assert [r.offset for r in parse.iter_records(buf, batch, 0, 10**9)] == [1000, 1001, 1002]


def test_empty_batch_carries_registers() -> None:
    buf = build_batch([], 7, {"epoch": "3"})
    batch = parse_ok(buf)
    assert (batch.first, batch.end, batch.count, batch.registers) == (7, 7, 0, {"epoch": "3"})


@settings(max_examples=30, deadline=None)
@given(records_st.filter(bool))
def test_every_truncation_is_incomplete_never_a_batch(
    records: list[tuple[str, str, bytes | None, list[tuple[str, str]], int]],
) -> None:
    buf = build_batch(records, 0)
    for cut in range(len(buf)):
        assert isinstance(parse.parse_batch(buf[:cut], 0), Incomplete | Invalid)


@settings(max_examples=40, deadline=None)
@given(records_st.filter(bool), st.data())
def test_any_flipped_byte_is_detected(
    records: list[tuple[str, str, bytes | None, list[tuple[str, str]], int]], data: st.DataObject
) -> None:
    buf = bytearray(build_batch(records, 10))
    i = data.draw(st.integers(min_value=0, max_value=len(buf) - 1))
    buf[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    damaged = bytes(buf)
    parsed = parse.parse_batch(damaged, 0)
    if isinstance(parsed, ParsedBatch):
        # Only the records region can be damaged without BEGIN/COMMIT noticing; then the batch
        # checksum fails and the damage is located.
        assert parsed.records_pos <= i < parsed.records_end
        assert not parsed.records_ok(damaged)
        pos, _offset, reason = parse.locate_damage(damaged, parsed)
        assert parsed.records_pos <= pos <= i
        assert reason


def test_locate_damage_names_the_record() -> None:
    recs = [("", f"k{i}", b"x" * 30, [], 0) for i in range(5)]
    buf = bytearray(build_batch(recs, 100))
    batch = parse_ok(bytes(buf))
    third = batch.records_pos + 2 * int(batch.lens(bytes(buf))[0])
    buf[third + 50] ^= 0xFF
    pos, offset, reason = parse.locate_damage(bytes(buf), batch)
    assert (pos, offset, reason) == (third, 102, "record checksum mismatch")
    # A damaged offset field is outside the record CRC but still caught.
    buf = bytearray(build_batch(recs, 100))
    buf[batch.records_pos + 8] ^= 1
    pos, offset, reason = parse.locate_damage(bytes(buf), batch)
    assert (pos, offset) == (batch.records_pos, 100) and "offset" in reason


def test_iter_records_rejects_out_of_sequence_offsets() -> None:
    buf = bytearray(build_batch([("", "a", b"", [], 0), ("", "b", b"", [], 0)], 5))
    batch = parse_ok(bytes(buf))
    fmt.REC_PREFIX.pack_into(
        buf, batch.records_pos, *fmt.REC_PREFIX.unpack_from(buf, batch.records_pos)[:2], 6
    )
    with pytest.raises(RecordProblem, match="out of sequence"):
        list(parse.iter_records(bytes(buf), batch, 0, 100))


def test_parse_rejects_commit_that_disagrees_with_begin() -> None:
    a = build_batch([("", "a", b"1", [], 0)], 0)
    b = build_batch([("", "a", b"1", [], 0)], 1)
    begin_and_records = parse_ok(a).records_end
    mixed = a[:begin_and_records] + b[begin_and_records:]
    assert isinstance(parse.parse_batch(mixed, 0), Invalid)


def test_compacted_flag_allows_offset_gaps_only_when_set() -> None:
    frames = bytearray()
    lens = [encode.append_record(frames, b"", b"k", b"v", b"", 0) for _ in range(2)]
    arr = np.asarray(lens, dtype=np.uint32)
    encode.stamp_offsets(frames, arr, 0)
    gap = b"".join(encode.encode_batch(bytes(frames), arr, 0, 0, end=5, flags=FLAG_COMPACTED))
    assert parse_ok(gap).compacted
    assert isinstance(
        parse.parse_batch(b"".join(encode.encode_batch(bytes(frames), arr, 0, 0, end=5)), 0), Invalid
    )


# --- segment header, HEAD, offset log -------------------------------------------------------
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


def test_encode_single_matches_encode_batch() -> None:
    frames = bytearray()
    length = encode.append_record(frames, b"ns", b"key", b"value" * 3, b"", 77)
    prefix, body = bytes(frames[:16]), bytes(frames[16:])
    single = encode.encode_single(prefix, body, 41, 99)
    encode.stamp_offsets(frames, [length], 41)
    assert single == b"".join(encode.encode_batch(bytes(frames), [length], 41, 99))
    batch = parse_ok(single)
    assert [r.offset for r in parse.iter_records(single, batch, 0, 100)] == [41]
