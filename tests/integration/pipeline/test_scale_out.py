"""Sinks write from Spark's tasks: batches far larger than ``spark.driver.maxResultSize`` reach
every sink type, and parts of one batch that fail at different records each stop at their own
record (none of a part's later records written), while the other parts finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from sluiceway.pipeline import Pipeline, PipelineSpec
from sluiceway.pipeline.operator import status
from sluiceway.testing import Broker
from tests.support import ROOT
from tests.support.journal import make_journal, read_journal
from tests.support.pipeline import write_spec

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def pg(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def test_batches_far_larger_than_max_result_size_reach_every_sink(
    postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    total, keys = 30_000, 300
    journal = tmp_path / "journal"
    payload = "x" * 150
    make_journal(
        journal,
        [("orders", f"k{i % keys}", json.dumps({"i": i, "pad": payload}).encode()) for i in range(total)],
    )
    sinks: list[dict[str, Any]] = [
        {"name": "copy", "type": "journal", "path": str(tmp_path / "copy")},
        {"name": "bus", "type": "kafka", "topic": topic, "config": {"bootstrap.servers": kafka.bootstrap}},
        {"name": "db", "type": "postgres", "dsn": postgres_dsn, "table": "big_latest"},
        {"name": "lake", "type": "parquet", "path": str(tmp_path / "lake")},
        {"name": "js", "type": "json", "path": str(tmp_path / "js")},
        {"name": "cs", "type": "csv", "path": str(tmp_path / "cs")},
        {"name": "work", "type": "feed", "dsn": postgres_dsn, "prefix": "big_"},
        {"name": "show", "type": "console", "limit": 2},
    ]
    spec = write_spec(
        tmp_path / "big.yaml",
        {
            "name": "big",
            "source": {"type": "journal", "path": str(journal)},
            "sinks": sinks,
            "checkpoint": str(tmp_path / "cp"),
            # Each batch (all 30,000 records, ~6 MB) is far larger than the driver may receive.
            "spark": {"spark.driver.maxResultSize": "1m"},
        },
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluiceway.cli.main",
            "pipeline",
            "run",
            str(spec),
            "--once",
            "--master",
            "local[2]",
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable},
    )
    output = (run.stdout + run.stderr).decode(errors="replace")
    assert run.returncode == 0, output[-4000:]
    assert "maxResultSize" not in output

    def seqs(values: list[bytes]) -> list[int]:
        return [json.loads(v)["i"] for v in values]

    copied = read_journal(tmp_path / "copy")
    assert seqs([v for *_, v in copied]) == list(range(total))  # one part: the source's order exactly

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "big", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    per_key: dict[str, list[int]] = {}
    received = 0
    while received < total:
        msg = consumer.poll(10)
        assert msg is not None, f"only {received} of {total} messages arrived"
        per_key.setdefault(msg.key().decode(), []).append(json.loads(msg.value())["i"])
        received += 1
    consumer.close()
    assert all(v == sorted(v) and len(v) == total // keys for v in per_key.values())

    rows = pg(postgres_dsn, 'SELECT key, "offset" FROM big_latest')
    assert sorted(rows) == sorted((f"k{k}", total - keys + k) for k in range(keys))
    assert pq.read_table(tmp_path / "lake").num_rows == total
    lines = [
        json.loads(x) for f in sorted((tmp_path / "js").glob("*.jsonl")) for x in f.read_text().splitlines()
    ]
    assert [r["offset"] for r in lines] == list(range(total))  # files in name order: the batch's order
    assert sum(len(f.read_text().splitlines()) - 1 for f in (tmp_path / "cs").glob("*.csv")) == total
    assert pg(postgres_dsn, "SELECT count(*) FROM big_partitions") == [(total,)]
    assert "--- big.show: 30000 record(s)" in output
    assert [f for d in ("lake", "js", "cs") for f in (tmp_path / d / ".staging").glob("*")] == []


def test_parts_failing_at_different_records_stop_each_at_its_own(
    sluice_spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    # Two poison keys that Spark's hash partitioning puts in different parts of two.
    names = [f"poison{i}" for i in range(40)]
    placed = (
        sluice_spark.createDataFrame([(n,) for n in names], "key string")
        .repartition(2, "key")
        .withColumn("part", F.spark_partition_id())
        .collect()
    )
    first = next(r["key"] for r in placed if r["part"] == 0)
    second = next(r["key"] for r in placed if r["part"] == 1)
    good = [f"k{i}" for i in range(20)]
    part_of = {
        r["key"]: r["part"]
        for r in sluice_spark.createDataFrame([(k,) for k in good], "key string")
        .repartition(2, "key")
        .withColumn("part", F.spark_partition_id())
        .collect()
    }
    assert set(part_of.values()) == {0, 1}
    records = [
        ("t", first if i == 100 else second if i == 250 else good[i % 20], b"v%d" % i) for i in range(400)
    ]
    journal = tmp_path / "journal"
    make_journal(journal, records)
    pg(postgres_dsn, "DROP TABLE IF EXISTS parts_view")
    pg(
        postgres_dsn,
        'CREATE TABLE parts_view (key TEXT PRIMARY KEY, value BYTEA, "offset" BIGINT, op TEXT, '
        f"CHECK (key NOT IN ('{first}', '{second}')))",
    )
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "parts",
                "source": {"type": "journal", "path": str(journal)},
                "sinks": [
                    {
                        "name": "db",
                        "type": "postgres",
                        "dsn": postgres_dsn,
                        "table": "parts_view",
                        "parallelism": 2,
                        "retry": {"attempts": 1, "backoff": 0, "record_attempts": 1},
                    }
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )
    runs = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    db = runs["db"]
    assert db.state == "failed" and db.offset == 100, db
    assert "CheckViolation" in (db.error or "") and "1 more part(s) stopped" in (db.error or ""), db.error
    assert "\n" not in (db.error or "").split("DETAIL")[0].strip()

    latest = dict(pg(postgres_dsn, 'SELECT key, "offset" FROM parts_view'))
    # Each part stopped at its own bad record: of the part holding offset 100, no record after it;
    # of the part holding offset 250, every record before 250 and none after it.
    stops = {part_of_key(first, placed): 100, part_of_key(second, placed): 250}
    for key in good:
        stop = stops[part_of[key]]
        expected = max(
            i for i in range(400) if i % 20 == good.index(key) and i not in (100, 250) and i < stop
        )
        assert latest[key] == expected, (key, latest[key], expected)

    # Skipping both bad records lets every part go on from where it stopped.
    pipeline = Pipeline(spec, sluice_spark)
    pipeline.skip("db", 100)
    pipeline.skip("db", 250)
    again = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    assert again["db"].state == "finished", again
    latest = dict(pg(postgres_dsn, 'SELECT key, "offset" FROM parts_view'))
    assert latest == {
        key: max(i for i in range(400) if i % 20 == n and i not in (100, 250)) for n, key in enumerate(good)
    }
    final = {s.sink: s for s in status(spec)}["db"]
    assert final.state == "ok" and final.error is None and final.skipped == [100, 250]


def part_of_key(key: str, placed: list[Any]) -> int:
    return int(next(r["part"] for r in placed if r["key"] == key))
