"""The status report's records: one typed entry per kind of part, and the report that holds them.

Every entry starts with ``name``, ``health``, ``problems`` and ``error``; its other fields are
``None`` when it could not be read (``error`` says why), so the shape never changes. The report's
JSON (:meth:`StatusReport.to_json`: ``sluice status --format json`` and the console's
``/api/status``) is a public interface, documented in docs/operations.md and pinned by
tests/integration/overview/test_status_wire.py: the fields here are in its order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from sluiceway.cdc.progress import BinlogStatus, CdcStatus, SlotStatus, TableProgress
from sluiceway.pipeline.state import SinkHealth

#: The report's kinds of part, in its order (its keys, after ``generated_at``).
KINDS = ("outboxes", "journals", "pipelines", "feeds", "captures")


class Health(StrEnum):
    OK = "ok"
    #: A threshold is crossed, a sink has failed, a capture has no slot or no leader.
    STUCK = "stuck"
    #: It could not be read (``error`` says why).
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class Leader:
    """The holder of a database lease, by the database's clock."""

    election: str
    holder: str
    epoch: int
    #: How long it has held the lease (``None`` on a table no harvester of this version has used yet).
    term_seconds: float | None
    expires_in_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    name: str
    health: Health = Health.OK
    problems: list[str] = field(default_factory=list)
    error: str | None = None


# -- outboxes and journals ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEntry(Entry):
    dsn: str | None = None
    table: str | None = None
    rows: int | None = None
    oldest_age_seconds: float | None = None
    in_flight: int | None = None
    dead_letters: int | None = None
    leader: Leader | None = None


@dataclass(frozen=True, slots=True)
class Consumer:
    name: str
    offset: int
    lag: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEntry(Entry):
    path: str | None = None
    head: int | None = None
    start: int | None = None
    segments: int | None = None
    bytes: int | None = None
    consumers: list[Consumer] | None = None


# -- pipelines ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SinkEntry:
    name: str
    state: SinkHealth
    committed_batch: int | None
    #: The source position committed: an offset, or per partition for Kafka.
    committed_offset: Any
    last_offset: int | None
    lag: int | None
    records: int
    dead_lettered: int
    #: Why the sink stopped, as its state file holds it (``offset``, ``batch``, ``message``,
    #: ``at``, and ``detail`` when there is more to it); ``None``: it has not.
    error: dict[str, Any] | None
    skipped: list[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineEntry(Entry):
    spec: str | None = None
    source: str | None = None
    sinks: list[SinkEntry] | None = None
    #: A CDC source's tables, slot and journal (``None`` for other sources).
    cdc: CdcStatus | None = None


# -- feeds ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GateCount:
    status: str
    gate: int
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLeases:
    owner: str
    partitions: int
    live_leases: int
    expired_leases: int
    #: When its latest lease runs out (ISO-8601).
    lease_until: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLevel:
    """A rate limit's bucket now (docs/feed.md#rate-limits)."""

    attribute: str | None
    value: str | None
    max_rate: float
    burst: float
    tokens: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduled:
    """Work not due yet (docs/feed.md#scheduled-work), and when the first of it is."""

    partitions: int
    items: int
    next_due: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedEntry(Entry):
    prefix: str | None = None
    partitions: list[GateCount] | None = None
    items: list[GateCount] | None = None
    items_by_status: dict[str, int] | None = None
    ready_items: int | None = None
    oldest_available_age_seconds: float | None = None
    workers: list[WorkerLeases] | None = None
    live_leases: int | None = None
    expired_leases: int | None = None
    #: ``[]`` when no rate is set.
    rate_limits: list[RateLevel] | None = None
    scheduled: Scheduled | None = None


# -- captures -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Election:
    kind: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRefusals:
    """Changes the destination refuses for good (docs/cdc.md, "A change the destination refuses")."""

    #: The change the capture stopped on, as ``sluice capture inspect`` shows it.
    stuck: dict[str, Any] | None
    to_skip: int
    skipped: int
    dead_lettered: int


#: How a MariaDB/MySQL capture's ``slot_name`` begins: it reads the binlog and holds no slot.
BINLOG_READER = "binlog replica "


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureEntry(Entry):
    file: str | None = None
    destination: str | None = None
    #: The replication slot, or ``binlog replica <serverId>`` (:data:`BINLOG_READER`).
    slot_name: str | None = None
    election: Election | None = None
    state_dir: str | None = None
    slot: SlotStatus | None = None
    leader: Leader | None = None
    #: The position the destination acknowledged (an LSN, or ``binlog.000003:1234``).
    published_lsn: str | None = None
    tables: list[TableProgress] | None = None
    refusals: CaptureRefusals | None = None
    #: A binlog capture's place on its server (in place of ``slot``).
    binlog: BinlogStatus | None = None

    @property
    def reads_binlog(self) -> bool:
        """A MariaDB/MySQL capture: it holds no slot (``slot`` is always ``None``)."""
        return (self.slot_name or "").startswith(BINLOG_READER)


# -- the report -----------------------------------------------------------------------------------
E = TypeVar("E", bound=Entry)


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReport:
    generated_at: str
    outboxes: list[OutboxEntry] = field(default_factory=list)
    journals: list[JournalEntry] = field(default_factory=list)
    pipelines: list[PipelineEntry] = field(default_factory=list)
    feeds: list[FeedEntry] = field(default_factory=list)
    captures: list[CaptureEntry] = field(default_factory=list)

    def entries(self, kind: str) -> list[Entry]:
        """The entries of ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise ValueError(f"no kind {kind!r} in a status report (one of {', '.join(KINDS)})")
        found: list[Entry] = getattr(self, kind)
        return found

    def find(self, kind: str, name: str) -> Entry | None:
        """The entry ``name`` of ``kind``, or ``None``."""
        return next((e for e in self.entries(kind) if e.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready values: the wire form of ``/api/status`` and ``--format json``."""
        return asdict(self)


def judged(entry: E, problems: list[str]) -> E:
    """``entry`` with its ``problems`` set, and the health they mean."""
    if entry.error:
        return replace(entry, problems=[f"cannot be read: {entry.error}"], health=Health.UNAVAILABLE)
    return replace(entry, problems=problems, health=Health.STUCK if problems else Health.OK)
