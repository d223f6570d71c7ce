"""Storage: segments, recovery, corruption, locking, retention, compaction and consumer offsets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.journal import (
    CorruptRecordError,
    Journal,
    JournalLockedError,
    JournalNotFoundError,
    JournalReadOnlyError,
    encode,
    parse,
)
from sluiceway.journal import format as fmt
from sluiceway.journal.consumers import FILE_NAME as CONSUMERS_FILE
from sluiceway.journal.consumers import OffsetLog
from sluiceway.journal.segment import pwrite_all
from tests.support.journal import append, fill, keys, spawn


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "journal")


@pytest.fixture
def journal(path: str) -> Iterator[Journal]:
    with Journal.open(path) as j:
        yield j


def seg_files(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".seg"))


# --- segments and reading -------------------------------------------------------------------
def test_segments_roll_by_size_and_are_named_by_base_offset(path: str) -> None:
    with Journal.open(path, segment_bytes=8192) as j:
        fill(j, 300, per_append=10, size=100)
        segs = j.segments()
        assert len(segs) > 3
        assert segs[0].base == 0
        for seg in segs[:-1]:
            assert seg.size <= 8192
        # Each segment's name is the offset of its first record.
        for seg in segs:
            first = next(j.read(seg.base))
            assert first.offset == seg.base
        assert [r.offset for r in j.read()] == list(range(300))
        assert [r.offset for r in j.read(95, 205)] == list(range(95, 205))


def test_read_arrow_matches_iterator_across_segments(path: str) -> None:
    with Journal.open(path, segment_bytes=8192) as j:
        fill(j, 500, per_append=7, size=40)
        with j.append() as tx:
            tx.write("tomb", None, headers=[("a", "b")], namespace="ns")
        rows = [row for rb in j.read_arrow(13, 480, max_rows=50) for row in rb.to_pylist()]
        assert all(rb.num_rows <= 50 for rb in j.read_arrow(max_rows=50))
        want = list(j.read(13, 480))
        assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
            (r.offset, r.key, r.value) for r in want
        ]
        last = next(j.read_arrow(500)).to_pylist()
        assert last[0]["value"] is None and last[0]["headers"] == [{"key": "a", "value": "b"}]
        assert sum(rb.num_rows for rb in j.read_arrow()) == 501


def test_readers_in_other_processes_do_not_need_the_lock(journal: Journal, path: str) -> None:
    append(journal, ("a", b"1"), set_registers={"r": "1"})
    assert Journal.head_offset(path) == 1
    with Journal.open(path, read_only=True) as reader:
        assert keys(list(reader.read())) == ["a"]
        assert reader.registers() == {"r": "1"}
        with pytest.raises(JournalReadOnlyError):
            reader.append()
        with pytest.raises(JournalReadOnlyError):
            reader.compact()
        append(journal, ("b", b"2"), set_registers={"r": "2"})
        assert reader.head == 2 and reader.registers() == {"r": "2"}
    with pytest.raises(JournalNotFoundError):
        Journal.open(os.path.join(path, "missing"), read_only=True)


def test_pwrite_all_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    real = os.pwrite

    def at_most_3_bytes(fd_: int, buffers: list[bytes], pos: int) -> int:
        return real(fd_, b"".join(bytes(b) for b in buffers)[:3], pos)

    bufs = [b"hello", b"", b" ", b"world", b"!" * 10] + [b"x"] * 2000  # more than IOV_MAX too
    monkeypatch.setattr(os, "pwritev", at_most_3_bytes)
    try:
        assert pwrite_all(fd, bufs, 7) == 7 + sum(map(len, bufs))
        assert os.pread(fd, 5000, 7) == b"".join(bufs)
    finally:
        os.close(fd)


def test_bulk_and_single_writes_read_back_identically(journal: Journal) -> None:
    rows = [(f"k{i}", None if i % 9 == 0 else f"v{i}".encode()) for i in range(500)]
    with journal.append() as tx:
        tx.write_many(rows, namespace="bulk", timestamp=123)
        tx.write("single", b"s")
    assert tx.offsets == range(0, 501)
    got = list(journal.read())
    assert [(r.namespace, r.key, r.value, r.timestamp_us) for r in got[:500]] == [
        ("bulk", k, v, 123) for k, v in rows
    ]
    assert got[500].key == "single"


# --- locking --------------------------------------------------------------------------------
def test_one_writer_at_a_time(journal: Journal, path: str) -> None:
    with pytest.raises(JournalLockedError, match=f"pid {os.getpid()}"):
        Journal.open(path)
    with spawn(
        """
        import sys
        from sluiceway.journal import Journal, JournalLockedError
        try:
            Journal.open(sys.argv[1])
        except JournalLockedError as exc:
            print("locked:", exc.holder)
        """,
        path,
    ) as proc:
        out, err = proc.communicate(timeout=30)
    assert out.strip() == f"locked: pid {os.getpid()}", err
    journal.close()
    with Journal.open(path) as again:
        assert again.head == 0


# --- recovery -------------------------------------------------------------------------------
def test_torn_tail_is_truncated_on_open(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b"1"), ("b", b"2"))
    seg = seg_files(path)[-1]
    good_size = os.path.getsize(seg)
    records = encode.encode_records([b"torn", b"t2"], [b"x" * 500, None], [b"", b""], [b"", b""], [0, 0])
    whole = b"".join(encode.encode_batch(records, 2, 0))
    with open(seg, "ab") as f:
        f.write(whole[: len(whole) - 10])  # the end of the records block never made it
    with Journal.open(path) as j:
        assert os.path.getsize(seg) == good_size
        assert keys(list(j.read())) == ["a", "b"]
        assert append(j, ("c", b"3")) == range(2, 3)


def test_damage_in_acknowledged_data_is_refused_not_truncated(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b"1"))
        append(j, ("b", b"2"))
    seg = seg_files(path)[-1]
    raw = bytearray(Path(seg).read_bytes())
    header = fmt.decode_segment_header(bytes(raw))
    raw[header.data_start + 4] ^= 0xFF  # the first batch's header checksum
    Path(seg).write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError) as exc:
        Journal.open(path)
    assert exc.value.path == seg and exc.value.position == header.data_start
    assert os.path.getsize(seg) == len(raw)  # nothing was truncated


def test_corrupt_record_is_reported_never_returned(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        fill(j, 60, per_append=3, size=100)
        segs = j.segments()
    target = segs[1]  # a closed segment
    raw = bytearray(Path(target.path).read_bytes())
    header = fmt.decode_segment_header(bytes(raw))
    batch = parse.parse_batch(bytes(raw), header.data_start)
    assert isinstance(batch, parse.ParsedBatch)
    raw[batch.records_end - fmt.TRAILER_SIZE - 150] ^= 0x01  # one bit inside the second record's value
    Path(target.path).write_bytes(bytes(raw))
    with Journal.open(path) as j:
        got: list[int] = []
        with pytest.raises(CorruptRecordError) as exc:
            got.extend(r.offset for r in j.read())
        assert got == list(range(target.base))  # everything before the damaged batch, nothing after
        # One checksum covers an append's records: the damage is located to the append.
        assert (exc.value.path, exc.value.position, exc.value.offset) == (
            target.path,
            header.data_start,
            target.base,
        )
        assert exc.value.reason == f"append checksum mismatch (offsets {target.base} to {target.base + 2})"
        with pytest.raises(CorruptRecordError):
            list(j.read_arrow())
        # Reading around the damaged batch still works.
        assert [r.offset for r in j.read(target.base + 3, target.base + 6)] == list(
            range(target.base + 3, target.base + 6)
        )


def test_head_offset_without_head_file(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b""), ("b", b""))
    os.unlink(os.path.join(path, "HEAD"))
    assert Journal.head_offset(path) == 2
    with Journal.open(path, read_only=True) as r:
        assert keys(list(r.read())) == ["a", "b"]
    with Journal.open(path) as j:
        assert j.head == 2


# --- retention ------------------------------------------------------------------------------
def test_retention_by_size_removes_oldest_closed_segments(path: str) -> None:
    with Journal.open(path, segment_bytes=4096, retention_bytes=16384) as j:
        fill(j, 400, per_append=4, size=80)
        total = sum(s.size for s in j.segments())
        assert total <= 16384 + 4096 + 1024
        start = j.segments()[0].base
        assert start > 0
        # Readers from before the start begin at the oldest retained record.
        assert next(j.read(0)).offset == start
        assert [r.offset for r in j.read()] == list(range(start, 400))
        assert j.head == 400


def test_retention_by_age_uses_an_injected_clock(path: str) -> None:
    now = [1_000_000_000_000]
    with Journal.open(path, segment_bytes=4096, retention_age=60, clock=lambda: now[0]) as j:
        fill(j, 100, per_append=5, size=120)
        n = len(j.segments())
        assert n > 3
        assert j.compact().segments_expired == 0
        now[0] += 61_000_000
        result = j.compact()
        assert result.segments_expired == n - 1
        assert len(j.segments()) == 1
        assert j.head == 100
    with Journal.open(path) as j:
        assert append(j, ("after", b"")) == range(100, 101)


# --- compaction -----------------------------------------------------------------------------
def test_compaction_keeps_latest_per_key_below_the_consumer_horizon(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for i in range(120):
            with j.append() as tx:
                tx.write(f"k{i % 10}", f"v{i}".encode(), namespace="a" if i % 20 < 10 else "b")
        all_before = {r.offset: r for r in j.read()}
        horizon = 80
        j.commit_offset("slow", horizon)
        j.commit_offset("fast", 115)
        active = j.segments()[-1].base
        result = j.compact()
        assert result.horizon == horizon
        assert result.records_removed > 0 and result.bytes_after < result.bytes_before
        after = {r.offset: r for r in j.read()}
        latest: dict[tuple[str, str], int] = {}
        for off, r in all_before.items():
            latest[(r.namespace, r.key)] = off
        for off, r in all_before.items():
            removable = off < horizon and off < active and latest[(r.namespace, r.key)] != off
            assert (off in after) is not removable, off
            if off in after:
                assert after[off] == r  # same offset, same record
        # Arrow reads see the same gaps, and ranges may start or end inside a gap.
        assert [o for rb in j.read_arrow() for o in rb.column("offset").to_pylist()] == sorted(after)
        gaps = [o for o in range(horizon) if o not in after]
        assert gaps
        for lo, hi in [
            (0, gaps[0]),
            (gaps[0], gaps[-1]),
            (gaps[len(gaps) // 2], gaps[-1] + 1),
            (gaps[-1], 200),
        ]:
            want = [o for o in sorted(after) if lo <= o < hi]
            assert [r.offset for r in j.read(lo, hi)] == want, (lo, hi)
            assert [o for rb in j.read_arrow(lo, hi) for o in rb.column("offset").to_pylist()] == want
        assert j.compact().records_removed == 0  # idempotent
        assert append(j, ("new", b"")) == range(120, 121)
    with Journal.open(path) as j:
        assert sorted(r.offset for r in j.read()) == sorted([*after, 120])


def test_compaction_needs_a_consumer_or_explicit_horizon(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for i in range(80):
            append(j, ("same", str(i).encode()))
        active = j.segments()[-1].base
        assert j.compact().records_removed == 0  # nobody said what was consumed
        assert j.compact(horizon=40).records_removed == min(40, active)
        assert [r.offset for r in j.read()] == list(range(min(40, active), 80))


def test_a_reader_in_progress_is_not_disturbed_by_compaction(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for i in range(100):
            append(j, ("same", str(i).encode()))
        it = j.read()
        first = [next(it).offset for _ in range(3)]
        assert j.compact(horizon=100).records_removed > 0
        rest = [r.offset for r in it]
        # The open segment keeps its old content; later segments show the compacted view.
        assert first == [0, 1, 2] and rest[:3] == [3, 4, 5]
        assert rest == sorted(set(rest)) and rest[-1] == 99


# --- consumer offsets -----------------------------------------------------------------------
def test_consumer_offsets_are_durable_and_shared(journal: Journal, path: str) -> None:
    append(journal, ("a", b""), ("b", b""), ("c", b""))
    assert journal.offset("x") is None
    journal.commit_offset("x", 2)
    with Journal.open(path, read_only=True) as reader:
        assert reader.offset("x") == 2
        reader.commit_offset("y", 3)
        with pytest.raises(ValueError):
            reader.commit_offset("y", 4)  # beyond the head
    assert journal.consumers() == {"x": 2, "y": 3}
    with spawn(
        """
        import sys
        from sluiceway.journal import Journal
        with Journal.open(sys.argv[1], read_only=True) as r:
            r.commit_offset("z", 1)
            print(sorted(r.consumers().items()))
        """,
        path,
    ) as proc:
        out, err = proc.communicate(timeout=30)
    assert out.strip() == "[('x', 2), ('y', 3), ('z', 1)]", err
    journal.remove_consumer("z")
    assert journal.consumers() == {"x": 2, "y": 3}
    journal.close()
    with Journal.open(path) as again:
        assert again.consumers() == {"x": 2, "y": 3}


def test_offset_log_repairs_a_torn_tail_and_rewrites_itself(path: str) -> None:
    with Journal.open(path) as j:
        append(j, ("a", b""))
        j.commit_offset("c", 1)
    log = os.path.join(path, CONSUMERS_FILE)
    with open(log, "ab") as f:
        f.write(fmt.encode_consumer_entry("torn", 1)[:-2])
    other = OffsetLog(path)
    assert other.offsets() == {"c": 1}
    with Journal.open(path) as j:
        want = {"c": 1}
        for i in range(1500):
            j.commit_offset(f"c{i % 3}", i % 2)
            want[f"c{i % 3}"] = i % 2
        assert j.consumers() == want
    assert os.path.getsize(log) < 1024 * 30  # rewritten, not 1500 entries long
    assert other.offsets() == want  # follows the replaced file
    other.close()


def test_committers_in_other_processes_across_rewrites_lose_nothing(path: str) -> None:
    """Found by the soak (after 68 minutes a sink stopped: "offset log rewrite changed the
    offsets"): a committer waiting for the lock while another rewrote the log got the old file's
    lock when the rewriter let go of it, reopened the new file, found it unlocked and appended,
    while the rewriter was still reading the new file back. Four processes commit their own names
    through many rewrites: no error, and every name ends at its last offset."""
    with Journal.open(path) as j:
        append(j, ("a", b""))
    script = """
        import sys
        from sluiceway.journal.consumers import OffsetLog
        log = OffsetLog(sys.argv[1], fsync=False)
        me = sys.argv[2]
        for i in range(4000):
            log.commit(f"{me}-{i % 2}", i % 7)
        print(sorted(log.offsets().items()))
        """
    procs = [spawn(script, path, str(n)) for n in range(4)]
    outcomes = []
    for cm in procs:
        with cm as proc:
            _out, err = proc.communicate(timeout=120)
            outcomes.append((proc.returncode, err))
    for code, err in outcomes:
        assert code == 0 and "Error" not in err, err[-2000:]
    final = OffsetLog(path).offsets()
    assert final == {f"{n}-{k}": (3998 + k) % 7 for n in range(4) for k in range(2)}
    assert os.path.getsize(os.path.join(path, CONSUMERS_FILE)) < 1024 * 60  # it was rewritten


def test_read_arrow_batches_are_whole_when_appends_fit(journal: Journal) -> None:
    for _ in range(10):
        with journal.append() as tx:
            tx.write_many([(f"k{i}", b"v") for i in range(30)])
    with journal.append() as tx:
        tx.write_many([(f"big{i}", b"v") for i in range(250)])
    sizes = [rb.num_rows for rb in journal.read_arrow(max_rows=100)]
    # Appends of 30 are never split across batches; the 250-record append is cut into ≤ 100.
    assert sizes == [90, 90, 90, 30, 100, 100, 50]
    for rb in journal.read_arrow(max_rows=100, to_offset=300):  # not slices of something bigger
        assert rb.column("offset").buffers()[1].size == 8 * rb.num_rows


def test_registers_of_a_damaged_active_segment_are_a_corrupt_record_error(path: str) -> None:
    # Found by fuzzing (fuzz/journal_segment.py): a reader in another process asking for the
    # registers of a journal whose active segment header is damaged got a bare ValueError.
    with Journal.open(path) as j:
        append(j, ("a", b"1"))
    (segment,) = seg_files(path)
    Path(segment).write_bytes(b"\x87")
    with Journal.open(path, read_only=True) as reader, pytest.raises(CorruptRecordError) as exc:
        reader.registers()
    assert (exc.value.path, exc.value.reason) == (segment, "segment header is truncated")
