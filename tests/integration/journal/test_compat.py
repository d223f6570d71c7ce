"""Journals written in format 1 (before format 2) stay readable, writable and compactable.

``v1_journal/`` was written by the format-1 code (``make_v1_fixture.py`` says how), and
``v1_expected.json`` is what that code read back from it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from sluiceway.journal import Journal, Record, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.format import KIND_BATCH, KIND_BEGIN
from tests.support import journal_v1
from tests.support.journal import append
from tests.support.journal_format import as_rows

FIXTURE = Path(__file__).parent / "v1_journal"
EXPECTED = json.loads((Path(__file__).parent / "v1_expected.json").read_text())


def expected_records() -> list[Record]:
    return [
        Record(
            r["offset"],
            r["namespace"],
            r["key"],
            None if r["value"] is None else base64.b64decode(r["value"]),
            [tuple(h) for h in r["headers"]],  # type: ignore[misc]
            r["timestamp_us"],
        )
        for r in EXPECTED["records"]
    ]


@pytest.fixture
def path(tmp_path: Path) -> str:
    target = tmp_path / "journal"
    shutil.copytree(FIXTURE, target)
    return str(target)


def batches(seg: str) -> list[parse.ParsedBatch]:
    buf = Path(seg).read_bytes()
    out, pos = [], fmt.decode_segment_header(buf).data_start
    while pos < len(buf):
        batch = parse.parse_batch(buf, pos)
        assert isinstance(batch, parse.ParsedBatch)
        out.append(batch)
        pos = batch.next_pos
    return out


def test_the_frozen_format1_encoder_matches_the_fixture() -> None:
    """``tests/support/journal_v1.py`` re-encodes every fixture batch to the very bytes format 1 wrote."""
    segments = sorted(FIXTURE.glob("*.seg"))
    # The fixture is there, whole: an empty folder would let every check below pass unchecked.
    assert [seg.name for seg in segments] == [fmt.segment_name(base) for base in EXPECTED["segments"]]
    assert EXPECTED["records"], "v1_expected.json lists no records"
    checked = 0
    for seg in segments:
        buf = seg.read_bytes()
        header = fmt.decode_segment_header(buf)
        assert header.version == 1
        assert buf[: header.data_start] == journal_v1.segment_header(
            header.base, header.created_us, header.registers
        )
        for b in batches(str(seg)):
            assert b.kind == KIND_BEGIN
            recs = list(parse.iter_records(buf, b, b.first, b.end))
            again = journal_v1.encode_batch(
                [(r.namespace, r.key, r.value, r.headers, r.timestamp_us) for r in recs],
                b.first,
                b.commit_time_us,
                b.registers,
                offsets=[r.offset for r in recs],
                end=b.end,
                flags=b.flags,
            )
            assert again == buf[b.pos : b.next_pos]
            checked += len(recs)
    assert checked == len(EXPECTED["records"])


def test_a_format1_journal_reads_as_it_did(path: str) -> None:
    assert Journal.head_offset(path) == EXPECTED["head"]
    with Journal.open(path, read_only=True) as j:
        assert j.head == EXPECTED["head"]
        assert j.registers() == EXPECTED["registers"]
        assert [s.base for s in j.segments()] == EXPECTED["segments"]
        assert j.consumers() == EXPECTED["consumers"]
        assert list(j.read()) == expected_records()
        assert [row for rb in j.read_arrow() for row in rb.to_pylist()] == as_rows(expected_records())
        assert [r.offset for r in j.read(30, 40)] == list(range(30, 40))


def test_a_writer_appends_format2_to_a_new_segment(path: str) -> None:
    active = os.path.join(path, fmt.segment_name(EXPECTED["segments"][-1]))
    before = {p.name: p.read_bytes() for p in Path(path).glob("*.seg")}
    head = EXPECTED["head"]
    with Journal.open(path, segment_bytes=4096) as j:
        # Opening recovered the format-1 active segment, then rolled: old segments are untouched.
        assert [s.base for s in j.segments()] == [*EXPECTED["segments"], head]
        assert {n: (Path(path) / n).read_bytes() for n in before} == before
        assert append(j, ("new-1", b"a"), ("new-2", None)) == range(head, head + 2)
        with j.append(set_registers={"epoch": "3"}) as tx:
            tx.write_many([(f"bulk-{i}", bytes(i)) for i in range(50)], namespace="ns")
        assert j.registers() == {**EXPECTED["registers"], "epoch": "3"}
    newest = os.path.join(path, fmt.segment_name(head))
    assert fmt.decode_segment_header(Path(newest).read_bytes()).version == fmt.SEGMENT_VERSION
    assert [b.kind for b in batches(newest)] == [KIND_BATCH, KIND_BATCH]
    assert [b.kind for b in batches(active)] == [KIND_BEGIN]
    with Journal.open(path, read_only=True) as j:
        records = list(j.read())
        assert records[: len(EXPECTED["records"])] == expected_records()
        assert [r.key for r in records[len(EXPECTED["records"]) :][:3]] == ["new-1", "new-2", "bulk-0"]
        assert j.head == head + 52 and j.registers()["epoch"] == "3"
        assert [row for rb in j.read_arrow() for row in rb.to_pylist()] == as_rows(records)
    with Journal.open(path) as j:  # the active segment is now format 2: no further roll
        assert [s.base for s in j.segments()] == [*EXPECTED["segments"], head]


def test_compaction_rewrites_format1_segments_into_mixed_ones(path: str) -> None:
    with Journal.open(path, segment_bytes=4096) as j:
        for n in range(6):
            append(j, (f"k{n % 3}", b"newer" * 50))  # supersedes k0..k2 in the format-1 segments
        j.commit_offset("billing", j.head)
        everything = list(j.read())
        assert j.compact().records_removed > 0
        # Below the active segment, only the latest record of each key survives.
        active = j.segments()[-1].base
        latest = {(r.namespace, r.key): r.offset for r in everything}
        want = [r for r in everything if r.offset >= active or latest[(r.namespace, r.key)] == r.offset]
        assert list(j.read()) == want
        assert [row for rb in j.read_arrow() for row in rb.to_pylist()] == as_rows(want)
        # Untouched format-1 batches sit next to the rewritten (format-2) ones.
        assert {b.kind for s in j.segments()[:-1] for b in batches(s.path)} == {KIND_BEGIN, KIND_BATCH}
        assert j.registers() == EXPECTED["registers"]
    with Journal.open(path, read_only=True) as j:
        assert j.head == EXPECTED["head"] + 6
        assert j.registers() == EXPECTED["registers"]


def test_a_torn_format1_tail_is_truncated_then_the_journal_moves_on(path: str) -> None:
    active = os.path.join(path, fmt.segment_name(EXPECTED["segments"][-1]))
    good = Path(active).read_bytes()
    head = EXPECTED["head"]
    torn = journal_v1.encode_batch([("", "torn", b"x" * 300, [], 0)], head, registers={"epoch": "9"})
    with open(active, "ab") as f:
        f.write(torn[:-20])  # the writer died before its COMMIT frame was whole
    with Journal.open(path) as j:
        assert Path(active).read_bytes() == good
        assert j.registers() == EXPECTED["registers"]
        assert append(j, ("after", b"")) == range(head, head + 1)
        assert list(j.read())[:-1] == expected_records()


def test_an_empty_format1_segment_is_replaced_in_place(tmp_path: Path) -> None:
    """A format-1 active segment holding no records yet is swapped for a format-2 one with the
    same base, creation time and registers (no second segment at the same offset)."""
    path = tmp_path / "journal"
    path.mkdir()
    seg = path / fmt.segment_name(5)
    body = journal_v1.encode_batch([], 5, registers={"leader": "b"})
    seg.write_bytes(journal_v1.segment_header(5, 42, {"epoch": "1"}) + body)
    with Journal.open(str(path)) as j:
        assert [s.base for s in j.segments()] == [5]
        assert j.head == 5 and j.registers() == {"epoch": "1", "leader": "b"}
        header = fmt.decode_segment_header(seg.read_bytes())
        assert (header.version, header.base, header.created_us) == (fmt.SEGMENT_VERSION, 5, 42)
        assert header.registers == {"epoch": "1", "leader": "b"}
        assert append(j, ("a", b"1")) == range(5, 6)
    with Journal.open(str(path), read_only=True) as j:
        assert [(r.offset, r.key) for r in j.read()] == [(5, "a")]
        assert j.registers() == {"epoch": "1", "leader": "b"}
