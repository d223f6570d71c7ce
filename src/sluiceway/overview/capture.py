"""A ``sluice capture`` as the operator sees it: where it publishes, its slot, its leader, the
position its destination acknowledged, and how far each table's copy has come.

Reads only, and nothing the capture itself holds: the slot's row in ``pg_replication_slots``, the
lease row (:func:`~sluiceway.overview.leases.leader_of`), and two files of its state directory —
``published.lsn`` (replaced atomically by the capture), the copy's ``state.json`` and
``refusals.json`` (a change the destination refuses). A standby's
or a stopped capture's figures are the same reads; a capture that never ran has no slot, which
the checks report (:func:`~sluiceway.overview.checks.capture_problems`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sluiceway.capture import CaptureConfig
from sluiceway.capture.refusals import RefusalLog
from sluiceway.capture.target import PositionFile
from sluiceway.cdc.mysql.progress import read_binlog_progress
from sluiceway.cdc.mysql.server import BinlogSession
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.postgres import CdcSession
from sluiceway.cdc.progress import read_progress
from sluiceway.db import Database
from sluiceway.overview.leases import leader_of
from sluiceway.overview.report import BINLOG_READER, CaptureEntry, CaptureRefusals, Election


def capture_settings(config: CaptureConfig, path: str) -> CaptureEntry:
    """The fields a capture's file alone gives (shown even when its database cannot be read)."""
    c = config.capture
    return CaptureEntry(
        name=c.name,
        file=path,
        destination=c.describe_destination(),
        slot_name=c.slot if c.slot is not None else f"{BINLOG_READER}{c.server_id}",
        election=Election(c.election.kind, c.election_name),
        state_dir=c.state_path,
    )


def capture_status(config: CaptureConfig, path: str) -> CaptureEntry:
    """The figures of ``sluice status`` for one capture (see docs/operations.md for each field)."""
    c = config.capture
    published = PositionFile(Path(c.state_path) / "published.lsn").read()
    binlog = None
    where: Callable[[int], str] = format_lsn
    if c.binlog:
        session = BinlogSession(c.dsn)
        try:
            tables, binlog, where = read_binlog_progress(
                session, c.state_path, c.table_list, snapshot=c.snapshot, held=published
            )
        finally:
            session.close()
        slot = None  # a binlog reader holds nothing on the server
    else:
        assert c.slot is not None
        pg = CdcSession(c.dsn)
        try:
            tables, slot = read_progress(pg, c.state_path, c.table_list, snapshot=c.snapshot, slot=c.slot)
        finally:
            pg.close()
    leader = None
    if c.election.kind == "database":  # NELI (kafka) has no row to read
        with Database(c.dsn, read_only=True) as db:
            leader = leader_of(db, c.election_name, c.lease_table)  # election.schema
    refusals = RefusalLog(c.state_path).read()
    return replace(
        capture_settings(config, path),
        slot=slot,
        leader=leader,
        published_lsn=None if published is None else where(published),
        binlog=binlog,
        tables=tables,
        refusals=CaptureRefusals(
            stuck=None if refusals.stuck is None else refusals.stuck.to_json(),
            to_skip=len(refusals.skips),
            skipped=refusals.skipped,
            dead_lettered=refusals.dead_lettered,
        ),
    )
