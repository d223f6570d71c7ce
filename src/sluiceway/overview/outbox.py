"""An outbox as the operator sees it: its backlog and leader, the rows at its head, its dead
letters. Reads only (``outbox stats``, the lease by :func:`~sluiceway.overview.leases.leader_of`);
retrying or resolving a dead letter is an action (:mod:`sluiceway.overview.actions`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sluiceway.db import Database, QuerySet, parse_dsn
from sluiceway.outbox import OutboxLayout, discover, outbox_stats
from sluiceway.overview.leases import leader_of
from sluiceway.overview.report import OutboxEntry
from sluiceway.overview.values import iso, preview
from sluiceway.overview.workspace import OutboxWatch


def _queries(db: Database, layout: OutboxLayout) -> QuerySet:
    return QuerySet("sluiceway.overview", db.dialect, outbox=layout.table, dead=layout.dead_table)


def outbox_settings(watch: OutboxWatch) -> OutboxEntry:
    """The fields the workspace alone gives (shown even when the database cannot be read)."""
    return OutboxEntry(name=watch.name, dsn=parse_dsn(watch.dsn).redacted(), table=watch.table)


def outbox_status(db: Database, watch: OutboxWatch) -> OutboxEntry:
    """The figures of ``sluice status`` for one outbox (see docs/operations.md for each field)."""
    layout = discover(db, watch.table)
    stats = outbox_stats(db, layout)
    leader = None if watch.election is None else leader_of(db, watch.election, watch.lease_table)
    return replace(
        outbox_settings(watch),
        table=layout.table,
        rows=stats.rows,
        oldest_age_seconds=stats.oldest_age_seconds,
        in_flight=stats.marked,
        dead_letters=stats.dead,
        leader=leader,
    )


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    create_time: str | None
    age_seconds: float | None
    topic: str
    key: str
    leader_id: str | None
    value: str | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    create_time: str | None
    topic: str
    key: str
    error: str
    attempts: int
    dead_time: str | None
    value: str | None


def oldest_rows(db: Database, table: str, limit: int = 20) -> list[OutboxRow]:
    """The first ``limit`` rows in id order: the head of the backlog (``leader_id`` set: in flight)."""
    q = _queries(db, discover(db, table))
    rows = db.fetchall(q["oldest_rows"], {"limit": limit}, what="outbox oldest rows")
    return [
        OutboxRow(
            int(r[0]),
            iso(r[1]),
            None if r[2] is None else max(0.0, float(r[2])),
            str(r[3]),
            str(r[4]),
            None if r[5] is None else str(r[5]),
            preview(r[6]),
        )
        for r in rows
    ]


def dead_letters(db: Database, table: str, limit: int = 100) -> list[DeadLetter]:
    q = _queries(db, discover(db, table))
    rows = db.fetchall(q["dead_letters"], {"limit": limit}, what="outbox dead letters")
    return [
        DeadLetter(int(r[0]), iso(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), iso(r[6]), preview(r[7]))
        for r in rows
    ]


def outbox_listings(watch: OutboxWatch) -> tuple[list[OutboxRow], list[DeadLetter]]:
    """The console's outbox page: the head of the backlog and the dead letters, read on a
    read-only connection."""
    with Database(watch.dsn, read_only=True) as db:
        return oldest_rows(db, watch.table), dead_letters(db, watch.table)
