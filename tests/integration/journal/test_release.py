"""Releasing a journal's segments below an offset every reader has passed (a capture's journal)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sluiceway.cdc.target import JournalTarget
from sluiceway.journal import Journal
from sluiceway.journal.record import ARROW_SCHEMA
from sluiceway.pipeline.errors import SourceError
from sluiceway.pipeline.sources.journal import JournalStreamReader


def fill(journal: Journal, records: int) -> None:
    for i in range(records):
        with journal.append() as tx:
            tx.write(f"k{i}", b"x" * 200)


def test_release_removes_only_closed_segments_wholly_below_the_offset(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j", segment_bytes=4096) as journal:
        fill(journal, 200)
        bases = [s.base for s in journal.segments()]
        assert len(bases) > 4
        # Below the third segment's base plus one: the first two segments go, the third stays
        # (its first record is below the offset, the rest are not).
        removed = journal.release(bases[2] + 1)
        assert removed == 2
        assert [s.base for s in journal.segments()] == bases[2:]
        assert journal.first_offset() == bases[2]
        assert journal.head == 200  # offsets are never reused
        assert [r.offset for r in journal.read(0, bases[2] + 2)] == [bases[2], bases[2] + 1]
        # The active segment is never released, whatever the offset.
        journal.release(10_000)
        assert journal.segments()[-1].base == bases[-1]
        fill(journal, 1)
        assert journal.head == 201


def batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {"offset": 0, "namespace": "t", "op": "insert", "key": str(i), "value": b"y" * 300,
             "headers": [], "timestamp": None}
            for i in range(n)
        ],
        schema=ARROW_SCHEMA,
    )  # fmt: skip


def test_a_capture_journal_releases_what_every_reader_committed_and_no_more(tmp_path: Path) -> None:
    target = JournalTarget(str(tmp_path / "log"), consumers=("p.fast", "p.slow"), release_every=0)
    target.journal.close()
    target.journal = Journal.open(tmp_path / "log", segment_bytes=4096)
    try:
        for end in range(1, 40):
            target.append(batch(5), end)
        segments = len(target.journal.segments())
        assert segments > 5
        target.journal.commit_offset("p.fast", 150)
        assert target.release() == 0  # p.slow has committed nothing: it holds everything
        target.journal.commit_offset("p.slow", 60)
        assert target.release() > 0
        first = target.journal.first_offset()
        assert 0 < first <= 60  # nothing p.slow has not read is gone
        assert [r.offset for r in target.journal.read(60, 61)] == [60]
    finally:
        target.close()


def test_a_strict_journal_source_refuses_to_skip_released_records(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j", segment_bytes=4096) as journal:
        fill(journal, 100)
        bases = [s.base for s in journal.segments()]
        journal.release(bases[2])
    reader = JournalStreamReader({"path": str(tmp_path / "j"), "strict": "true"})
    with pytest.raises(SourceError, match=rf"at offset 0 but the journal starts at {bases[2]}"):
        reader.latestOffset({"offset": 0}, None)
    assert reader.latestOffset({"offset": bases[2]}, None) == {"offset": 100}
    lenient = JournalStreamReader({"path": str(tmp_path / "j")})
    assert lenient.latestOffset({"offset": 0}, None) == {"offset": 100}  # documented: skips
