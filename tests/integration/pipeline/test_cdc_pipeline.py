"""A postgres-cdc pipeline on the session's local Spark: copy three tables while a writer works,
then follow their changes into a Postgres upsert sink and a journal sink; the sink table equals
the source, the journal keeps per-key order, and a failing sink holds only the capture's journal,
never the slot."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.journal import Journal
from sluiceway.pipeline import Pipeline, PipelineSpec
from sluiceway.pipeline.operator import read_checkpoint, source_status, status
from sluiceway.pipeline.sources.adapters import cdc_log_dir
from sluiceway.testing import wait_until
from tests.support.cdc import (
    TABLES,
    Writer,
    create_tables,
    journal_records,
    key_of,
    slot_confirmed,
    source_state,
    version_regressions,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def spec(
    tmp_path: Path, source_dsn: str, sink_dsn: str, name: str, tables: tuple[str, ...] = TABLES, **db: Any
) -> PipelineSpec:
    return PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": name,
                "source": {
                    "type": "postgres-cdc",
                    "dsn": source_dsn,
                    "tables": list(tables),
                    "slot": f"{name}_slot",
                    "publication": f"{name}_pub",
                    "chunk_size": 700,
                    "max_records_per_batch": 3_000,
                    "partitions": 2,
                },
                "sinks": [
                    {"name": "log", "type": "journal", "path": str(tmp_path / "log")},
                    {
                        "name": "db",
                        "type": "postgres",
                        "dsn": sink_dsn,
                        "table": f"{name}_copy",
                        "key": ["namespace", "key"],
                        **db,
                    },
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )


def sink_table(dsn: str, table: str) -> dict[tuple[str, str], Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT namespace, key, value FROM {table}").fetchall()
    return {(ns, key): json.loads(bytes(value)) for ns, key, value in rows}


def create_sink_table(dsn: str, table: str) -> None:
    """The table a postgres sink with ``create: false`` needs (the record's columns, keyed by
    namespace and key): created by hand to bring a stopped sink back."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE {table} ("offset" bigint, namespace text, op text, key text, value bytea, '
            "headers jsonb, timestamp timestamptz, PRIMARY KEY (namespace, key))"
        )


def committed_offset(spec: PipelineSpec, sink: str) -> int:
    """How far the sink has read the capture's journal (its committed offset)."""
    cp = read_checkpoint(spec.checkpoint_dir(sink))
    assert cp.committed is not None
    return int(cp.committed["offset"])


def capture_log(spec: PipelineSpec) -> tuple[int, int]:
    """The capture journal's head (records) and the stream position it holds (an LSN)."""
    with Journal.open(cdc_log_dir(spec), read_only=True) as journal:
        return journal.head, int(journal.registers()["cdc.lsn"])


def test_copy_under_writes_then_sync_reaches_both_sinks_exactly_and_in_order(
    spark: Any, cdc_dsn: str, postgres_dsn: str, tmp_path: Path
) -> None:
    create_tables(cdc_dsn, orders=5_000, lines=2_000, customers=500)
    pipeline_spec = spec(tmp_path, cdc_dsn, postgres_dsn, "shop")
    writer = Writer(cdc_dsn, pace=0.001)
    writer.start()
    try:
        first = Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    finally:
        writer.stop()
    assert {r.state for r in first.values()} == {"finished"}, first
    assert writer.ops > 100
    second = Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    assert {r.state for r in second.values()} == {"finished"}, second

    expected = source_state(cdc_dsn)
    copied = sink_table(postgres_dsn, "shop_copy")
    assert copied.keys() == expected.keys()
    assert [k for k in expected if copied[k] != expected[k]] == []
    log = journal_records(tmp_path / "log")
    modes = {v for r in log for k, v in r["headers"] if k == "sluice.mode"}
    assert modes == {"copy", "sync"}
    assert version_regressions(r | {"op": "x"} for r in log) == []
    assert {key_of(ns, row) for (ns, _), row in expected.items()} <= {r["key"] for r in log}

    # Both sinks read the capture's journal to its end; the slot was released up to what the
    # journal holds, and not one byte further.
    head, held = capture_log(pipeline_spec)
    assert committed_offset(pipeline_spec, "log") == committed_offset(pipeline_spec, "db") == head
    assert 0 < slot_confirmed(cdc_dsn, "shop_slot") <= held
    source = source_status(pipeline_spec)
    assert source is not None
    assert [t.phase for t in source.tables] == ["sync", "sync", "sync"]
    assert source.tables[0].rows_copied >= 5_000
    assert source.slot is not None and source.slot.confirmed_lsn
    assert {s.sink: s.state for s in status(pipeline_spec)} == {"log": "ok", "db": "ok"}


