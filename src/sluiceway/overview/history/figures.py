"""Which figures of a status report are kept over time, and how a report becomes points.

Pure: a :class:`~sluiceway.overview.report.StatusReport` and a time in, points out. A gauge (a
backlog, a lag, the WAL a slot retains) is kept as read; a count that only grows (a journal's
head, a sink's records, a feed's completed items, a capture's published position) is kept as its
rate since the sample before, so that a chart of it says "records per second". A count that went
down (a sink's state reset, partitions deleted) has no rate for that sample rather than a wrong one.

Each part has a *headline* series: the one figure its overview row draws as a sparkline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluiceway.cdc.pgoutput import parse_lsn
from sluiceway.overview.report import (
    KINDS,
    CaptureEntry,
    Entry,
    FeedEntry,
    Health,
    JournalEntry,
    OutboxEntry,
    PipelineEntry,
    StatusReport,
)
from sluiceway.overview.workspace import SINGULAR


@dataclass(frozen=True, slots=True)
class Series:
    """One kept figure of a part: its ``name`` in ``/api/history``, a label and a unit."""

    name: str
    label: str
    unit: str


#: The health of a part as a number (0 ok, 1 stuck, 2 unavailable): its problems over time.
HEALTH_VALUE = {Health.OK: 0.0, Health.STUCK: 1.0, Health.UNAVAILABLE: 2.0}

HEALTH = Series("health", "health (0 ok, 1 stuck, 2 unreadable)", "state")

#: The series of each kind, headline first. A pipeline has ``lag:<sink>`` and ``rate:<sink>``
#: besides, one pair per sink (:func:`series_of`).
SERIES: dict[str, tuple[Series, ...]] = {
    "outbox": (
        Series("rows", "backlog", "records"),
        Series("oldest_age_seconds", "oldest row's age", "s"),
        Series("in_flight", "in flight", "records"),
        Series("dead_letters", "dead letters", "records"),
        Series("leader_epoch", "leader's epoch", "epoch"),
        HEALTH,
    ),
    "journal": (
        Series("append_rate", "appended", "records/s"),
        Series("bytes", "size", "B"),
        Series("consumer_lag", "slowest consumer's lag", "records"),
        HEALTH,
    ),
    "pipeline": (
        Series("lag", "largest sink lag", "records"),
        Series("rate", "records written (all sinks)", "records/s"),
        Series("failed_sinks", "stopped sinks", "sinks"),
        HEALTH,
    ),
    "feed": (
        Series("ready", "ready now", "items"),
        Series("available", "available", "items"),
        Series("complete_rate", "completed", "items/s"),
        Series("failed", "failed", "items"),
        Series("leased", "partitions leased", "partitions"),
        Series("expired_leases", "expired leases", "partitions"),
        HEALTH,
    ),
    "capture": (
        Series("wal_retained_bytes", "WAL retained by the slot (a binlog: bytes not yet published)", "B"),
        Series("publish_rate", "WAL published (PostgreSQL)", "B/s"),
        Series("rows_copied", "rows copied", "rows"),
        Series("skipped", "changes skipped", "changes"),
        Series("dead_lettered", "changes dead-lettered", "changes"),
        Series("leader_epoch", "leader's epoch", "epoch"),
        HEALTH,
    ),
}


def part_id(kind: str, name: str) -> str:
    """A part as ``/api/history`` names it: ``outbox/shop`` (``kind`` is a report kind or singular)."""
    return f"{SINGULAR.get(kind, kind)}/{name}"


def split_part(part: str) -> tuple[str, str]:
    """``outbox/shop`` → ``("outbox", "shop")``; :class:`ValueError` for anything else."""
    kind, _, name = part.partition("/")
    if kind not in SERIES or not name:
        kinds = ", ".join(f"{k}/<name>" for k in SERIES)
        raise ValueError(f"part {part!r}: name one as {kinds}")
    return kind, name


def headline(kind: str) -> Series:
    return SERIES[kind][0]


def series_of(kind: str, names: list[str]) -> list[Series]:
    """The series of a part of ``kind``, and of the sinks among ``names`` (``lag:…``, ``rate:…``)."""
    return list(SERIES[kind]) + sink_series(names)


def sink_series(names: list[str]) -> list[Series]:
    """A pipeline's per-sink series, for the sinks named in ``names`` (``lag:…``, ``rate:…``)."""
    found: list[Series] = []
    sinks = sorted({n.split(":", 1)[1] for n in names if n.startswith(("lag:", "rate:"))})
    for sink in sinks:
        found.append(Series(f"lag:{sink}", f"lag of {sink}", "records"))
        found.append(Series(f"rate:{sink}", f"written by {sink}", "records/s"))
    return found


