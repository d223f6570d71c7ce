"""Pure maintenance decisions: compaction selection, retention selection, append expectations."""

from __future__ import annotations

from sluiceway.journal import parse
from sluiceway.journal.compaction import (
    compact_segment_bytes,
    compaction_horizon,
    latest_offsets,
    select_removals,
)
from sluiceway.journal.errors import ExpectationFailed
from sluiceway.journal.format import KIND_BATCH, KIND_BEGIN
from sluiceway.journal.retention import SegmentStat, select_expired
from sluiceway.journal.writer import check_expectations
from tests.support.journal_format import build_batch, build_batch_v1, parse_all

E = [(0, b"", b"a"), (1, b"", b"b"), (2, b"", b"a"), (3, b"x", b"a"), (4, b"", b"b"), (5, b"", b"a")]


def test_latest_offsets_per_namespace_and_key() -> None:
    assert latest_offsets(E) == {(b"", b"a"): 5, (b"", b"b"): 4, (b"x", b"a"): 3}
    assert latest_offsets(reversed(E)) == latest_offsets(E)


def test_select_removals_only_below_horizon_and_only_superseded() -> None:
    latest = latest_offsets(E)
    assert select_removals(E, latest, 0) == set()
    assert select_removals(E, latest, 3) == {0, 1, 2}
    assert select_removals(E, latest, 100) == {0, 1, 2}  # 3, 4, 5 are the latest of their keys
    # A later record outside the candidate set (e.g. in the active segment) still supersedes.
    assert select_removals(E[:2], {(b"", b"a"): 9, (b"", b"b"): 1}, 2) == {0}


def test_compaction_horizon() -> None:
    assert compaction_horizon({}, None) == 0
    assert compaction_horizon({}, 7) == 7
    assert compaction_horizon({"a": 10, "b": 4}, None) == 4
    assert compaction_horizon({"a": 10, "b": 4}, 2) == 2
    assert compaction_horizon({"a": 10}, 50) == 10  # explicit horizon never raises it


def test_compact_segment_bytes_keeps_frames_and_offsets() -> None:
    recs = [("", k, f"v{i}".encode(), [], i) for i, k in enumerate("abab")]
    b1 = build_batch(recs[:2], 0, {"r": "1"})
    b2 = build_batch(recs[2:], 2)
    b3 = build_batch([("", "z", b"", [], 0)], 4)
    buf = b1 + b2 + b3
    batches = parse_all(buf)
    body, removed = compact_segment_bytes(buf, batches, {0, 1})
    assert removed == 2
    out = parse_all(body)
    # The emptied first batch survives for its register update; the untouched ones are copied as is.
    assert [(b.first, b.end, b.count, b.compacted, b.registers) for b in out] == [
        (0, 2, 0, True, {"r": "1"}),
        (2, 4, 2, False, {}),
        (4, 5, 1, False, {}),
    ]
    assert body[out[1].pos : out[2].next_pos] == b2 + b3
    # A batch emptied without register updates disappears entirely.
    body2, _ = compact_segment_bytes(buf, batches, {2, 3})
    assert [(b.first, b.count) for b in parse_all(body2)] == [(0, 2), (4, 1)]
    kept = [r for b in parse_all(body2) for r in parse.iter_records(body2, b, 0, 10)]
    assert [(r.offset, r.key, r.value) for r in kept] == [(0, "a", b"v0"), (1, "b", b"v1"), (4, "z", b"")]


def test_compaction_of_a_segment_holding_both_formats() -> None:
    """Untouched batches are copied as they are, in their format; a format-1 batch that loses
    records is rewritten as a format-2 batch (compacted, with its surviving offsets)."""
    v1a = build_batch_v1([("", "a", b"0", [("h", "1")], 10), ("ns", "b", None, [], 11)], 0, {"r": "1"})
    v2 = build_batch([("", "a", b"2", [], 12), ("", "c", b"3", [], 13)], 2)
    v1b = build_batch_v1([("", "a", b"4", [], 14), ("", "d", b"5", [], 15)], 4)
    buf = v1a + v2 + v1b
    batches = parse_all(buf)
    assert [b.kind for b in batches] == [KIND_BEGIN, KIND_BATCH, KIND_BEGIN]
    latest = latest_offsets((o, ns, k) for b in batches for o, ns, k in parse.iter_keys(buf, b))
    drop = select_removals(((o, ns, k) for b in batches for o, ns, k in parse.iter_keys(buf, b)), latest, 4)
    assert drop == {0, 2}
    body, removed = compact_segment_bytes(buf, batches, drop)
    assert removed == 2
    out = parse_all(body)
    assert [(b.kind, b.first, b.end, b.count, b.compacted, b.registers) for b in out] == [
        (KIND_BATCH, 0, 2, 1, True, {"r": "1"}),
        (KIND_BATCH, 2, 4, 1, True, {}),
        (KIND_BEGIN, 4, 6, 2, False, {}),
    ]
    assert body[out[2].pos :] == v1b
    kept = [r for b in out for r in parse.iter_records(body, b, 0, 10)]
    assert [(r.offset, r.namespace, r.key, r.value, r.headers, r.timestamp_us) for r in kept] == [
        (1, "ns", "b", None, [], 11),
        (3, "", "c", b"3", [], 13),
        (4, "", "a", b"4", [], 14),
        (5, "", "d", b"5", [], 15),
    ]
    assert all(b.records_ok(body) for b in out)


def seg(base: int, size: int, sealed: int) -> SegmentStat:
    return SegmentStat(base, size, sealed)


def test_retention_by_size_expires_oldest_prefix() -> None:
    closed = [seg(0, 100, 0), seg(10, 100, 0), seg(20, 100, 0)]
    kw = {"retention_age_us": None, "now_us": 0}
    assert select_expired(closed, 350, retention_bytes=None, **kw) == []  # type: ignore[arg-type]
    assert select_expired(closed, 350, retention_bytes=1000, **kw) == []  # type: ignore[arg-type]
    assert select_expired(closed, 350, retention_bytes=200, **kw) == [0, 10]  # type: ignore[arg-type]
    assert select_expired(closed, 350, retention_bytes=0, **kw) == [0, 10, 20]  # type: ignore[arg-type]


def test_retention_by_age_never_skips_a_newer_segment() -> None:
    closed = [seg(0, 1, 100), seg(10, 1, 900), seg(20, 1, 50)]
    assert select_expired(closed, 3, retention_bytes=None, retention_age_us=400, now_us=1000) == [0]
    assert select_expired(closed, 3, retention_bytes=None, retention_age_us=10, now_us=1000) == [0, 10, 20]
    assert select_expired(closed, 3, retention_bytes=None, retention_age_us=950, now_us=1000) == []


def test_expectations() -> None:
    regs = {"leader": "a", "epoch": "3"}
    assert check_expectations(5, regs, None, None) is None
    assert check_expectations(5, regs, 5, {"leader": "a", "missing": None}) is None
    failed = check_expectations(5, regs, 4, None)
    assert isinstance(failed, ExpectationFailed)
    assert (failed.what, failed.expected, failed.actual) == ("offset", 4, 5)
    failed = check_expectations(5, regs, 5, {"epoch": "2"})
    assert failed is not None and (failed.what, failed.expected, failed.actual) == (
        "register:epoch",
        "2",
        "3",
    )
    failed = check_expectations(5, regs, None, {"leader": None})
    assert failed is not None and failed.actual == "a"
