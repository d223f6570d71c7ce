"""Journals written in format 1 stay readable: the fixture below is the reference.

``v1_journal/`` was written by the format-1 code (``make_v1_fixture.py`` says how), and
``v1_expected.json`` is what that code read back from it.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from sluiceway.journal import Journal, Record, parse
from sluiceway.journal import format as fmt
from sluiceway.journal.format import KIND_BEGIN
from tests import journal_v1

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


def as_rows(records: list[Record]) -> list[dict[str, object]]:
    return [
        {
            "offset": r.offset,
            "namespace": r.namespace,
            "op": "insert",
            "key": r.key,
            "value": r.value,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
            "timestamp": r.timestamp,
        }
        for r in records
    ]


def test_the_frozen_format1_encoder_matches_the_fixture() -> None:
    """``tests/journal_v1.py`` re-encodes every fixture batch to the very bytes format 1 wrote."""
    for seg in sorted(FIXTURE.glob("*.seg")):
        buf = seg.read_bytes()
        header = fmt.decode_segment_header(buf)
        assert buf[: header.data_start] == journal_v1.segment_header(
            header.base, header.created_us, header.registers
        )
        for b in batches(str(seg)):
            assert buf[b.pos + 8] == KIND_BEGIN
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