#: One point: the part, the series and its value (the time is the sample's).
Point = tuple[str, str, float]


@dataclass
class Figures:
    """Turns reports into points; remembers the counts of the sample before, for rates."""

    #: (part, series) → (time, count) of the last sample that had it.
    counts: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def take(self, report: StatusReport, at: float) -> list[Point]:
        """The points of ``report``, read at ``at`` (seconds since the epoch)."""
        points: list[Point] = []
        for kind in KINDS:
            for entry in report.entries(kind):
                part = part_id(kind, entry.name)
                gauges, counts = _read(entry)
                points.append((part, HEALTH.name, HEALTH_VALUE[entry.health]))
                points.extend(
                    (part, name, float(value)) for name, value in gauges.items() if value is not None
                )
                for name, value in counts.items():
                    rate = self._rate(part, name, at, value)
                    if rate is not None:
                        points.append((part, name, rate))
        return points

    def _rate(self, part: str, name: str, at: float, value: float | None) -> float | None:
        if value is None:
            return None
        before = self.counts.get((part, name))
        self.counts[(part, name)] = (at, value)
        if before is None or at <= before[0] or value < before[1]:
            return None
        return (value - before[1]) / (at - before[0])


Values = dict[str, float | None]


def _read(entry: Entry) -> tuple[Values, Values]:
    """An entry's gauges, and its counts (kept as rates, under the rate's series name)."""
    if isinstance(entry, OutboxEntry):
        return {
            "rows": entry.rows,
            "oldest_age_seconds": entry.oldest_age_seconds,
            "in_flight": entry.in_flight,
            "dead_letters": entry.dead_letters,
            "leader_epoch": None if entry.leader is None else entry.leader.epoch,
        }, {}
    if isinstance(entry, JournalEntry):
        lags = [c.lag for c in entry.consumers or []]
        return (
            {"bytes": entry.bytes, "consumer_lag": max(lags) if lags else None},
            {"append_rate": entry.head},
        )
    if isinstance(entry, PipelineEntry):
        if entry.sinks is None:
            return {}, {}
        gauges: Values = {"failed_sinks": sum(1 for s in entry.sinks if s.error is not None)}
        counts: Values = {}
        known = [s.lag for s in entry.sinks if s.lag is not None]
        gauges["lag"] = max(known) if known else None
        for s in entry.sinks:
            gauges[f"lag:{s.name}"] = s.lag
            counts[f"rate:{s.name}"] = s.records
        counts["rate"] = sum(s.records for s in entry.sinks)
        return gauges, counts
    if isinstance(entry, FeedEntry):
        statuses = entry.items_by_status
        if statuses is None:
            return {}, {}
        return {
            "ready": entry.ready_items,
            "available": statuses.get("available"),
            "failed": statuses.get("failed"),
            "leased": entry.live_leases,
            "expired_leases": entry.expired_leases,
        }, {"complete_rate": statuses.get("complete")}
    if isinstance(entry, CaptureEntry):
        refusals = entry.refusals
        retained, published = None, None
        if entry.slot is not None:
            retained = entry.slot.wal_retained_bytes
        elif entry.binlog is not None:
            retained = entry.binlog.behind_bytes
        # A binlog position is a file and an offset: no byte count across files, so no rate.
        if entry.published_lsn is not None and not entry.reads_binlog:
            published = parse_lsn(entry.published_lsn)
        return {
            "wal_retained_bytes": retained,
            "rows_copied": None if entry.tables is None else sum(t.rows_copied for t in entry.tables),
            "skipped": None if refusals is None else refusals.skipped,
            "dead_lettered": None if refusals is None else refusals.dead_lettered,
            "leader_epoch": None if entry.leader is None else entry.leader.epoch,
        }, {"publish_rate": published}
    raise TypeError(f"no figures for {type(entry).__name__}")
