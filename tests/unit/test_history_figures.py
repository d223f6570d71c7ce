"""The console's figures from a status report (pure): gauges as read, counts as rates, a count
that went down without a rate, and each kind's series and headline."""

from __future__ import annotations

import pytest

from sluiceway.overview.history.figures import SERIES, Figures, headline, part_id, split_part
from sluiceway.overview.remedies import remedies
from sluiceway.overview.report import (
    CaptureEntry,
    Consumer,
    Health,
    JournalEntry,
    Leader,
    OutboxEntry,
    PipelineEntry,
    SinkEntry,
    StatusReport,
)
from sluiceway.pipeline.state import SinkHealth


def sink(name: str, records: int, lag: int | None, error: dict[str, object] | None = None) -> SinkEntry:
    return SinkEntry(
        name=name, state=SinkHealth.FAILED if error else SinkHealth.OK, committed_batch=1,
        committed_offset=0, last_offset=0, lag=lag, records=records, dead_lettered=0, error=error, skipped=[],
    )  # fmt: skip


def report(head: int, records: int, lsn: str) -> StatusReport:
    return StatusReport(
        generated_at="now",
        outboxes=[OutboxEntry(name="shop", rows=7, oldest_age_seconds=1.5, in_flight=2, dead_letters=0,
                              leader=Leader("sluiceway", "h-1", 3, 10.0, 5.0))],
        journals=[JournalEntry(name="bus", head=head, bytes=10,
                               consumers=[Consumer("a", 0, head), Consumer("b", 0, 1)])],
        pipelines=[PipelineEntry(name="orders", health=Health.STUCK,
                                 sinks=[sink("lake", records, 4), sink("db", 0, 9, {"message": "x"})])],
        captures=[CaptureEntry(name="c1", published_lsn=lsn, error="gone", health=Health.UNAVAILABLE)],
    )  # fmt: skip


def test_gauges_as_read_counts_as_rates() -> None:
    figures = Figures()
    first = figures.take(report(100, 10, "0/100"), 1000.0)
    assert ("outbox/shop", "rows", 7.0) in first and ("outbox/shop", "leader_epoch", 3.0) in first
    assert ("journal/bus", "consumer_lag", 100.0) in first
    assert not [p for p in first if p[1].endswith("rate") or p[1].startswith("rate")], "no rate yet"
    assert ("capture/c1", "health", 2.0) in first and ("pipeline/orders", "failed_sinks", 1.0) in first
    second = dict(((p, s), v) for p, s, v in figures.take(report(150, 30, "0/300"), 1010.0))
    assert second[("journal/bus", "append_rate")] == 5.0
    assert second[("pipeline/orders", "rate:lake")] == 2.0 and second[("pipeline/orders", "rate")] == 2.0
    assert second[("pipeline/orders", "lag")] == 9.0 and second[("pipeline/orders", "lag:db")] == 9.0
    assert second[("capture/c1", "publish_rate")] == pytest.approx(0x200 / 10)
    # A count that went down (a reset) has no rate for that sample, and the next one is from it.
    third = dict(((p, s), v) for p, s, v in figures.take(report(10, 30, "0/300"), 1020.0))
    assert ("journal/bus", "append_rate") not in third
    fourth = dict(((p, s), v) for p, s, v in figures.take(report(30, 30, "0/300"), 1030.0))
    assert fourth[("journal/bus", "append_rate")] == 2.0


def test_parts_kinds_and_headlines() -> None:
    assert part_id("outboxes", "shop") == "outbox/shop" and part_id("capture", "c1") == "capture/c1"
    assert split_part("pipeline/a/b") == ("pipeline", "a/b")
    with pytest.raises(ValueError, match="name one as outbox/<name>"):
        split_part("queue/x")
    assert {k: headline(k).name for k in SERIES} == {
        "outbox": "rows", "journal": "append_rate", "pipeline": "lag", "feed": "ready",
        "capture": "wal_retained_bytes",
    }  # fmt: skip


def test_what_clears_the_trouble() -> None:
    r = report(1, 1, "0/1")
    assert remedies(r.outboxes[0]) == []
    (fix,) = remedies(r.pipelines[0])
    assert "sink db stopped" in fix and "sluice pipeline step" in fix and "--sink db" in fix
    assert remedies(r.captures[0])[0].startswith("it clears by itself once this can be read again")
