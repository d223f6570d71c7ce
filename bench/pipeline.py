"""Pipeline benchmark: the journal source against Spark's Parquet reader; outbox → Kafka.

1. The same N records (default 2,000,000) read by ``sluice-journal`` and by Spark's Parquet
   reader (the baseline, same run), both into the ``noop`` sink; best of three rounds each,
   after a warm-up read of each. Also through ``bench-arrow`` (``_arrow_source.py``), a Python
   data source that only hands the Parquet file's Arrow batches to Spark: the ceiling of any
   Python data source here, which tells the journal's own cost from Spark's transfer cost.
2. ``sluice-outbox`` → Kafka sink through a pipeline (``--once``): records/s from a Postgres
   outbox to a Tansu broker, including claims, reads, purges and delivery acks.
3. End to end, N records (default 1,000,000) journal → parquet through ``sluice pipeline``
   (``--once``: the sink writes from Spark's tasks), against plain Structured Streaming with the
   ``sluice-journal`` source and Spark's own Parquet sink (``writeStream.format("parquet")``,
   ``availableNow``): same session, same journal, alternating rounds after a warm-up, best of
   three. In the same rounds, journal → delta and journal → iceberg (``mode: append``, the
   record's columns: Spark writes the files from its tasks, the driver commits), each against
   the parquet sink. Also journal → journal sink and journal → postgres sink (rows/s).
4. The mirror: M changes (default 1,000,000) over K keys (default 100,000; two namespaces,
   keys drawn at random, one change in ten a delete) into a delta mirror (``mode: mirror``,
   ``columns: json``: one task per batch, one ``MERGE`` by ``[namespace, key]``) and into a
   postgres sink keyed ``[namespace, key]``: the same journal, the same batches (default
   100,000 changes), once each; changes/s, and both tables checked against the expected state.

    .venv/bin/python bench/pipeline.py [--records 2000000] [--outbox 100000] [--e2e 1000000]
        [--mirror-changes 1000000] [--mirror-keys 100000] [--mirror-batch 100000]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report, scratch_postgres, timed_drain


def make_journal(path: str, n: int) -> None:
    from sluiceway.journal import Journal

    value = json.dumps({"status": "created", "total": 1234, "items": ["a", "b", "c"]}).encode()
    with Journal.open(path, fsync=False) as j:
        for start in range(0, n, 20_000):
            with j.append() as tx:
                for i in range(start, min(n, start + 20_000)):
                    tx.write(f"order-{i % 10_000}", value, headers=[("source", "bench")], namespace="orders")


def make_mirror_journal(path: str, n: int, keys: int) -> tuple[int, int]:
    """``n`` changes over ``keys`` keys (namespaces ``orders`` and ``items``, keys drawn at random
    with a fixed seed; one change in ten a delete, the rest a small JSON object). Returns what a
    mirror of them holds: its rows, and the sum of their offsets (offsets count from 0)."""
    import random

    from sluiceway.journal import Journal

    rng = random.Random(25)
    latest: dict[int, int] = {}  # key → offset of its last change (-1: deleted)
    statuses = ("created", "paid", "shipped", "delivered")
    with Journal.open(path, fsync=False) as j:
        for start in range(0, n, 20_000):
            with j.append() as tx:
                for i in range(start, min(n, start + 20_000)):
                    k = rng.randrange(keys)
                    ns = "orders" if k % 2 else "items"
                    if i % 10 == 9:
                        tx.write(f"k{k}", None, namespace=ns)
                        latest[k] = -1
                        continue
                    value = {"id": k, "n": i, "status": statuses[i % 4], "total": 12.5 + i % 100}
                    tx.write(f"k{k}", json.dumps(value).encode(), namespace=ns)
                    latest[k] = i
    live = [o for o in latest.values() if o >= 0]
    return len(live), sum(live)


def run_once(spark: object, work: str, journal: str, batch: int, tag: str, sink: dict[str, object]) -> float:
    """Seconds for ``Pipeline(...).run(once=True)`` of ``journal`` into ``sink``, batches of ``batch``."""
    from sluiceway.pipeline import Pipeline, PipelineSpec

    spec = PipelineSpec.from_dict(
        {
            "name": f"e2e-{tag}",
            "source": {"type": "journal", "path": journal, "max_records_per_batch": batch},
            "sinks": [{"name": "out", **sink}],
            "checkpoint": os.path.join(work, f"cp-{tag}"),
        }
    )
    t0 = time.perf_counter()
    runs = Pipeline(spec, spark).run(once=True, handle_signals=False)
    elapsed = time.perf_counter() - t0
    assert runs["out"].state == "finished", runs
    return elapsed


def journal_to_parquet(journal: str, target: str) -> None:
    import pyarrow.parquet as pq

    from sluiceway.journal import Journal

    with Journal.open(journal, read_only=True) as j:
        writer = None
        for batch in j.read_arrow(0, None, max_rows=200_000):
            if writer is None:
                writer = pq.ParquetWriter(target, batch.schema)
            writer.write_batch(batch)
        if writer is not None:
            writer.close()


def timed_noop(df: object) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def bench_read(spark: object, n: int, work: str) -> dict[str, float]:
    journal, parquet = os.path.join(work, "journal"), os.path.join(work, "records.parquet")
    t0 = time.perf_counter()
    make_journal(journal, n)
    journal_to_parquet(journal, parquet)
    print(f"data: {n:,} records written in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    jdf = spark.read.format("sluice-journal").option("path", journal)  # type: ignore[attr-defined]
    pdf = spark.read.parquet  # type: ignore[attr-defined]
    adf = spark.read.format("bench-arrow").option("path", parquet)  # type: ignore[attr-defined]
    times = {"journal": [], "parquet": [], "arrow": []}  # type: dict[str, list[float]]
    # Warm up every path (Python workers started, modules imported, files in the page cache).
    timed_noop(pdf(parquet))
    timed_noop(jdf.load())
    timed_noop(adf.load())
    for _ in range(3):  # alternate, so none gets a warmer machine
        times["parquet"].append(timed_noop(pdf(parquet)))
        times["journal"].append(timed_noop(jdf.load()))
        times["arrow"].append(timed_noop(adf.load()))
    parts = jdf.load().rdd.getNumPartitions()
    return {
        "journal_rps": n / min(times["journal"]),
        "parquet_rps": n / min(times["parquet"]),
        "arrow_rps": n / min(times["arrow"]),
        "journal_s": min(times["journal"]),
        "parquet_s": min(times["parquet"]),
        "arrow_s": min(times["arrow"]),
        "journal_partitions": parts,
    }


def bench_e2e(spark: object, n: int, work: str) -> dict[str, float]:
    """journal → parquet through the pipeline vs plain Structured Streaming with Spark's Parquet
    sink; journal → delta and → iceberg (append) in the same rounds."""
    journal = os.path.join(work, "e2e-journal")
    make_journal(journal, n)
    rounds: dict[str, list[float]] = {"pipeline": [], "native": [], "delta": [], "iceberg": []}
    warehouse = os.path.join(work, "warehouse")
    os.makedirs(warehouse)
    catalog = {"type": "sql", "uri": f"sqlite:///{work}/catalog.db", "warehouse": f"file://{warehouse}"}

    def pipeline_once(tag: str, sink: dict[str, object]) -> float:
        return run_once(spark, work, journal, n, tag, sink)

    def delta(tag: str) -> dict[str, object]:
        return {"type": "delta", "path": os.path.join(work, f"delta-{tag}")}

    def iceberg(tag: str) -> dict[str, object]:
        return {"type": "iceberg", "catalog": catalog, "table": f"bench.append_{tag}"}

    def native_once(tag: str) -> float:
        df = (
            spark.readStream.format("sluice-journal")
            .option("path", journal)
            .option(  # type: ignore[attr-defined]
                "maxRecordsPerBatch", str(n)
            )
            .load()
        )
        t0 = time.perf_counter()
        query = (
            df.writeStream.format("parquet")
            .option("path", os.path.join(work, f"native-{tag}"))
            .option("checkpointLocation", os.path.join(work, f"native-cp-{tag}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return time.perf_counter() - t0

    pipeline_once("warm", {"type": "parquet", "path": os.path.join(work, "lake-warm")})
    native_once("warm")
    pipeline_once("delta-warm", delta("warm"))
    pipeline_once("iceberg-warm", iceberg("warm"))
    for i in range(3):  # alternate, so none gets a warmer machine; every round a new table
        steps = [
            lambda: rounds["pipeline"].append(
                pipeline_once(f"p{i}", {"type": "parquet", "path": os.path.join(work, f"lake-{i}")})  # noqa: B023
            ),
            lambda: rounds["native"].append(native_once(f"n{i}")),  # noqa: B023
            lambda: rounds["delta"].append(pipeline_once(f"d{i}", delta(str(i)))),  # noqa: B023
            lambda: rounds["iceberg"].append(pipeline_once(f"i{i}", iceberg(str(i)))),  # noqa: B023
        ]
        for step in steps if i % 2 == 0 else reversed(steps):
            step()
    delta_rows = count_delta(os.path.join(work, "delta-0"))
    iceberg_rows = count_iceberg(catalog, "bench.append_0")
    assert delta_rows == n and iceberg_rows == n, (delta_rows, iceberg_rows)
    journal_sink = pipeline_once("journal", {"type": "journal", "path": os.path.join(work, "copy")})
    with scratch_postgres("sluice_bench_e2e") as dsn:
        postgres_sink = pipeline_once("postgres", {"type": "postgres", "dsn": dsn, "table": "latest"})
    return {
        "pipeline_rps": n / min(rounds["pipeline"]),
        "native_rps": n / min(rounds["native"]),
        "pipeline_rounds": rounds["pipeline"],  # type: ignore[dict-item]
        "native_rounds": rounds["native"],  # type: ignore[dict-item]
        "journal_sink_rps": n / journal_sink,
        "postgres_sink_rps": n / postgres_sink,
        "delta_rps": n / min(rounds["delta"]),
        "iceberg_rps": n / min(rounds["iceberg"]),
        "delta_rounds": rounds["delta"],  # type: ignore[dict-item]
        "iceberg_rounds": rounds["iceberg"],  # type: ignore[dict-item]
    }


def count_delta(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows()


def count_iceberg(catalog: dict[str, str], table: str) -> int:
    from pyiceberg.catalog import load_catalog

    # The sink loads its catalog as "sluice", and a SQL catalog keeps its tables per catalog name.
    return len(
        load_catalog("sluice", **catalog).load_table(table).scan(selected_fields=("offset",)).to_arrow()
    )


def bench_mirror(spark: object, changes: int, keys: int, batch: int, work: str) -> dict[str, float]:
    """The same journal of ``changes`` over ``keys`` keys into a delta mirror (MERGE by
    ``[namespace, key]``) and into a postgres sink keyed the same, once each; both checked."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from sluiceway.db import Database

    journal = os.path.join(work, "mirror-journal")
    t0 = time.perf_counter()
    rows, offset_sum = make_mirror_journal(journal, changes, keys)
    print(f"mirror data: {changes:,} changes written in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    table = os.path.join(work, "mirror-delta")
    delta_s = run_once(
        spark,
        work,
        journal,
        batch,
        "mirror-delta",
        {"type": "delta", "path": table, "mode": "mirror", "columns": "json"},
    )
    got = DeltaTable(table).to_pyarrow_table(columns=["offset"]).column("offset")
    assert (len(got), pc.sum(got).as_py()) == (rows, offset_sum), ("delta", len(got), rows)
    with scratch_postgres("sluice_bench_mirror") as dsn:
        postgres_s = run_once(
            spark,
            work,
            journal,
            batch,
            "mirror-postgres",
            {"type": "postgres", "dsn": dsn, "table": "mirror", "key": ["namespace", "key"]},
        )
        with Database(dsn) as db:
            row = db.fetchone('SELECT count(*), sum("offset") FROM mirror')
        assert row is not None and (row[0], int(row[1])) == (rows, offset_sum), ("postgres", row, rows)
    return {
        "delta_cps": changes / delta_s,
        "postgres_cps": changes / postgres_s,
        "delta_s": delta_s,
        "postgres_s": postgres_s,
        "rows": rows,
    }


def bench_outbox(spark: object, rows: int, work: str) -> dict[str, float]:
    from sluiceway.db import Database
    from sluiceway.harvest import HarvestConfig
    from sluiceway.outbox import init_outbox
    from sluiceway.pipeline import Pipeline, PipelineSpec
    from sluiceway.testing import Broker

    def fill(dsn: str) -> None:
        with Database(dsn) as db:
            init_outbox(db)
            # Rows as the stasher writes them, generated in the database (the bench is the source).
            db.execute(
                "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
                "kafka_header_values) SELECT now(), 'orders', 'order-' || (g %% 1000), "
                "'{\"status\": \"created\", \"total\": ' || g || '}', ARRAY['source'], ARRAY['bench'] "
                "FROM generate_series(1, %(n)s) g",
                {"n": rows},
            )

    with scratch_postgres("sluice_bench_pipe") as dsn, Broker() as broker:
        fill(dsn)
        broker.create_topic("orders-out", partitions=3)
        spec = PipelineSpec.from_dict(
            {
                "name": "bench",
                "source": {"type": "outbox", "dsn": dsn, "max_records_per_batch": 25_000, "partitions": 2},
                "sinks": [
                    {
                        "name": "bus",
                        "type": "kafka",
                        "topic": "orders-out",
                        "config": {"bootstrap.servers": broker.bootstrap, "linger.ms": "20"},
                    }
                ],
                "checkpoint": os.path.join(work, "cp"),
            }
        )
        t0 = time.perf_counter()
        runs = Pipeline(spec, spark).run(once=True, handle_signals=False)
        elapsed = time.perf_counter() - t0
        assert runs["bus"].state == "finished", runs
        with Database(dsn) as db:
            left = db.fetchone("SELECT count(*) FROM outbox")
        # The harvester on the same rows, into the same broker (its own topic), in the same run.
        fill(dsn)
        broker.create_topic("orders", partitions=3)
        harvest = timed_drain(
            HarvestConfig.from_dict(
                {
                    "harvest": {
                        "name": "bench-pipe-harvest",
                        "dataSource": dsn,
                        "baseKafkaConfig": {"bootstrap.servers": broker.bootstrap},
                        "election": {"kind": "database"},
                        "limits": {"markQueryRecords": 500, "minMetricsInterval": "60s"},
                    }
                }
            ),
            rows,
            lambda: outbox_left(dsn),
        )
        return {
            "outbox_to_kafka_rps": rows / elapsed,
            "outbox_s": elapsed,
            "outbox_left": float(left[0] if left else -1),
            "harvest_to_kafka_rps": harvest,
        }


def outbox_only(rows: int, rounds: int) -> None:
    """(2) alone: a warm-up run (Spark's first micro-batches, the Python workers' imports), then
    ``rounds`` runs, each the pipeline and then the harvester on the same rows; the median of
    the per-round ratios."""
    import statistics

    from sluiceway.pipeline import build_session, register_sources

    spark = build_session("local[2]", app_name="bench-pipeline-outbox")
    register_sources(spark)
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as work:
        for r in range(rounds + 1):
            run = bench_outbox(spark, rows, os.path.join(work, str(r)))
            print(f"run {r}{' (warm-up)' if r == 0 else ''}: {run}", file=sys.stderr)
            if r:
                runs.append(run)
    spark.stop()  # type: ignore[attr-defined]
    source = [r["outbox_to_kafka_rps"] for r in runs]
    harvest = [r["harvest_to_kafka_rps"] for r in runs]
    ratios = [s / h for s, h in zip(source, harvest, strict=True)]
    report(
        f"pipeline outbox → Kafka beside the harvester: {rows:,} rows, {rounds} rounds after a warm-up",
        [
            ("outbox source → Kafka, records/s", " / ".join(f"{x:,.0f}" for x in source)),
            ("harvester → Kafka, records/s", " / ".join(f"{x:,.0f}" for x in harvest)),
            (
                "source / harvester (target >= 0.5)",
                f"{statistics.median(ratios):.2f}  (rounds {', '.join(f'{x:.2f}' for x in ratios)})",
            ),
        ],
        {
            "bench": "pipeline-outbox",
            "outbox_to_kafka_rps": round(statistics.median(source)),
            "harvest_to_kafka_rps": round(statistics.median(harvest)),
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(x, 3) for x in ratios],
        },
    )


