"""The vectorised Arrow decoder must agree with the per-record decoder on every input.

Inputs mix both batch formats: a journal written before format 2 holds format-1 batches, and
compaction or an upgrade can put both in one segment (and so in one read buffer).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.journal import format as fmt
from sluiceway.journal import parse
from sluiceway.journal.arrow import decode_arrow
from sluiceway.journal.compaction import compact_segment_bytes
from sluiceway.journal.format import FLAG_COMPACTED
from sluiceway.journal.parse import RecordProblem
from sluiceway.journal.record import ARROW_SCHEMA
from tests.support.journal_format import as_rows, build_batch, build_batch_v1, parse_all, parse_ok

text = st.text(max_size=30)
record_st = st.tuples(
    text,
    text,
    st.one_of(st.none(), st.binary(max_size=80)),
    st.lists(st.tuples(text, text), max_size=3),
    st.integers(min_value=0, max_value=2**50),
)


def check_equivalent(buf: bytes, lo: int, hi: int) -> None:
    batches = parse_all(buf)
    rb = decode_arrow(buf, batches, lo, hi)
    assert rb.schema == ARROW_SCHEMA
    want = [r for b in batches for r in parse.iter_records(buf, b, lo, hi)]
    assert rb.to_pylist() == as_rows(want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(record_st, max_size=20), st.booleans()), max_size=6), st.data())
def test_arrow_matches_iterator(commits: list[tuple[list[tuple], bool]], data: st.DataObject) -> None:  # type: ignore[type-arg]
    buf, first = b"", 0
    for recs, old in commits:
        build = build_batch_v1 if old else build_batch
        buf += build(recs, first, {"r": "1"} if not recs else None)
        first += len(recs)
    if not buf:
        return
    lo = data.draw(st.integers(min_value=0, max_value=first + 1))
    hi = data.draw(st.integers(min_value=lo, max_value=first + 2))
    check_equivalent(buf, lo, hi)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 12, 13, 100, 5000, 70_000])
def test_value_sizes_around_the_inline_limit(size: int) -> None:
    recs = [("", f"k{i}", bytes([65 + i % 26]) * (size + i % 3), [], i) for i in range(50)]
    recs.append(("ns", "tomb", None, [("a", "b")], 0))
    check_equivalent(build_batch(recs, 3), 0, 100)
    check_equivalent(build_batch_v1(recs, 3), 0, 100)


def test_last_fields_of_the_buffer_are_read_whole() -> None:
    """Views read 12 bytes from a field's start: the trailer guarantees them at a buffer's end."""
    for n in (1, 2, 17):
        recs = [("", "k" * 13, b"v" * 13, [], 0)] * n
        buf = build_batch(recs, 0)
        check_equivalent(buf, 0, 100)


def test_many_headers_and_unicode() -> None:
    recs = [
        ("名前空間", "ключ", "é".encode() * 20, [("h" * 20, "v" * i) for i in range(i % 5)], 1)
        for i in range(40)
    ]
    check_equivalent(build_batch(recs, 0), 0, 100)


def test_compacted_batches_with_gaps() -> None:
    recs = [("", f"k{i % 3}", f"v{i}".encode(), [], i) for i in range(9)]
    buf = build_batch(recs, 0)
    body, removed = compact_segment_bytes(buf, parse_all(buf), {0, 1, 4})
    assert removed == 3
    batches = parse_all(body)
    assert batches[0].compacted
    rb = decode_arrow(body, batches, 0, 100)
    assert rb.column("offset").to_pylist() == [2, 3, 5, 6, 7, 8]
    check_equivalent(body, 3, 7)


def test_structural_damage_fails_loudly() -> None:
    buf = bytearray(build_batch_v1([("", "a", b"x", [], 0), ("", "b", b"y", [], 0)], 0))
    batch = parse_ok(bytes(buf))
    second = batch.records_pos + int(batch.lens(bytes(buf))[0])
    fmt.REC_PREFIX.pack_into(buf, second, *fmt.REC_PREFIX.unpack_from(buf, second)[:2], 0)  # repeat offset 0
    with pytest.raises(RecordProblem) as exc:
        decode_arrow(bytes(buf), [batch], 0, 10)
    assert exc.value.position == second


def test_format2_structural_damage_fails_loudly() -> None:
    recs = [("", "a", b"x", [], 0), ("", "b", b"y", [], 0)]
    buf = build_batch(recs, 0, offsets=[3, 3], end=5, flags=FLAG_COMPACTED)  # a repeated offset
    batch = parse_ok(buf)
    with pytest.raises(RecordProblem) as exc:
        decode_arrow(buf, [batch], 0, 10)
    assert (exc.value.position, exc.value.offset) == (batch.records_pos, 3)
    damaged = bytearray(build_batch(recs, 0))
    damaged[-fmt.TRAILER_SIZE + 20] += 1  # the keys' byte count no longer matches their lengths
    with pytest.raises(RecordProblem):
        decode_arrow(bytes(damaged), [parse_ok(bytes(damaged))], 0, 10)


def test_empty_inputs() -> None:
    assert decode_arrow(b"", [], 0, 10).num_rows == 0
    buf = build_batch([("", "a", b"x", [], 0)], 5)
    assert decode_arrow(buf, parse_all(buf), 6, 10).num_rows == 0
    empty = build_batch([], 5, {"x": "y"})
    assert decode_arrow(empty, parse_all(empty), 0, 10).num_rows == 0


def test_arrow_columns_are_plain_types() -> None:
    buf = build_batch([("n", "k", b"v" * 40, [("a", "b")], 10**15)], 0)
    rb = decode_arrow(buf, parse_all(buf), 0, 1)
    assert [f.type for f in rb.schema] == [f.type for f in ARROW_SCHEMA]
    assert np.asarray(rb.column("timestamp").cast("int64"))[0] == 10**15
    rb.validate(full=True)


# Found by fuzzing (fuzz/journal_segment.py, checksums recomputed after the damage, as a writer
# bug would leave them): a records block whose structure adds up but whose contents do not.
def _with_headers() -> tuple[bytearray, parse.ParsedBatch, int]:
    recs = [("ns", "a", b"x", [("h", "1")], 0), ("ns", "b", b"y", [("h", "2"), ("i", "3")], 0)]
    buf = bytearray(build_batch(recs, 0))
    batch = parse_ok(bytes(buf))
    return buf, batch, parse.records_layout(bytes(buf), batch).fields[3]  # the header blocks


@pytest.mark.parametrize("count", [2, 0xFFFFFFFF], ids=["one too many", "four billion"])
def test_a_header_count_past_its_block_is_a_record_problem(count: int) -> None:
    buf, batch, headers = _with_headers()
    struct.pack_into("<I", buf, headers, count)  # the first record's block holds one pair
    with pytest.raises(RecordProblem, match="headers block count overruns"):  # was IndexError
        decode_arrow(bytes(buf), [batch], 0, 10)
    with pytest.raises(RecordProblem, match="pairs block count overruns"):  # was ValueError
        list(parse.iter_records(bytes(buf), batch, 0, 10))


def test_a_key_that_is_not_utf8_is_a_record_problem_for_the_iterator() -> None:
    buf, batch, _headers = _with_headers()
    key = parse.records_layout(bytes(buf), batch).fields[0]
    buf[key] = 0xFF
    # was UnicodeDecodeError
    with pytest.raises(RecordProblem, match="malformed record: 'utf-8' codec") as exc:
        list(parse.iter_records(bytes(buf), batch, 0, 10))
    assert exc.value.position == batch.pos
