"""A mysql-cdc pipeline on the session's local Spark: two MariaDB tables copied while a writer
works (inserts, updates, primary-key moves, deletes, multi-row transactions), then their changes
followed into a PostgreSQL upsert sink and a Delta mirror (``columns: json``). Both equal the
source row for row; the capture's journal keeps per-key order."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.pipeline import Pipeline, PipelineSpec
from sluiceway.pipeline.operator import source_status
from sluiceway.pipeline.sources.adapters import cdc_log_dir
from sluiceway.testing import PrivateMariaDB
from tests.support.cdc import capture_records, version_regressions
from tests.support.lake import read_delta
from tests.support.mysql_cdc import Writer, create_tables, source_state

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def spec(tmp_path: Path, source_dsn: str, sink_dsn: str, database: str) -> PipelineSpec:
    return PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "mshop",
                "source": {
                    "type": "mysql-cdc",
                    "dsn": source_dsn,
                    "tables": ["orders", "order_lines"],
                    "server_id": 7301,
                    "chunk_size": 600,
                    "max_records_per_batch": 3_000,
                    "partitions": 2,
                },
                "sinks": [
                    {"name": "db", "type": "postgres", "dsn": sink_dsn, "table": "mshop_copy"},
                    {
                        "name": "mirror",
                        "type": "delta",
                        "path": str(tmp_path / "mirror"),
                        "mode": "mirror",
                        "columns": "json",
                        "namespace": f"^{database}\\.orders$",
                    },
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )


def sink_table(dsn: str) -> dict[tuple[str, str], Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT namespace, key, value FROM mshop_copy").fetchall()
    return {(ns, key): json.loads(bytes(value)) for ns, key, value in rows}


def test_copy_under_writes_then_sync_into_a_postgres_and_a_delta_mirror(
    sluice_spark: Any, binlog_mariadb: PrivateMariaDB, binlog_db: str, postgres_dsn: str, tmp_path: Path
) -> None:
    create_tables(binlog_mariadb, binlog_db, orders=3_000, lines=2_000)
    pipeline_spec = spec(tmp_path, binlog_mariadb.dsn(binlog_db), postgres_dsn, binlog_db)
    writer = Writer(binlog_mariadb, binlog_db, pace=0.001)
    writer.start()
    try:
        first = Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    finally:
        writer.stop()
    assert {r.state for r in first.values()} == {"finished"}, first
    assert writer.ops > 100
    second = Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    assert {r.state for r in second.values()} == {"finished"}, second

    expected = source_state(binlog_mariadb, binlog_db)
    copied = sink_table(postgres_dsn)
    assert copied.keys() == expected.keys()
    assert [k for k in expected if copied[k] != expected[k]] == []

    orders = {k: v for (ns, k), v in expected.items() if ns == f"{binlog_db}.orders"}
    mirror = {row["key"]: row for row in read_delta(tmp_path / "mirror")}
    assert mirror.keys() == orders.keys()
    columns = ("id", "version", "note", "amount", "updated", "payload")
    assert [k for k, row in orders.items() if {c: mirror[k].get(c) for c in columns} != row] == []

    log = capture_records(cdc_log_dir(pipeline_spec))
    assert version_regressions(log) == []
    assert {h["value"] for r in log for h in r["headers"] if h["key"] == "sluice.mode"} == {"copy", "sync"}
    status = source_status(pipeline_spec)
    assert status is not None and status.replica == "server id 7301"
    # Positions in the binlog's terms, and the capture's place on the server (it holds no slot).
    assert status.journal is not None and re.fullmatch(r"binlog\.\d{6}:\d+", status.journal.position or "")
    assert status.binlog is not None and status.binlog.gtids and status.binlog.behind_bytes is not None
    assert {t.phase for t in status.tables} == {"sync"}