def test_a_failing_sink_holds_only_the_journal_never_the_slot_and_catches_up(
    spark: Any, cdc_dsn: str, postgres_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id bigint PRIMARY KEY, version bigint NOT NULL)")
        conn.execute("INSERT INTO ledger SELECT g, g FROM generate_series(1, 2000) g")
    # The db sink's table does not exist and may not be created: each of its batches fails.
    pipeline_spec = spec(
        tmp_path,
        cdc_dsn,
        postgres_dsn,
        "held",
        ("public.ledger",),
        create=False,
        retry={"attempts": 1, "record_attempts": 1, "backoff": 0},
    )
    first = Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    assert first["log"].state == "finished" and first["db"].state == "failed", first
    before = slot_confirmed(cdc_dsn, "held_slot")
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO ledger SELECT g, g FROM generate_series(100000, 100099) g")
    Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    head, held = capture_log(pipeline_spec)
    assert committed_offset(pipeline_spec, "log") == head
    # The failed sink holds no WAL: the slot moved on with the journal, which keeps the backlog.
    assert before < slot_confirmed(cdc_dsn, "held_slot") <= held
    assert read_checkpoint(pipeline_spec.checkpoint_dir("db")).committed is None

    create_sink_table(postgres_dsn, "held_copy")
    again = Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    assert {r.state for r in again.values()} == {"finished"}, again
    head, held = capture_log(pipeline_spec)
    assert committed_offset(pipeline_spec, "db") == committed_offset(pipeline_spec, "log") == head
    assert len(sink_table(postgres_dsn, "held_copy")) == len(source_state(cdc_dsn, ["public.ledger"]))


class Ticker(threading.Thread):
    """Steady single-row transactions (about 1 kB of WAL each) until stopped."""

    def __init__(self, dsn: str, per_second: int = 200) -> None:
        super().__init__(daemon=True)
        self.dsn, self.pause, self.stop_event = dsn, 1 / per_second, threading.Event()
        self.ops = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop_event.is_set():
                conn.execute(
                    "INSERT INTO ticks VALUES (%s, 1, repeat('x', 900)) "
                    "ON CONFLICT (id) DO UPDATE SET version = ticks.version + 1",
                    (self.ops % 5_000,),
                )
                self.ops += 1
                self.stop_event.wait(self.pause)