def outbox_left(dsn: str) -> int:
    from sluiceway.db import Database

    with Database(dsn) as db:
        row = db.fetchone("SELECT count(*) FROM outbox")
    return int(row[0]) if row else -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--outbox", type=int, default=100_000)
    ap.add_argument("--e2e", type=int, default=1_000_000, help="records for the end-to-end measure")
    ap.add_argument("--mirror-changes", type=int, default=1_000_000, help="changes for the mirror measure")
    ap.add_argument("--mirror-keys", type=int, default=100_000, help="keys the mirror's changes are over")
    ap.add_argument(
        "--mirror-batch", type=int, default=100_000, help="changes per micro-batch in the mirror measure"
    )
    ap.add_argument(
        "--outbox-only",
        type=int,
        metavar="ROUNDS",
        help="only (2): ROUNDS runs of outbox → Kafka beside the harvester, after one warm-up run",
    )
    args = ap.parse_args()
    if args.outbox_only:
        outbox_only(args.outbox, args.outbox_only)
        return

    from _arrow_source import ArrowFileSource
    from sluiceway.pipeline import build_session, register_sources

    # Spark's Python workers import the reference source by name: let them find bench/.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    spark = build_session("local[2]", app_name="bench-pipeline")
    register_sources(spark)
    spark.dataSource.register(ArrowFileSource)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as work:
        read = bench_read(spark, args.records, work)
        print(f"read: {read}", file=sys.stderr)
        out = bench_outbox(spark, args.outbox, work)
        e2e = bench_e2e(spark, args.e2e, work)
        print(f"e2e: {e2e}", file=sys.stderr)
        mirror = bench_mirror(spark, args.mirror_changes, args.mirror_keys, args.mirror_batch, work)
        print(f"mirror: {mirror}", file=sys.stderr)
    ratio = read["journal_rps"] / read["parquet_rps"]
    report(
        f"pipeline: {args.records:,} records into noop (local[2]); outbox {args.outbox:,} rows → Kafka",
        [
            (
                "Parquet reader (baseline), records/s",
                f"{read['parquet_rps']:,.0f}  ({read['parquet_s']:.2f}s)",
            ),
            ("sluice-journal source, records/s", f"{read['journal_rps']:,.0f}  ({read['journal_s']:.2f}s)"),
            ("journal / parquet", f"{ratio:.2f}  (target ≥ 0.60)"),
            (
                "Python data source ceiling (bench-arrow), records/s",
                f"{read['arrow_rps']:,.0f}  ({read['arrow_s']:.2f}s)",
            ),
            ("ceiling / parquet", f"{read['arrow_rps'] / read['parquet_rps']:.2f}"),
            ("journal / ceiling", f"{read['journal_rps'] / read['arrow_rps']:.2f}"),
            ("journal source partitions", f"{read['journal_partitions']:.0f}"),
            (
                "outbox → Kafka pipeline, records/s",
                f"{out['outbox_to_kafka_rps']:,.0f}  ({out['outbox_s']:.1f}s)",
            ),
            ("outbox rows left after --once", f"{out['outbox_left']:.0f}"),
            (
                "the harvester, same rows and broker, records/s",
                f"{out['harvest_to_kafka_rps']:,.0f}  (outbox source / harvester "
                f"{out['outbox_to_kafka_rps'] / out['harvest_to_kafka_rps']:.2f}; target >= 0.5)",
            ),
            (
                f"e2e journal → parquet, {args.e2e:,} records: sluice pipeline, records/s",
                f"{e2e['pipeline_rps']:,.0f}",
            ),
            ("e2e plain Structured Streaming + Spark's Parquet sink, records/s", f"{e2e['native_rps']:,.0f}"),
            (
                "e2e ratio (pipeline / plain)",
                f"{e2e['pipeline_rps'] / e2e['native_rps']:.2f}  (target ≥ 0.90)",
            ),
            ("e2e journal → journal sink, records/s", f"{e2e['journal_sink_rps']:,.0f}"),
            ("e2e journal → postgres sink (upsert), records/s", f"{e2e['postgres_sink_rps']:,.0f}"),
            ("e2e journal → delta (append), records/s", f"{e2e['delta_rps']:,.0f}"),
            (
                "e2e delta / parquet sink",
                f"{e2e['delta_rps'] / e2e['pipeline_rps']:.2f}  (target ≥ 0.80)",
            ),
            ("e2e journal → iceberg (append), records/s", f"{e2e['iceberg_rps']:,.0f}"),
            ("e2e iceberg / parquet sink", f"{e2e['iceberg_rps'] / e2e['pipeline_rps']:.2f}"),
            (
                f"mirror {args.mirror_changes:,} changes over {args.mirror_keys:,} keys "
                f"(batches of {args.mirror_batch:,}): delta MERGE, changes/s",
                f"{mirror['delta_cps']:,.0f}  ({mirror['delta_s']:.1f}s)",
            ),
            (
                "mirror: postgres sink upsert by (namespace, key), changes/s",
                f"{mirror['postgres_cps']:,.0f}  ({mirror['postgres_s']:.1f}s)",
            ),
            ("mirror delta / postgres", f"{mirror['delta_cps'] / mirror['postgres_cps']:.2f}"),
            ("mirror rows (both tables checked)", f"{mirror['rows']:,.0f}"),
        ],
        {
            "bench": "pipeline",
            "journal_rps": round(read["journal_rps"]),
            "parquet_rps": round(read["parquet_rps"]),
            "ratio": round(ratio, 3),
            "python_source_ceiling_rps": round(read["arrow_rps"]),
            "ratio_vs_ceiling": round(read["journal_rps"] / read["arrow_rps"], 3),
            "outbox_to_kafka_rps": round(out["outbox_to_kafka_rps"]),
            "harvest_to_kafka_rps": round(out["harvest_to_kafka_rps"]),
            "e2e_records": args.e2e,
            "e2e_pipeline_rps": round(e2e["pipeline_rps"]),
            "e2e_native_rps": round(e2e["native_rps"]),
            "e2e_ratio": round(e2e["pipeline_rps"] / e2e["native_rps"], 3),
            "e2e_journal_sink_rps": round(e2e["journal_sink_rps"]),
            "e2e_postgres_sink_rps": round(e2e["postgres_sink_rps"]),
            "e2e_delta_rps": round(e2e["delta_rps"]),
            "e2e_iceberg_rps": round(e2e["iceberg_rps"]),
            "e2e_delta_ratio": round(e2e["delta_rps"] / e2e["pipeline_rps"], 3),
            "e2e_iceberg_ratio": round(e2e["iceberg_rps"] / e2e["pipeline_rps"], 3),
            "mirror_changes": args.mirror_changes,
            "mirror_keys": args.mirror_keys,
            "mirror_batch": args.mirror_batch,
            "mirror_delta_cps": round(mirror["delta_cps"]),
            "mirror_postgres_cps": round(mirror["postgres_cps"]),
        },
    )
    spark.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
