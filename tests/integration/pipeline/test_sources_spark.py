"""Each data source and writer round-trips records through Spark (local session)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from sluiceway.db import Database
from sluiceway.testing import Broker, wait_until
from tests.support.journal import make_journal, read_journal
from tests.support.order import check_per_key_order, read_topic
from tests.support.outbox import Writers, prepare_outbox

pytestmark = pytest.mark.spark


def collect(
    df: Any, checkpoint: Path, *, max_records: int | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """Run a streaming DataFrame with Trigger.AvailableNow into a list; returns (rows, batch sizes)."""
    rows: list[dict[str, Any]] = []
    sizes: list[int] = []

    def sink(batch: Any, batch_id: int) -> None:
        table = batch.toArrow()
        sizes.append(table.num_rows)
        rows.extend(table.to_pylist())

    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    return rows, sizes


def test_journal_batch_read_yields_every_record(sluice_spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "j"
    recs = [
        ("orders" if i % 2 else "users", f"k{i % 7}", None if i % 50 == 0 else b"v%d" % i)
        for i in range(3000)
    ]
    make_journal(path, recs)
    df = (
        sluice_spark.read.format("sluice-journal")
        .option("path", str(path))
        .option("partitionRecords", "1000")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(3000))
    assert rows[1].namespace == "orders" and rows[1].key == "k1" and bytes(rows[1].value) == b"v1"
    assert rows[0].value is None and rows[0].op == "delete" and rows[1].op == "insert"
    assert [(h.key, h.value) for h in rows[5].headers] == [("i", "5")]
    part = (
        sluice_spark.read.format("sluice-journal")
        .option("path", str(path))
        .option("startingOffset", "2990")
        .load()
    )
    assert part.count() == 10


def test_journal_stream_reads_bounded_batches_and_the_writer_appends_once(
    sluice_spark: Any, tmp_path: Path
) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    make_journal(src, [("ns", f"k{i % 5}", b"%d" % i) for i in range(1000)])
    df = (
        sluice_spark.readStream.format("sluice-journal")
        .option("path", str(src))
        .option("maxRecordsPerBatch", "300")
        .load()
    )
    rows, sizes = collect(df, tmp_path / "cp1")
    assert sizes == [300, 300, 300, 100]
    assert sorted(r["offset"] for r in rows) == list(range(1000))

    q = (
        sluice_spark.readStream.format("sluice-journal")
        .option("path", str(src))
        .option("maxRecordsPerBatch", "400")
        .load()
        .writeStream.format("sluice-journal")
        .option("path", str(out))
        .option("name", "copy")
        .option("checkpointLocation", str(tmp_path / "cp2"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    copied = read_journal(out)
    assert [(k, v) for _, _, k, v in copied] == [(f"k{i % 5}", b"%d" % i) for i in range(1000)]

    # The writer's commit is idempotent per batch id: committing the last batch again adds nothing.
    from sluiceway.pipeline.sources.journal import JournalStreamWriter, StagedFile

    writer = JournalStreamWriter({"path": str(out), "name": "copy"})
    last_batch = q.lastProgress["batchId"]
    import pyarrow as pa

    from sluiceway.pipeline.record import RECORD_SCHEMA

    staged = writer.write(
        iter(
            [
                pa.RecordBatch.from_pylist(
                    [{"key": "x", "namespace": "ns", "value": b"1"}], schema=RECORD_SCHEMA
                )
            ]
        )
    )
    writer.commit([staged], last_batch)
    assert len(read_journal(out)) == 1000
    writer.commit([StagedFile(None, 0)], last_batch + 1)


def test_kafka_source_reads_every_partition_and_the_writer_waits_for_acks(
    sluice_spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(600):
        key = f"k{i % 10}"
        producer.produce(topic, key=key, value=json.dumps({"seq": i // 10 + 1}), headers=[("h", b"x")])
    producer.produce(topic, key="gone", value=None)
    assert producer.flush(30) == 0

    df = (
        sluice_spark.readStream.format("sluice-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
        .option("maxRecordsPerBatch", "250")
        .load()
    )
    rows, sizes = collect(df, tmp_path / "cp")
    assert sum(sizes) == 601 and max(sizes) <= 250 and len(sizes) >= 3
    tomb = [r for r in rows if r["key"] == "gone"]
    assert tomb[0]["op"] == "delete" and tomb[0]["value"] is None
    assert rows[0]["namespace"] == topic and rows[0]["headers"] == [{"key": "h", "value": "x"}]
    check_per_key_order(
        ((r["key"], json.loads(r["value"])["seq"]) for r in rows if r["key"] != "gone"),
        {f"k{k}": 60 for k in range(10)},
    )

    # and back out through the writer, into another topic
    out = kafka.create_topic(f"{topic}-out", partitions=2)
    q = (
        sluice_spark.readStream.format("sluice-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
        .load()
        .filter("key <> 'gone'")
        .writeStream.format("sluice-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", out)
        .option("checkpointLocation", str(tmp_path / "cp-out"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = read_topic(kafka.bootstrap, out, 600, timeout=30)
    assert len(got) == 600


@pytest.mark.slow
def test_outbox_source_drains_a_table_written_concurrently(
    sluice_spark: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    prepare_outbox(postgres_dsn)
    with Database(postgres_dsn) as db:
        for t in ("outbox_spark_claims", "outbox_spark_cursor"):
            with contextlib.suppress(Exception):
                db.execute(f"DELETE FROM {t}")
    writers = Writers(postgres_dsn, total=3000, keys=40, threads=3, batch=25, pause=0.01).start()
    seen: list[tuple[str, int]] = []
    batches: dict[int, list[tuple[str, int]]] = {}
    lock = threading.Lock()

    def sink(batch: Any, batch_id: int) -> None:
        t = batch.toArrow().sort_by([("offset", "ascending")])
        with lock:
            batches[batch_id] = [
                (k, json.loads(v)["seq"])
                for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
            ]
            seen.extend(
                (k, json.loads(v)["seq"])
                for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
            )

    df = (
        sluice_spark.readStream.format("sluice-outbox")
        .option("dsn", postgres_dsn)
        .option("maxRecordsPerBatch", "500")
        .option("numPartitions", "2")
        .option("leaseTtl", "3")
        .load()
    )
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        writers.join(120)
        wait_until(lambda: len(seen) >= 3000, timeout=90, message="the outbox to drain")
    finally:
        q.stop()
    dups = check_per_key_order(seen, writers.expected)
    assert sum(dups.values()) == 0
    # Spark commits a batch to the source only when it plans the next one, and with nothing new
    # to read it plans none: exactly the last batch's rows are still in the outbox, every earlier
    # batch's purged.
    last = batches[max(batches)]
    with Database(postgres_dsn) as db:
        left = db.fetchall("SELECT kafka_key, kafka_value FROM outbox")
    values = [(k, json.loads(v if isinstance(v, str) else bytes(v))["seq"]) for k, v in left]
    assert sorted(values) == sorted(last)
    assert 0 < len(last) <= 500


def test_each_sink_query_reads_through_a_registration_of_its_own(sluice_spark: Any, tmp_path: Path) -> None:
    """Spark shares one Java environment map per registered Python source and a starting streaming
    query writes into it; queries that share a registration can tear each other's task bytes. So
    every sink query gets its own registration, which reads exactly what the public name reads."""
    from sluiceway.pipeline import PipelineSpec, build_stream
    from sluiceway.pipeline.runner import register_query_source

    path = tmp_path / "j"
    make_journal(path, [("orders", f"k{i % 3}", b"v%d" % i) for i in range(500)])
    names = {
        register_query_source(sluice_spark, "sluice-journal", "p/a"),
        register_query_source(sluice_spark, "sluice-journal", "p/b"),
        register_query_source(sluice_spark, "sluice-journal", "q/a"),
    }
    assert len(names) == 3 and all(n.startswith("sluice-journal-") for n in names)
    assert register_query_source(sluice_spark, "sluice-journal", "p/a") in names  # stable per query
    with pytest.raises(ValueError, match="no such sluiceway source 'sluice-nope'"):
        register_query_source(sluice_spark, "sluice-nope", "p/a")

    spec = (
        PipelineSpec.builder("p")
        .source("journal", path=str(path), max_records_per_batch=200)
        .sink("a", "console")
        .sink("b", "console")
        .checkpoint(str(tmp_path / "cp"))
        .build()
    )
    for sink in ("a", "b"):
        rows, sizes = collect(build_stream(sluice_spark, spec, sink), tmp_path / f"cp-{sink}")
        assert sorted(r["offset"] for r in rows) == list(range(500))
        assert sizes == [200, 200, 100]