def wal(dsn: str, slot: str) -> tuple[int, int, int]:
    """The server's WAL position, the slot's retained WAL (from restart_lsn) and its confirmed lag."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_a_stopped_sink_holds_no_wal_under_a_steady_writer_then_catches_up(
    spark: Any, cdc_dsn: str, postgres_dsn: str, tmp_path: Path
) -> None:
    # SLUICE_STOPPED_SINK_SECONDS=300 runs the five-minute version (figures in docs/cdc.md).
    seconds = float(os.environ.get("SLUICE_STOPPED_SINK_SECONDS", "45"))
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ticks (id bigint PRIMARY KEY, version bigint NOT NULL, pad text)")
        conn.execute("INSERT INTO ticks VALUES (-1, 0, 'first')")  # copied: the db sink's first batch
    pipeline_spec = spec(
        tmp_path,
        cdc_dsn,
        postgres_dsn,
        "stopped",
        ("public.ticks",),
        create=False,  # the table is missing: the db sink stops at its first batch
        retry={"attempts": 1, "record_attempts": 1, "backoff": 0},
    )
    pipeline = Pipeline(pipeline_spec, spark)
    runs: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: runs.update(pipeline.run(handle_signals=False)), daemon=True)
    ticker = Ticker(cdc_dsn)
    runner.start()
    try:

        def db_stopped() -> bool:
            assert runner.is_alive() or runs, "the pipeline did not start"
            return "db" in pipeline.queries and pipeline.outcome("db").state == "failed"

        wait_until(db_stopped, timeout=120, message="the db sink to stop")
        ticker.start()
        start, _, _ = wal(cdc_dsn, "stopped_slot")
        samples = []
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            time.sleep(min(3.0, seconds / 10))
            samples.append(wal(cdc_dsn, "stopped_slot"))  # (position, retained, confirmed lag)
        ticker.stop_event.set()
        ticker.join(10)
        written = samples[-1][0] - start
        print(f"stopped sink: {ticker.ops} transactions, {written:,} bytes of WAL written; "
              f"retained {[s[1] for s in samples]}; confirmed lag {[s[2] for s in samples]}")  # fmt: skip
        assert ticker.ops > seconds * 50 and written > 4 << 20
        # The capture confirms what the journal holds within moments: the slot never waits for
        # the stopped sink. (The old design held everything written since the sink stopped.)
        assert max(lag for _, _, lag in samples[len(samples) // 2 :]) < 4 << 20
        # restart_lsn follows at the server's own pace (it moves past running-transaction
        # snapshots, logged every 15 s or so): the retained WAL is a saw-tooth of a few MB that
        # falls back during the stop, never the whole of what was written since the sink stopped.
        retained = [r for _, r, _ in samples]
        assert any(later < earlier for earlier, later in itertools.pairwise(retained))
        assert max(retained) < 0.75 * written
        # The journal holds the backlog: the log sink has every change.
        wait_until(lambda: capture_log(pipeline_spec)[0] >= ticker.ops + 1, timeout=60, message="the journal")
        head = capture_log(pipeline_spec)[0]
        wait_until(lambda: committed_offset(pipeline_spec, "log") == head, timeout=60, message="the log sink")
    finally:
        ticker.stop_event.set()
        pipeline.request_stop()
        runner.join(60)
    assert runs["db"].state == "failed" and runs["log"].state in ("stopped", "finished"), runs
    assert read_checkpoint(pipeline_spec.checkpoint_dir("db")).committed is None

    # The sink comes back: it catches up from the journal and equals the source.
    create_sink_table(postgres_dsn, "stopped_copy")
    again = Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    assert {r.state for r in again.values()} == {"finished"}, again
    expected = source_state(cdc_dsn, ["public.ticks"])
    copied = sink_table(postgres_dsn, "stopped_copy")
    assert copied.keys() == expected.keys() and all(copied[k] == expected[k] for k in expected)


def test_operator_commands_show_tables_and_slot_inspect_the_journal_and_drop_the_slot(
    spark: Any, cdc_dsn: str, postgres_dsn: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from sluiceway.cli.pipeline import app

    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
        conn.execute("INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 30) g")
    pipeline_spec = spec(tmp_path, cdc_dsn, postgres_dsn, "ops", ("public.notes",))
    spec_path = tmp_path / "ops.yaml"
    spec_path.write_text(json.dumps({"pipeline": pipeline_spec.model_dump(by_alias=True, exclude_none=True)}))
    assert {
        r.state for r in Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False).values()
    } == {"finished"}
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("UPDATE notes SET body = 'changed' WHERE id = 7")
    runner = CliRunner()
    shown = runner.invoke(app, ["status", str(spec_path)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert (
        "public.notes" in shown.output
        and "sync" in shown.output
        and "slot ops_slot: confirmed" in shown.output
    )

    assert "capture journal" in shown.output and "30 records" in shown.output

    log = journal_records(tmp_path / "log")
    lsn = next(v for k, v in log[0]["headers"] if k == "pg.lsn")
    assert lsn.count("/") == 1
    # The update is captured by the next run; inspect reads the capture's journal by offset.
    Pipeline(pipeline_spec, spark).run(once=True, handle_signals=False)
    listed = runner.invoke(app, ["inspect", str(spec_path), "--from", "29", "--to", "100", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines() if line.startswith("{")]
    assert [(r["op"], r["key"], json.loads(r["value"])["body"]) for r in rows] == [
        ("insert", "30", "note 30"),
        ("update", "7", "changed"),
    ]

    dropped = runner.invoke(app, ["drop-slot", str(spec_path)])
    assert dropped.exit_code == 0, dropped.output
    assert "dropped slot 'ops_slot'" in dropped.output
    assert slot_confirmed(cdc_dsn, "ops_slot") == 0
    again = runner.invoke(app, ["drop-slot", str(spec_path)])
    assert again.exit_code == 1 and "does not exist" in again.output


def test_a_batch_read_copies_each_table_as_it_is(spark: Any, cdc_dsn: str, tmp_path: Path) -> None:
    from sluiceway.pipeline import register_sources

    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shelf (id int PRIMARY KEY, title text)")
        conn.execute("INSERT INTO shelf SELECT g, 'book ' || g FROM generate_series(1, 2500) g")
    register_sources(spark)
    rows = (
        spark.read.format("sluice-postgres-cdc")
        .option("dsn", cdc_dsn)
        .option("tables", "public.shelf")
        .option("chunkSize", "1000")
        .load()
        .collect()
    )
    assert sorted(int(r["key"]) for r in rows) == list(range(1, 2501))
    assert {r["namespace"] for r in rows} == {"public.shelf"} and {r["op"] for r in rows} == {"insert"}
    assert json.loads(rows[0]["value"])["title"].startswith("book ")
    assert slot_confirmed(cdc_dsn, "unused_slot") == 0  # a batch read takes no slot
