"""Crash recovery decisions on in-memory segment bytes: torn tails go, acknowledged data stays.

Batches are format 2 unless a test says otherwise; a torn format-2 batch is one frame with one
records checksum, so a write cut anywhere inside it — or landed only in part — drops the whole
append (it was never acknowledged).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.journal import format as fmt
from sluiceway.journal.recovery import DamagedSegment, plan_recovery, scan_committed
from tests.support.journal_format import build_batch, build_batch_v1, record_st


def segment(
    *batches: bytes, base: int = 0, registers: dict[str, str] | None = None
) -> tuple[bytes, fmt.SegmentHeader]:
    raw = fmt.encode_segment_header(base, 0, registers or {}) + b"".join(batches)
    return raw, fmt.decode_segment_header(raw)


def batch(first: int, n: int, registers: dict[str, str] | None = None, *, v1: bool = False) -> bytes:
    build = build_batch_v1 if v1 else build_batch
    return build([("", f"k{first + i}", b"v" * 20, [], 0) for i in range(n)], first, registers)


def test_clean_segment() -> None:
    buf, header = segment(
        batch(10, 3, {"a": "1"}), batch(13, 2, {"a": "2", "b": "x"}), base=10, registers={"z": "0"}
    )
    plan = plan_recovery(buf, header, len(buf))
    assert (plan.valid_end, plan.head, plan.batches) == (len(buf), 15, 2)
    assert plan.registers == {"z": "0", "a": "2", "b": "x"}


def test_every_torn_tail_is_cut_back_to_the_last_commit() -> None:
    first = batch(0, 2, {"r": "1"})
    second = batch(2, 3, {"r": "2"})
    buf, header = segment(first, second)
    committed_end = header.data_start + len(first)
    for cut in range(committed_end, len(buf)):
        plan = plan_recovery(buf[:cut], header, committed_end)
        assert (plan.valid_end, plan.head, plan.registers) == (committed_end, 2, {"r": "1"}), cut


def test_garbage_after_durable_position_is_truncated() -> None:
    buf, header = segment(batch(0, 2))
    plan = plan_recovery(buf + b"\xff" * 100, header, len(buf))
    assert (plan.valid_end, plan.head) == (len(buf), 2)


def test_damage_before_the_durable_position_is_refused() -> None:
    first, second = batch(0, 2), batch(2, 2)
    buf, header = segment(first, second)
    damaged = bytearray(buf)
    damaged[header.data_start + 4] ^= 1  # BEGIN checksum of the first batch
    with pytest.raises(DamagedSegment) as exc:
        plan_recovery(bytes(damaged), header, len(buf))
    assert exc.value.position == header.data_start
    # Without a known durable position the same bytes count as a torn tail.
    assert plan_recovery(bytes(damaged), header, None).valid_end == header.data_start


def test_damaged_records_of_acknowledged_batch_are_kept_and_reported() -> None:
    first, second = batch(0, 2), batch(2, 2)
    buf, header = segment(first, second)
    damaged = bytearray(buf)
    damaged[header.data_start + len(first) - 60] ^= 1  # inside the first batch's last record
    plan = plan_recovery(bytes(damaged), header, len(buf))
    assert (plan.valid_end, plan.head) == (len(buf), 4)
    assert plan.damaged and plan.damaged[0][0] == header.data_start
    # Beyond the durable position the same damage is a torn write.
    assert plan_recovery(bytes(damaged), header, header.data_start).valid_end == header.data_start


def test_offset_discontinuity_is_not_accepted() -> None:
    buf, header = segment(batch(0, 2), batch(5, 1))
    plan = plan_recovery(buf, header, None)
    assert plan.head == 2
    with pytest.raises(DamagedSegment, match="expected 2"):
        plan_recovery(buf, header, len(buf))


def test_scan_committed_respects_a_limit() -> None:
    first = batch(0, 1)
    buf, header = segment(first, batch(1, 1))
    assert scan_committed(buf, header, header.data_start + len(first)).head == 1
    assert scan_committed(buf, header).head == 2


@settings(max_examples=60, deadline=None)
@given(
    first_v1=st.booleans(),
    records=st.lists(record_st, min_size=1, max_size=30),
    durable_known=st.booleans(),
    data=st.data(),
)
def test_a_torn_batch_frame_drops_the_whole_append(
    first_v1: bool,
    records: list,
    durable_known: bool,
    data: st.DataObject,  # type: ignore[type-arg]
) -> None:
    """A crash during the durable write of a BATCH frame leaves a prefix of it, or all of its
    length with some pages never written (zeros or stale bytes): recovery drops the whole
    append, keeps everything before it, and offsets continue where the last commit ended."""
    first = batch(0, 3, {"r": "1"}, v1=first_v1)
    torn = build_batch(records, 3, {"r": "2"})
    buf, header = segment(first, torn)
    committed_end = header.data_start + len(first)
    if data.draw(st.booleans(), label="cut short"):
        damaged = buf[: data.draw(st.integers(committed_end, len(buf) - 1), label="cut")]
    else:
        lo = data.draw(st.integers(committed_end, len(buf) - 1), label="from")
        hi = data.draw(st.integers(lo + 1, len(buf)), label="to")
        filler = data.draw(st.sampled_from([b"\x00", b"\xff", b"\x5a"]), label="filler")
        damaged = buf[:lo] + filler * (hi - lo) + buf[hi:]
        if damaged == buf:
            return  # the "unwritten" bytes happened to hold what was meant: the append is whole
    plan = plan_recovery(damaged, header, committed_end if durable_known else None)
    assert (plan.valid_end, plan.head, plan.registers, plan.batches) == (committed_end, 3, {"r": "1"}, 1)


def test_torn_batch_after_a_format1_batch_in_the_same_segment() -> None:
    old, new = batch(0, 2, v1=True), batch(2, 3)
    buf, header = segment(old, new, batch(5, 1))
    plan = plan_recovery(buf, header, len(buf))
    assert (plan.valid_end, plan.head, plan.batches) == (len(buf), 6, 3)
    cut = header.data_start + len(old) + len(new) - 1
    assert plan_recovery(buf[:cut], header, header.data_start + len(old)).head == 2
