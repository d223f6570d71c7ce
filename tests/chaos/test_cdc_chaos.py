"""kill -9 of a CDC pipeline mid-copy and mid-sync, several times, while a writer keeps changing
the tables, and once a restart of PostgreSQL itself mid-sync; then ``--once``: the sink table
equals the source, per key no change is applied out of order, and the flush position confirmed
to the server never passed what the capture's journal held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.cdc.state import SourceState, TableCopy
from sluiceway.journal import Journal
from sluiceway.pipeline import PipelineSpec
from sluiceway.pipeline.operator import read_checkpoint
from sluiceway.pipeline.sources.adapters import cdc_log_dir
from sluiceway.testing import PrivatePostgres, wait_until
from tests.support.cdc import (
    TABLES,
    Writer,
    create_tables,
    journal_count,
    journal_records,
    slot_confirmed,
    source_state,
    version_regressions,
)
from tests.support.pipeline import kill9, start_pipeline, write_spec

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

ORDERS = 24_000


def committed(spec: PipelineSpec, sink: str) -> int | None:
    cp = read_checkpoint(spec.checkpoint_dir(sink))
    return None if cp.committed is None else int(cp.committed["offset"])


def journal_position(spec: PipelineSpec) -> tuple[int, int]:
    """The capture journal's head and the stream position (LSN) it holds."""
    with Journal.open(cdc_log_dir(spec), read_only=True) as journal:
        return journal.head, int(journal.registers()["cdc.lsn"])


def test_kill_9_mid_copy_and_mid_sync_then_once_loses_and_reorders_nothing(
    cdc_dsn: str, postgres_dsn: str, tmp_path: Path, logical_pg: PrivatePostgres
) -> None:
    create_tables(cdc_dsn, orders=ORDERS, lines=3_000, customers=500)
    pipeline: dict[str, Any] = {
        "name": "crash",
        "source": {
            "type": "postgres-cdc",
            "dsn": cdc_dsn,
            "tables": list(TABLES),
            "slot": "crash_slot",
            "publication": "crash_pub",
            "chunk_size": 800,
            "max_records_per_batch": 1_600,
        },
        "sinks": [
            {"name": "log", "type": "journal", "path": str(tmp_path / "log")},
            {
                "name": "db",
                "type": "postgres",
                "dsn": postgres_dsn,
                "table": "crash_copy",
                "key": ["namespace", "key"],
            },
        ],
        "checkpoint": str(tmp_path / "cp"),
        "trigger": {"interval": "100ms"},
    }
    spec_path = write_spec(tmp_path / "spec.yaml", pipeline)
    spec = PipelineSpec.from_yaml(spec_path)
    copy_state = SourceState(tmp_path / "cp" / "_cdc" / "state")
    writer = Writer(cdc_dsn, pace=0.003)
    writer.start()

    def copied() -> int:
        return copy_state.load().tables.get("public.orders", TableCopy()).rows

    def slot_behind_every_sink() -> None:
        # Checked after each kill -9: the server was never told more than the journal held.
        _head, held = journal_position(spec)
        assert 0 < slot_confirmed(cdc_dsn, "crash_slot") <= held

    try:
        # 1: mid-copy
        proc = start_pipeline(spec_path, log=tmp_path / "run1.log")
        try:
            wait_until(lambda: copied() >= 4_000, timeout=180, message="the copy to get going")
        finally:
            kill9(proc)
        first_cut = copied()
        assert first_cut < ORDERS, "killed too late to test a copy's restart"
        slot_behind_every_sink()
        # 2: mid-copy again, after it went on from where it was
        proc = start_pipeline(spec_path, log=tmp_path / "run2.log")
        try:
            wait_until(lambda: copied() >= first_cut + 4_000, timeout=180, message="the copy to go on")
        finally:
            kill9(proc)
        slot_behind_every_sink()
        # 3 and 4: mid-sync (the copy done, changes streaming)
        for run in (3, 4):
            proc = start_pipeline(spec_path, log=tmp_path / f"run{run}.log")
            try:
                wait_until(
                    lambda: copy_state.load().done_at is not None, timeout=240, message="the copy to complete"
                )
                seen = journal_count(tmp_path / "log")
                wait_until(
                    lambda: journal_count(tmp_path / "log") >= seen + 500,  # noqa: B023
                    timeout=120,
                    message="changes to stream",
                )
            finally:
                kill9(proc)
            slot_behind_every_sink()
        # 5: PostgreSQL restarted mid-sync (pg_ctl restart -m fast): the capture waits it out and
        # resumes from its journal; the changes after the restart reach the sinks; then kill -9.
        proc = start_pipeline(spec_path, log=tmp_path / "run5.log")
        try:
            seen = journal_count(tmp_path / "log")
            wait_until(lambda: journal_count(tmp_path / "log") >= seen + 300, timeout=120)
            restarts = writer.restarts
            logical_pg.restart("fast")
            wait_until(lambda: writer.restarts > restarts, timeout=30, message="the writer to notice")
            # Everything from before the restart is in by now, give or take a batch: 1,500 more
            # records can only be changes the capture read after reconnecting.
            before = journal_count(tmp_path / "log")
            wait_until(
                lambda: journal_count(tmp_path / "log") >= before + 1_500,
                timeout=180,
                message="changes after the restart to reach the sink",
            )
        finally:
            kill9(proc)
        slot_behind_every_sink()
    finally:
        writer.stop()

    final = start_pipeline(spec_path, "--once", log=tmp_path / "final.log")
    assert final.wait(300) == 0, (tmp_path / "final.log").read_text()[-3000:]

    expected = source_state(cdc_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT namespace, key, value FROM crash_copy").fetchall()
    got = {(ns, key): json.loads(bytes(value)) for ns, key, value in rows}
    assert got.keys() == expected.keys()
    assert [k for k in expected if got[k] != expected[k]] == []
    assert version_regressions(journal_records(tmp_path / "log")) == []
    # Each kill costs at most the chunks in flight, not the copy so far.
    progress = copy_state.load().tables["public.orders"]
    assert progress.rows <= ORDERS + 4 * 2 * 800 + writer.ops
    head, held = journal_position(spec)
    assert committed(spec, "log") == committed(spec, "db") == head
    assert 0 < slot_confirmed(cdc_dsn, "crash_slot") <= held
