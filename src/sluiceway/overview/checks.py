"""Whether something is stuck: the workspace's thresholds applied to a status report.

Pure functions over the report's entries (no I/O), so every rule is tested on hand-made figures.
An entry is ``unavailable`` when it could not be read, ``stuck`` when a threshold is crossed, a
pipeline sink has failed or a capture has no slot or no leader, else ``ok``; ``problems`` says
why, one line each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from sluiceway.cdc.progress import BinlogStatus
from sluiceway.overview.report import (
    KINDS,
    CaptureEntry,
    Entry,
    FeedEntry,
    JournalEntry,
    OutboxEntry,
    PipelineEntry,
    StatusReport,
    judged,
)
from sluiceway.overview.workspace import SINGULAR, Checks
from sluiceway.pipeline.state import SinkHealth

E = TypeVar("E", bound=Entry)


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def outbox_problems(entry: OutboxEntry, checks: Checks) -> list[str]:
    problems = []
    age = entry.oldest_age_seconds
    if checks.outbox_oldest_age is not None and age is not None and age > checks.outbox_oldest_age:
        problems.append(f"oldest row is {_seconds(age)} old (threshold {_seconds(checks.outbox_oldest_age)})")
    dead = entry.dead_letters
    if checks.dead_letters is not None and dead is not None and dead > checks.dead_letters:
        problems.append(f"{dead} dead letters (threshold {checks.dead_letters})")
    return problems


def journal_problems(entry: JournalEntry, checks: Checks) -> list[str]:
    if checks.journal_consumer_lag is None:
        return []
    return [
        f"consumer {c.name} is {c.lag} records behind (threshold {checks.journal_consumer_lag})"
        for c in entry.consumers or []
        if c.lag > checks.journal_consumer_lag
    ]


def pipeline_problems(entry: PipelineEntry, checks: Checks) -> list[str]:
    # A sink's lag is records of its source (for CDC: of the capture's journal); the WAL a CDC slot
    # retains — the capture behind, or the pipeline stopped — has its own threshold.
    problems = []
    unit, limit = "records", checks.pipeline_lag
    slot = entry.cdc and entry.cdc.slot
    binlog = entry.cdc.binlog if entry.cdc else None
    if checks.cdc_lag_bytes is not None and slot and slot.wal_retained_bytes > checks.cdc_lag_bytes:
        problems.append(
            f"slot {slot.slot} retains {slot.wal_retained_bytes} bytes of WAL "
            f"(threshold {checks.cdc_lag_bytes}): is the pipeline's capture running?"
        )
    if (behind := _binlog_behind(binlog, checks)) is not None:
        problems.append(f"{behind}: is the pipeline's capture running?")
    for sink in entry.sinks or []:
        if sink.state == SinkHealth.FAILED:
            error = sink.error or {}
            at = f" at offset {error['offset']}" if error.get("offset") is not None else ""
            message = str(error.get("message", "")).splitlines()[0] if error.get("message") else ""
            problems.append(f"sink {sink.name} stopped{at}: {message}"[:300])
        lag = sink.lag
        if limit is not None and lag is not None and lag > limit:
            problems.append(f"sink {sink.name} is {lag} {unit} behind (threshold {limit})")
    return problems


def feed_problems(entry: FeedEntry, checks: Checks) -> list[str]:
    expired = entry.expired_leases
    if checks.expired_leases is not None and expired is not None and expired > checks.expired_leases:
        owners = [w.owner for w in entry.workers or [] if w.expired_leases]
        return [f"{expired} expired leases (threshold {checks.expired_leases}) held by {', '.join(owners)}"]
    return []


def capture_problems(entry: CaptureEntry, checks: Checks) -> list[str]:
    # A capture that never ran has no slot; one that stopped leaves its slot holding WAL and its
    # lease to run out (a stop releases it at once). Either says the daemon is not doing its job.
    problems = []
    slot = entry.slot
    if slot is None:
        if not entry.reads_binlog:
            problems.append(f"slot {entry.slot_name} does not exist: has the capture run?")
    elif checks.cdc_lag_bytes is not None and slot.wal_retained_bytes > checks.cdc_lag_bytes:
        problems.append(
            f"slot {slot.slot} retains {slot.wal_retained_bytes} bytes of WAL "
            f"(threshold {checks.cdc_lag_bytes}): is sluice capture keeping up?"
        )
    if (behind := _binlog_behind(entry.binlog, checks)) is not None:
        problems.append(f"{behind}: is sluice capture keeping up?")
    stuck = entry.refusals and entry.refusals.stuck
    if stuck:
        problems.append(
            f"stopped on a change its destination refuses: {stuck['table']} key {stuck['key']!r} at "
            f"{stuck['lsn']} ({stuck['refusal']}): sluice capture inspect -f {entry.file}"
        )
    leader = entry.leader
    # The database clock decides expiry: a holder whose lease ran out holds nothing.
    if (
        entry.election
        and entry.election.kind == "database"
        and (leader is None or leader.expires_in_seconds <= 0)
    ):
        problems.append("no process holds the lease: is sluice capture running?")
    return problems


def _binlog_behind(binlog: BinlogStatus | None, checks: Checks) -> str | None:
    """A binlog capture further behind its server than ``cdcLagBytes``: what to say, else ``None``
    (the server keeps nothing for the capture: binlogs are purged by age, whatever it has read)."""
    limit = checks.cdc_lag_bytes
    if binlog is None or binlog.behind_bytes is None or limit is None or binlog.behind_bytes <= limit:
        return None
    return (
        f"the capture is {binlog.behind_bytes} bytes of binlog behind server id {binlog.server_id} "
        f"(threshold {limit}; the server purges binlogs by age, not by what was read)"
    )


def _judge(entries: Sequence[E], rule: Callable[[E, Checks], list[str]], checks: Checks) -> list[E]:
    return [judged(e, [] if e.error else rule(e, checks)) for e in entries]


def evaluate(report: StatusReport, checks: Checks) -> StatusReport:
    """The report with every entry's ``problems`` and ``health`` set by ``checks``."""
    return replace(
        report,
        outboxes=_judge(report.outboxes, outbox_problems, checks),
        journals=_judge(report.journals, journal_problems, checks),
        pipelines=_judge(report.pipelines, pipeline_problems, checks),
        feeds=_judge(report.feeds, feed_problems, checks),
        captures=_judge(report.captures, capture_problems, checks),
    )


def unhealthy(report: StatusReport) -> list[str]:
    """``kind name: problem`` for every problem in the report (empty: all is well)."""
    return [
        f"{SINGULAR[kind]} {entry.name}: {problem}"
        for kind in KINDS
        for entry in report.entries(kind)
        for problem in entry.problems
    ]
