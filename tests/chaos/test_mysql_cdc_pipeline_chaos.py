"""kill -9 of a mysql-cdc pipeline twice mid-copy and twice mid-sync while a writer keeps changing
two MariaDB tables, and once a crash of the server itself mid-sync; then ``--once``: the sink table
equals the source, per key no change is applied out of order, every committed upsert reached the
sink journal, and no sink ever got ahead of the capture's journal."""

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
from sluiceway.testing import PrivateMariaDB, wait_until
from tests.support.cdc import journal_count, journal_records, version_regressions
from tests.support.mysql_cdc import Writer, binlog_end, create_tables, source_state
from tests.support.pipeline import kill9, start_pipeline, write_spec

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

ORDERS = 12_000
DATABASE = "shop"


def committed(spec: PipelineSpec, sink: str) -> int:
    cp = read_checkpoint(spec.checkpoint_dir(sink))
    return -1 if cp.committed is None else int(cp.committed["offset"])


def capture_held(spec: PipelineSpec) -> tuple[int, int]:
    """The capture journal's head and the binlog position it holds."""
    with Journal.open(cdc_log_dir(spec), read_only=True) as journal:
        return journal.head, int(journal.registers().get("cdc.lsn", "0"))


def test_kill_9_mid_copy_and_mid_sync_and_a_server_crash_then_once_loses_and_reorders_nothing(
    postgres_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS mcrash_copy")
    with PrivateMariaDB() as db:
        create_tables(db, DATABASE, orders=ORDERS, lines=4_000)
        pipeline: dict[str, Any] = {
            "name": "mcrash",
            "source": {
                "type": "mysql-cdc",
                "dsn": db.dsn(DATABASE),
                "tables": ["orders", "order_lines"],
                "server_id": 7401,
                "chunk_size": 400,
                "max_records_per_batch": 1_600,
            },
            "sinks": [
                {"name": "log", "type": "journal", "path": str(tmp_path / "log")},
                {"name": "db", "type": "postgres", "dsn": postgres_dsn, "table": "mcrash_copy"},
            ],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "100ms"},
        }
        spec_path = write_spec(tmp_path / "spec.yaml", pipeline)
        spec = PipelineSpec.from_yaml(spec_path)
        copy_state = SourceState(tmp_path / "cp" / "_cdc" / "state")
        writer = Writer(db, DATABASE, pace=0.003)
        writer.start()

        def copied() -> int:
            return copy_state.load().tables.get(f"{DATABASE}.orders", TableCopy()).rows

        def sinks_behind_the_capture() -> None:
            # Checked after each kill -9: no sink committed past what the capture's journal holds,
            # and the capture never held a position past the server's binlog.
            head, held = capture_held(spec)
            assert committed(spec, "log") <= head and committed(spec, "db") <= head
            assert held <= binlog_end(db, DATABASE)

        def records() -> int:
            return journal_count(tmp_path / "log")

        try:
            # 1 and 2: mid-copy, the second after it went on from where the first left it
            proc = start_pipeline(spec_path, log=tmp_path / "run1.log")
            try:
                wait_until(lambda: copied() >= 2_000, timeout=180, message="the copy to get going")
                # Upserts committed before the capture's first position are the copy's to deliver
                # (as the row's state then): count only those after it.
                writer.committed.clear()
            finally:
                kill9(proc)
            first_cut = copied()
            assert first_cut < ORDERS, "killed too late to test a copy's restart"
            sinks_behind_the_capture()
            proc = start_pipeline(spec_path, log=tmp_path / "run2.log")
            try:
                wait_until(lambda: copied() >= first_cut + 2_000, timeout=180, message="the copy to go on")
            finally:
                kill9(proc)
            sinks_behind_the_capture()
            # 3 and 4: mid-sync (the copy done, changes streaming)
            for run in (3, 4):
                proc = start_pipeline(spec_path, log=tmp_path / f"run{run}.log")
                try:
                    done = lambda: copy_state.load().done_at is not None  # noqa: E731
                    wait_until(done, timeout=240, message="the copy to complete")
                    seen = records()
                    wait_until(lambda: records() >= seen + 300, timeout=120, message="changes to stream")  # noqa: B023
                finally:
                    kill9(proc)
                sinks_behind_the_capture()
            # 5: the server crashes mid-sync (kill -9 of mariadbd, then started again): the capture
            # waits it out and resumes from its journal; later changes reach the sinks; then kill -9.
            proc = start_pipeline(spec_path, log=tmp_path / "run5.log")
            try:
                seen = records()
                wait_until(lambda: records() >= seen + 200, timeout=120, message="changes to stream")
                restarts = writer.restarts
                db.restart(crash=True)
                wait_until(lambda: writer.restarts > restarts, timeout=30, message="the writer to notice")
                end = binlog_end(db, DATABASE)
                read = lambda: capture_held(spec)[1] >= end  # noqa: E731
                wait_until(read, timeout=180, message="changes after the crash to be read")
                before = records()
                wait_until(lambda: records() >= before + 200, timeout=120, message="the sinks to go on")
            finally:
                kill9(proc)
            sinks_behind_the_capture()
        finally:
            writer.stop()
        assert writer.ops > 500

        final = start_pipeline(spec_path, "--once", log=tmp_path / "final.log")
        assert final.wait(300) == 0, (tmp_path / "final.log").read_text()[-3000:]
        expected = source_state(db, DATABASE)

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT namespace, key, value FROM mcrash_copy").fetchall()
        conn.execute("DROP TABLE mcrash_copy")
    got = {(ns, key): json.loads(bytes(value)) for ns, key, value in rows}
    assert got.keys() == expected.keys()
    assert [k for k in expected if got[k] != expected[k]] == []
    log = journal_records(tmp_path / "log")
    assert version_regressions(log) == []
    streamed: dict[str, set[int]] = {}
    for row in log:
        if row["value"] is not None and row["namespace"] == f"{DATABASE}.orders":
            streamed.setdefault(row["key"], set()).add(int(json.loads(row["value"])["version"]))
    missing = {k: [v for v in vs if v not in streamed.get(k, set())] for k, vs in writer.committed.items()}
    assert {k: v for k, v in missing.items() if v} == {}
    # Each kill costs at most the chunks in flight, not the copy so far.
    progress = copy_state.load().tables[f"{DATABASE}.orders"]
    assert progress.rows <= ORDERS + 2 * 2 * 400 + writer.ops
    head, _held = capture_held(spec)
    assert committed(spec, "log") == committed(spec, "db") == head
