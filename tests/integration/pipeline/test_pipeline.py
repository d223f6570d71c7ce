"""Pipelines end to end on the local session: sinks, transforms, failures, skip and step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from sluiceway.pipeline import Pipeline, PipelineSpec, SinkFailed, status
from sluiceway.testing import Broker
from tests.support.journal import make_journal, read_journal

pytestmark = pytest.mark.spark


def pg(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def test_a_failing_sink_stops_at_its_offset_while_the_other_flows_then_skip_and_step(
    sluice_spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    make_journal(journal, [("orders", "poison" if i == 157 else f"k{i % 9}", b"v%d" % i) for i in range(300)])
    pg(postgres_dsn, "DROP TABLE IF EXISTS view")
    pg(
        postgres_dsn,
        'CREATE TABLE view (key TEXT PRIMARY KEY, value BYTEA, "offset" BIGINT, op TEXT, '
        "CHECK (key <> 'poison'))",
    )
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "two",
                "source": {"type": "journal", "path": str(journal), "max_records_per_batch": 100},
                "sinks": [
                    {"name": "lake", "type": "parquet", "path": str(tmp_path / "lake")},
                    {
                        "name": "db",
                        "type": "postgres",
                        "dsn": postgres_dsn,
                        "table": "view",
                        "retry": {"attempts": 2, "backoff": "10ms", "record_attempts": 1},
                        # One task holds every key: the stop is then a prefix of the whole batch.
                        # With several, it is per part (tests/integration/pipeline/test_scale_out.py).
                        "parallelism": 1,
                    },
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )
    runs = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    assert runs["lake"].state == "finished"
    assert runs["db"].state == "failed" and runs["db"].offset == 157
    assert "check constraint" in (runs["db"].error or "")
    assert pq.read_table(tmp_path / "lake").num_rows == 300
    assert pg(postgres_dsn, 'SELECT max("offset") FROM view') == [
        (156,)
    ]  # everything before it, nothing after

    by_sink = {s.sink: s for s in status(spec)}
    assert by_sink["lake"].state == "ok" and by_sink["lake"].lag == 0 and by_sink["lake"].position == 300
    db = by_sink["db"]
    assert db.state == "failed" and db.position == 100 and db.lag == 200 and db.last_offset == 156
    assert db.error is not None and db.error["offset"] == 157

    pipeline = Pipeline(spec, sluice_spark)
    with pytest.raises(SinkFailed, match="offset 157"):
        pipeline.step("db")  # still refused: step reports it
    pipeline.skip("db", 157)
    assert pipeline.step("db") == {"sink": "db", "written": 1, "offset": 158}
    assert pg(postgres_dsn, 'SELECT max("offset") FROM view') == [(158,)]

    runs = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    assert runs["db"].state == "finished"
    assert pg(postgres_dsn, 'SELECT key, "offset" FROM view ORDER BY key') == [
        (f"k{k}", max(i for i in range(300) if i % 9 == k and i != 157)) for k in range(9)
    ]
    final = {s.sink: s for s in status(spec)}["db"]
    assert final.state == "ok" and final.lag == 0 and final.error is None and final.skipped == [157]


def test_every_sink_and_transform_kind(
    sluice_spark: Any, postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path, capfd: Any
) -> None:
    journal = tmp_path / "journal"
    recs = [
        ("Orders" if i % 3 else "Users", f"k{i % 4}", None if i == 10 else json.dumps({"n": i}).encode())
        for i in range(40)
    ]
    make_journal(journal, recs)
    pg(postgres_dsn, "DROP TABLE IF EXISTS latest")
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "all",
                "source": {"type": "journal", "path": str(journal), "max_records_per_batch": 15},
                # the pipeline's filter sees the source's namespaces ("Orders"), before transforms
                "namespace": "(?i)^(orders|users)$",
                "transforms": [
                    {"pandas": "sluiceway.pipeline.examples:lower_namespace"},
                    {"python": "sluiceway.pipeline.examples:upper_key"},
                    {"arrow": "sluiceway.pipeline.examples:tag_batch"},
                    {"sql": "SELECT * FROM input WHERE key <> 'K3'"},
                ],
                "sinks": [
                    {"name": "copy", "type": "journal", "path": str(tmp_path / "copy")},
                    {
                        "name": "bus",
                        "type": "kafka",
                        "topic": topic,
                        "config": {"bootstrap.servers": kafka.bootstrap},
                    },
                    {"name": "db", "type": "postgres", "dsn": postgres_dsn, "table": "latest"},
                    {"name": "js", "type": "json", "path": str(tmp_path / "js"), "namespace": "^orders$"},
                    {"name": "cs", "type": "csv", "path": str(tmp_path / "cs")},
                    {"name": "show", "type": "console", "limit": 2},
                    {"name": "work", "type": "feed", "dsn": postgres_dsn, "partition": "{key}-{offset}"},
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )
    runs = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    assert {r.state for r in runs.values()} == {"finished"}, runs

    expected = [(i, ("orders" if i % 3 else "users"), f"K{i % 4}") for i in range(40) if i % 4 != 3]
    copied = read_journal(tmp_path / "copy")
    assert [(ns, k) for _, ns, k, _ in copied] == [(ns, k) for _, ns, k in expected]
    assert copied[[i for i, *_ in expected].index(10)][3] is None  # the tombstone stays a tombstone

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "t", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(3)])
    msgs, eof = [], set()
    while len(eof) < 3:
        for m in c.consume(100, 1.0):
            if m.error():
                eof.add(m.partition())
            else:
                msgs.append(m)
    c.close()
    assert len(msgs) == len(expected)
    assert dict(msgs[0].headers())["seen"] == b"arrow"

    rows = pg(postgres_dsn, 'SELECT key, "offset", namespace FROM latest ORDER BY key')
    assert [r[0] for r in rows] == ["K0", "K1", "K2"]  # K2's last record (offset 38) wins; K3 filtered
    assert rows[2][1] == 38

    lines = [
        json.loads(x) for f in sorted((tmp_path / "js").glob("*.jsonl")) for x in f.read_text().splitlines()
    ]
    assert {r["namespace"] for r in lines} == {"orders"} and json.loads(lines[0]["value"]) == {"n": 1}
    assert sum(len(f.read_text().splitlines()) - 1 for f in (tmp_path / "cs").glob("*.csv")) == len(expected)
    out = capfd.readouterr().out
    assert "--- all.show: " in out and "seen=arrow" in out

    from sluiceway.feed import Feed

    feed = Feed(postgres_dsn)
    assert feed.partition("K0-0").name == "K0-0"
    feed.close()


def test_dead_letter_sink_takes_the_poison_and_the_sink_finishes(sluice_spark: Any, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    make_journal(journal, [("ns", f"k{i}", b"x") for i in range(20)])
    spec = PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "dlq",
                "source": {"type": "journal", "path": str(journal)},
                # The journal sink refuses the record at offset 7, every time: its namespace is
                # longer than a journal record may carry (the sink writes from Spark's tasks, so
                # the refusal must come from the data, not from a patch in this process).
                "transforms": [
                    {
                        "sql": "SELECT offset, CASE WHEN offset = 7 THEN repeat('n', 70000) ELSE namespace "
                        "END AS namespace, op, key, value, headers, timestamp FROM input"
                    }
                ],
                "sinks": [
                    {
                        "name": "files",
                        "type": "journal",
                        "path": str(tmp_path / "out"),
                        "retry": {"attempts": 1, "backoff": 0, "record_attempts": 1},
                        "dead_letter": {"type": "json", "path": str(tmp_path / "dead")},
                    }
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )
    runs = Pipeline(spec, sluice_spark).run(once=True, handle_signals=False)
    assert runs["files"].state == "finished"
    assert [k for _, _, k, _ in read_journal(tmp_path / "out")] == [f"k{i}" for i in range(20) if i != 7]
    dead = [json.loads(x) for f in (tmp_path / "dead").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(dead) == 1 and dead[0]["offset"] == 7
    # InvalidJournalRecord is the journal's ValueError
    assert {h["key"]: h["value"] for h in dead[0]["headers"]}["sluice.error"].startswith(
        "InvalidJournalRecord"
    )
