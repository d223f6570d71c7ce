"""How far a capture has come, as ``sluice status``, ``sluice pipeline status`` and the console show
it: each table's copy (phase, rows, chunks, where it completed), the slot (confirmed position,
WAL it retains, the process reading it) and, for a pipeline's capture, its journal. Reads only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.state import SourceState, TableCopy

if TYPE_CHECKING:
    from sluiceway.cdc.postgres import CdcSession


@dataclass(frozen=True, slots=True)
class TableProgress:
    """One captured table: ``copy`` while its rows are being copied, then ``sync``."""

    table: str
    phase: Literal["copy", "sync"]
    rows_copied: int
    chunks: int
    #: The position at which the copy completed (``None``: not complete).
    complete_at: str | None


@dataclass(frozen=True, slots=True)
class SlotStatus:
    slot: str
    confirmed_lsn: str
    restart_lsn: str
    #: WAL bytes the slot keeps the server from recycling.
    wal_retained_bytes: int
    #: The server process reading the slot (``None``: nobody is).
    active_pid: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BinlogStatus:
    """A binlog capture's place on its server, which keeps nothing for it (no slot): binlogs are
    purged by age, so ``behind_bytes`` is how much of the binlog the capture has yet to publish."""

    #: The server's ``@@server_id``.
    server_id: int
    #: The end of the server's binlog now (``binlog.000004:1234``).
    end: str
    #: Binlog bytes the server wrote after the position the capture's target holds (``None``: no
    #: position yet, a position of another server, or its file purged).
    behind_bytes: int | None
    #: The GTID checkpoint: the last GTID per replication domain at a durable position (``None``:
    #: the capture never ran), and the server whose binlog its positions are offsets in.
    gtids: str | None
    checkpoint_server_id: int | None


@dataclass(frozen=True, slots=True)
class CaptureJournal:
    """The capture's own journal: records in it, the stream position it holds, its consumers."""

    path: str
    records: int
    position: str | None
    consumers: dict[str, int]


@dataclass(frozen=True, slots=True)
class CdcStatus:
    """What a CDC source reports beyond its sinks (``sluice pipeline status``, ``sluice status``)."""

    tables: list[TableProgress]
    slot: SlotStatus | None
    #: ``None`` until the capture first ran.
    journal: CaptureJournal | None
    #: A binlog capture's place among the server's replicas (``server id 101``); a binlog has no slot.
    replica: str | None = None
    binlog: BinlogStatus | None = None


def read_progress(
    session: CdcSession, state_dir: str, tables: str | Sequence[str], *, snapshot: str, slot: str
) -> tuple[list[TableProgress], SlotStatus | None]:
    """Each of ``tables`` (as the capture resolves them) with its copy's progress, and the slot
    (``None`` when it does not exist: the capture never ran)."""
    namespaces = [t.namespace for t in session.resolve_tables(tables)]
    progress = table_progress(state_dir, namespaces, snapshot=snapshot, position=format_lsn)
    info = session.slot(slot)
    if info is None:
        return progress, None
    return progress, SlotStatus(
        slot=slot,
        confirmed_lsn=format_lsn(info.confirmed),
        restart_lsn=format_lsn(info.restart),
        wal_retained_bytes=info.retained,
        active_pid=info.active_pid,
    )


def table_progress(
    state_dir: str, namespaces: Sequence[str], *, snapshot: str, position: Callable[[int], str]
) -> list[TableProgress]:
    """Each table's copy, from the copy's state (``position`` writes a stream position as text)."""
    state = SourceState(state_dir).load()
    progress = []
    for namespace in namespaces:
        copied = state.tables.get(namespace, TableCopy())
        progress.append(
            TableProgress(
                table=namespace,
                phase="sync" if snapshot != "initial" or copied.done else "copy",
                rows_copied=copied.rows,
                chunks=copied.chunks,
                complete_at=None if copied.completed_at is None else position(copied.completed_at),
            )
        )
    return progress
