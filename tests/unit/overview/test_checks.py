"""The checks that judge a status report: pure rules on hand-made figures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sluiceway.cdc.progress import CdcStatus, SlotStatus
from sluiceway.overview import Checks, StatusReport, evaluate, unhealthy
from sluiceway.overview.report import (
    CaptureEntry,
    Consumer,
    Election,
    FeedEntry,
    JournalEntry,
    Leader,
    OutboxEntry,
    PipelineEntry,
    SinkEntry,
    WorkerLeases,
)
from sluiceway.pipeline.state import SinkHealth


def report(**kinds: list[Any]) -> StatusReport:
    """A report of ``kinds``' entries, each named ``<kind>-<i>``."""
    named = {kind: [replace(e, name=f"{kind}-{i}") for i, e in enumerate(es)] for kind, es in kinds.items()}
    return StatusReport(generated_at="2026-12-02T00:00:00+00:00", **named)


def sink(state: str = "ok", lag: int = 0, error: dict[str, Any] | None = None) -> SinkEntry:
    return SinkEntry(
        name="s" if error is None else "db", state=SinkHealth(state), committed_batch=None,
        committed_offset=None, last_offset=None, lag=lag, records=0, dead_lettered=0, error=error, skipped=[],
    )  # fmt: skip


def slot(retained: int) -> SlotStatus:
    return SlotStatus("shop", "0/16B3748", "0/16B3748", retained, None)


def worker(owner: str, expired: int) -> WorkerLeases:
    return WorkerLeases(
        owner=owner, partitions=expired, live_leases=0, expired_leases=expired, lease_until=None
    )


def test_thresholds_make_an_entry_stuck_and_say_why() -> None:
    r = report(
        outboxes=[
            OutboxEntry(name="", oldest_age_seconds=301.0, dead_letters=0),
            OutboxEntry(name="", oldest_age_seconds=299.0, dead_letters=9),
        ],
        journals=[JournalEntry(name="", consumers=[Consumer("c", 0, 10**6)])],
        pipelines=[
            PipelineEntry(name="", source="journal", sinks=[sink(lag=10_001)]),
            PipelineEntry(
                name="",
                source="postgres-cdc",
                sinks=[sink(lag=9_999)],
                cdc=CdcStatus(tables=[], slot=slot((1 << 30) + 1), journal=None),
            ),
        ],
        feeds=[FeedEntry(name="", expired_leases=1, workers=[worker("w1", 1)])],
    )
    r = evaluate(r, Checks())
    assert [e.health for e in r.outboxes] == ["stuck", "ok"], "dead letters are off by default"
    assert r.outboxes[0].problems == ["oldest row is 5m old (threshold 5m)"]
    assert r.journals[0].health == "ok", "consumer lag is off by default"
    assert r.pipelines[0].problems == ["sink s is 10001 records behind (threshold 10000)"]
    assert r.pipelines[1].problems == [
        "slot shop retains 1073741825 bytes of WAL (threshold 1073741824): is the pipeline's capture running?"
    ], "a CDC sink's lag is records; the WAL the slot holds has its own threshold"
    assert r.feeds[0].problems == ["1 expired leases (threshold 0) held by w1"]
    assert unhealthy(r)[0] == "outbox outboxes-0: oldest row is 5m old (threshold 5m)"


def test_checks_can_be_turned_off_or_on() -> None:
    r = report(
        outboxes=[OutboxEntry(name="", oldest_age_seconds=10**6, dead_letters=3)],
        journals=[JournalEntry(name="", consumers=[Consumer("c", 0, 11)])],
        feeds=[FeedEntry(name="", expired_leases=4, workers=[])],
    )
    r = evaluate(
        r, Checks(outbox_oldest_age=None, dead_letters=2, journal_consumer_lag=10, expired_leases=None)
    )
    assert r.outboxes[0].problems == ["3 dead letters (threshold 2)"]
    assert r.journals[0].problems == ["consumer c is 11 records behind (threshold 10)"]
    assert r.feeds[0].health == "ok"


def test_a_failed_sink_is_always_stuck_and_an_unreadable_entry_unavailable() -> None:
    failed = sink("failed", error={"offset": 7, "message": "boom\ntrace"})
    r = report(
        pipelines=[PipelineEntry(name="", source="kafka", sinks=[failed])],
        feeds=[FeedEntry(name="", error="no such table")],
    )
    r = evaluate(r, Checks(pipeline_lag=None))
    assert r.pipelines[0].problems == ["sink db stopped at offset 7: boom"]
    assert (r.feeds[0].health, r.feeds[0].problems) == (
        "unavailable",
        ["cannot be read: no such table"],
    )


def capture(**fields: Any) -> CaptureEntry:
    """A capture entry that is healthy unless ``fields`` say otherwise."""
    entry = CaptureEntry(
        name="",
        slot_name="shop",
        election=Election("database", "capture.shop"),
        slot=slot(4096),
        leader=Leader("capture.shop", "host-1", 1, 10.0, 4.2),
    )
    return replace(entry, **fields)


def test_a_capture_is_stuck_without_its_slot_or_a_leader_or_past_the_wal_threshold() -> None:
    r = report(
        captures=[
            capture(),
            capture(slot=None),
            capture(slot=slot((1 << 30) + 1)),
            capture(leader=None),
            capture(leader=Leader("capture.shop", "host-1", 1, 10.0, -0.5)),
            capture(election=Election("kafka", "capture.shop"), leader=None),
            capture(error="connection refused"),
        ]
    )
    r = evaluate(r, Checks())
    problems = [e.problems for e in r.captures]
    assert problems == [
        [],
        ["slot shop does not exist: has the capture run?"],
        ["slot shop retains 1073741825 bytes of WAL (threshold 1073741824): is sluice capture keeping up?"],
        ["no process holds the lease: is sluice capture running?"],
        ["no process holds the lease: is sluice capture running?"],  # the holder's lease ran out
        [],  # NELI (kafka) has no lease row to read: no leader is not a problem
        ["cannot be read: connection refused"],
    ]
    assert [e.health for e in r.captures] == ["ok", *["stuck"] * 4, "ok", "unavailable"]
    assert unhealthy(r)[0] == "capture captures-1: slot shop does not exist: has the capture run?"


def test_the_capture_wal_threshold_is_the_cdc_one_and_can_be_turned_off() -> None:
    r = report(captures=[capture(slot=slot(10**12))])
    assert evaluate(r, Checks(cdc_lag_bytes=None)).captures[0].health == "ok"
    stuck = evaluate(r, Checks(cdc_lag_bytes=10**12 - 1))
    assert stuck.captures[0].problems[0].startswith("slot shop retains 1000000000000 bytes of WAL")


def test_judging_changes_nothing_in_the_report_it_is_given() -> None:
    r = report(outboxes=[OutboxEntry(name="", oldest_age_seconds=10**6)])
    judged = evaluate(r, Checks())
    assert (
        judged.outboxes[0].health == "stuck" and r.outboxes[0].health == "ok" and r.outboxes[0].problems == []
    )
