"""Change data capture benchmark: the postgres-cdc source against PostgreSQL's own ceilings.

(a) sync: the same N changes (inserts in transactions of T rows) read through the
    ``sluice-postgres-cdc`` source into Spark's ``noop`` sink (``availableNow``), against a raw
    ``pg_logical_slot_get_binary_changes`` drain of the same changes by a client (same slot
    options, rows fetched, nothing parsed). The slots are created at the same position before
    the changes are written. The source's rate is given end to end (query start included) and
    steady (its micro-batches only, from Spark's progress reports). Also measured, to show where
    the time goes: the reader alone (decoding into Arrow, no Spark), Spark's own ceiling for a
    Python source (``bench-arrow``: the same records, already decoded, handed over from a file),
    and a whole pipeline into a journal sink.
(b) copy: a table of M rows copied by the source (``snapshot: initial``, chunks) into ``noop``,
    against ``COPY table TO STDOUT`` read by a client; and against the server's own JSON ceiling,
    ``COPY (SELECT row_to_json(t) FROM table t) TO STDOUT`` (records carry each row as JSON).

Serial ceilings: a micro-batch plans on the driver, then its tasks hand the records to Spark, one
after the other. So no source of this kind can pass the server's part (the raw drain; the JSON
rendering) followed by Spark's transfer, with no work of its own: 1 / (1/server + 1/spark).

Rounds alternate the order of ours and the baseline; the best round of each counts. The server
is a private PostgreSQL (wal_level = logical) started for the run.

    .venv/bin/python bench/cdc.py [--changes 500000] [--txn 50] [--rows 500000] [--rounds 3]

Prints a table, then one JSON line: {"bench": "cdc", "sync_ratio": …, "copy_ratio": …, …}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report
from sluiceway.testing import PrivatePostgres

OPTIONS = "'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true'"


def setup(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE events (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12, 2), "
            "note text, at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("CREATE PUBLICATION bench_pub FOR TABLE events")
        conn.execute(
            "CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12, 2), "
            "opened timestamptz NOT NULL DEFAULT now(), tags text[])"
        )
        conn.execute(
            "INSERT INTO accounts SELECT g, 'owner-' || g, g * 1.25, now(), ARRAY['a', 'b'] "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("CREATE PUBLICATION copy_pub FOR TABLE accounts")
        conn.execute("VACUUM ANALYZE accounts")


def write_changes(dsn: str, start: int, changes: int, per_txn: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for at in range(start, start + changes, per_txn):
            conn.execute(
                "INSERT INTO events (id, account, amount, note) SELECT g, g %% 1000, g * 0.01, 'event ' || g "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (at, at + per_txn - 1),
            )


def raw_drain(dsn: str, slot: str) -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        cur = conn.cursor(binary=True)
        cur.execute(
            f"SELECT lsn, xid, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, {OPTIONS})",
            (slot,),
        )
        changes = sum(1 for _lsn, _xid, data in cur if data[:1] == b"I")
        return time.perf_counter() - t0, changes


def raw_copy(dsn: str, query: str = "accounts") -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        t0 = time.perf_counter()
        size = 0
        with cur.copy(f"COPY {query} TO STDOUT") as copy:
            for block in copy:
                size += len(block)
        return time.perf_counter() - t0, size


def source_to_noop(
    spark: Any, dsn: str, slot: str, publication: str, table: str, snapshot: str, work: str
) -> float:
    df = (
        spark.readStream.format("sluice-postgres-cdc")
        .option("dsn", dsn)
        .option("tables", table)
        .option("slot", slot)
        .option("publication", publication)
        .option("snapshot", snapshot)
        .option("chunkSize", "20000")
        .option("maxRecordsPerBatch", "100000")
        .option("stateDir", os.path.join(work, "state"))
        .load()
    )
    t0 = time.perf_counter()
    query = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", os.path.join(work, "cp"))
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - t0
    busy = sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]) / 1000
    return elapsed, busy


def reader_alone(dsn: str, slot: str, work: str, parquet: str | None = None) -> tuple[float, int]:
    """The reader without Spark; optionally keeps its batches in a Parquet file (for bench-arrow)."""
    import pyarrow.parquet as pq

    from sluiceway.cdc import CdcOptions, CdcReader

    reader = CdcReader(
        CdcOptions(
            dsn=dsn,
            tables=("public.events",),
            slot=slot,
            publication="bench_pub",
            state_dir=os.path.join(work, "state"),
            snapshot="never",
        )
    )
    try:
        position = reader.initial_offset()
        t0 = time.perf_counter()
        n = 0
        batches = []
        while True:
            end = reader.latest_offset(position, 100_000)
            if end == position:
                elapsed = time.perf_counter() - t0
                if parquet is not None:
                    pq.write_table(pa.Table.from_batches(batches), parquet, row_group_size=100_000)
                return elapsed, n
            batch = reader.read(position, end, 0)
            n += batch.num_rows
            if parquet is not None:
                batches.append(batch)
            reader.commit(end)
            position = end
    finally:
        reader.close()


def pipeline_to_journal(spark: Any, dsn: str, slot: str, work: str) -> float:
    from sluiceway.pipeline import Pipeline, PipelineSpec

    spec = PipelineSpec.from_dict(
        {
            "name": "bench",
            "source": {
                "type": "postgres-cdc",
                "dsn": dsn,
                "tables": ["public.events"],
                "slot": slot,
                "publication": "bench_pub",
                "snapshot": "never",
                "max_records_per_batch": 100_000,
            },
            "sinks": [{"name": "log", "type": "journal", "path": os.path.join(work, "log")}],
            "checkpoint": os.path.join(work, "cp"),
        }
    )
    pipeline = Pipeline(spec, spark)
    pipeline.preflight()  # creates nothing new here; keeps set-up out of the timing
    t0 = time.perf_counter()
    runs = pipeline.run(once=True, handle_signals=False)
    elapsed = time.perf_counter() - t0
    assert {r.state for r in runs.values()} == {"finished"}, runs
    return elapsed


def spark_ceiling(spark: Any, parquet: str) -> float:
    """The same records handed to Spark by a Python source that only reads them from a file."""
    t0 = time.perf_counter()
    spark.read.format("bench-arrow").option("path", parquet).option("partitions", "1").load().write.format(
        "noop"
    ).mode("overwrite").save()
    return time.perf_counter() - t0


def drop_slots(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def best(times: list[float]) -> float:
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=500_000)
    parser.add_argument("--txn", type=int, default=50, help="rows per transaction of the changes")
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the copied table")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers import the reference source by name: let them find bench/.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    from _arrow_source import ArrowFileSource
    from sluiceway.pipeline import register_sources
    from sluiceway.pipeline.session import build_session

    work_root = tempfile.mkdtemp(prefix="sluice-bench-cdc-")
    settings = {"wal_level": "logical", "max_replication_slots": "20", "shared_buffers": "'256MB'"}
    server = PrivatePostgres({**settings, "max_wal_size": "'4GB'"}).start()
    spark = build_session("local[2]", app_name="bench-cdc")
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    spark.dataSource.register(ArrowFileSource)
    dsn = server.dsn()
    t: dict[str, list[float]] = {
        k: []
        for k in (
            "raw",
            "ours",
            "ours_busy",
            "alone",
            "ceiling",
            "journal",
            "copy_raw",
            "copy_json",
            "copy",
            "copy_busy",
        )
    }
    try:
        setup(dsn, args.rows)
        next_id = 1
        for round_no in range(args.rounds):
            work = os.path.join(work_root, f"r{round_no}")
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name in ("raw", "ours", "alone", "journal"):
                    conn.execute(
                        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{name}_{round_no}",)
                    )
            write_changes(dsn, next_id, args.changes, args.txn)
            next_id += args.changes
            source = partial(
                source_to_noop, spark, dsn, f"ours_{round_no}", "bench_pub", "public.events", "never"
            )
            steps: list[Callable[[], None]] = [
                partial(_record_raw, t, dsn, f"raw_{round_no}", args.changes),
                partial(_record_source, t, "ours", source, work + "-n"),
            ]
            for step in steps if round_no % 2 == 0 else reversed(steps):
                step()
            parquet = os.path.join(work_root, f"records-{round_no}.parquet")
            t["alone"].append(
                _checked(reader_alone(dsn, f"alone_{round_no}", work + "-a", parquet), args.changes)
            )
            t["ceiling"].append(spark_ceiling(spark, parquet))
            t["journal"].append(pipeline_to_journal(spark, dsn, f"journal_{round_no}", work + "-j"))
            copy = partial(
                source_to_noop, spark, dsn, f"copy_{round_no}", "copy_pub", "public.accounts", "initial"
            )
            copy_steps: list[Callable[[], None]] = [
                lambda: t["copy_raw"].append(raw_copy(dsn)[0]),
                lambda: t["copy_json"].append(raw_copy(dsn, "(SELECT row_to_json(a) FROM accounts a)")[0]),
                partial(_record_source, t, "copy", copy, work + "-c"),
            ]
            for step in copy_steps if round_no % 2 == 0 else reversed(copy_steps):
                step()
            drop_slots(dsn)
            shutil.rmtree(work_root, ignore_errors=True)
            os.makedirs(work_root, exist_ok=True)
            print(f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in t.items()), flush=True)
        n, m = args.changes, args.rows
        rate = {k: (m if k.startswith("copy") else n) / min(v) for k, v in t.items()}
        # What any source doing its work one step after the other (as a micro-batch does: plan on
        # the driver, then the tasks hand records to Spark) could reach with no work of its own:
        # the server's part (fetch the changes; render rows as JSON) then Spark's transfer.
        rate["serial_ceiling"] = 1 / (1 / rate["raw"] + 1 / rate["ceiling"])
        rate["copy_serial_ceiling"] = 1 / (1 / rate["copy_json"] + 1 / rate["ceiling"])
        summary = {
            "bench": "cdc",
            "changes": n,
            "rows_per_txn": args.txn,
            "copy_rows": m,
            "rounds": args.rounds,
            **{f"{k}_per_s": round(v) for k, v in rate.items()},
            "sync_ratio": round(rate["ours_busy"] / rate["raw"], 3),
            "sync_ratio_end_to_end": round(rate["ours"] / rate["raw"], 3),
            "sync_vs_spark_ceiling": round(rate["ours_busy"] / rate["ceiling"], 3),
            "reader_alone_ratio": round(rate["alone"] / rate["raw"], 3),
            "serial_ceiling_ratio": round(rate["serial_ceiling"] / rate["raw"], 3),
            "sync_vs_serial_ceiling": round(rate["ours_busy"] / rate["serial_ceiling"], 3),
            "copy_ratio": round(rate["copy_busy"] / rate["copy_raw"], 3),
            "copy_ratio_end_to_end": round(rate["copy"] / rate["copy_raw"], 3),
            "copy_vs_json_ceiling": round(rate["copy_busy"] / rate["copy_json"], 3),
            "json_ceiling_ratio": round(rate["copy_json"] / rate["copy_raw"], 3),
            "copy_serial_ceiling_ratio": round(rate["copy_serial_ceiling"] / rate["copy_raw"], 3),
            "copy_vs_serial_ceiling": round(rate["copy_busy"] / rate["copy_serial_ceiling"], 3),
        }
        report(
            f"postgres-cdc against PostgreSQL's own ceilings (best of {args.rounds} rounds each)",
            [
                ("(a) raw slot drain: get_binary_changes, fetched", f"{rate['raw']:,.0f} changes/s"),
                ("sluice-postgres-cdc → noop, steady", f"{rate['ours_busy']:,.0f} changes/s"),
                ("sluice-postgres-cdc → noop, with query start", f"{rate['ours']:,.0f} changes/s"),
                ("sync ratio (steady / raw drain)", f"{summary['sync_ratio']:.2f}"),
                ("reader alone, no Spark", f"{rate['alone']:,.0f} changes/s"),
                ("Spark's Python-source ceiling, same records", f"{rate['ceiling']:,.0f} records/s"),
                ("drain, then Spark's transfer (serial ceiling)", f"{rate['serial_ceiling']:,.0f} changes/s"),
                ("serial ceiling / raw drain", f"{summary['serial_ceiling_ratio']:.2f}"),
                ("pipeline → journal sink", f"{rate['journal']:,.0f} changes/s"),
                ("(b) COPY accounts TO STDOUT", f"{rate['copy_raw']:,.0f} rows/s"),
                ("COPY of row_to_json (the server's JSON ceiling)", f"{rate['copy_json']:,.0f} rows/s"),
                ("copy → noop, steady", f"{rate['copy_busy']:,.0f} rows/s"),
                ("copy → noop, with query start", f"{rate['copy']:,.0f} rows/s"),
                ("copy ratio (steady / COPY)", f"{summary['copy_ratio']:.2f}"),
                (
                    "JSON render, then Spark's transfer (serial ceiling)",
                    f"{rate['copy_serial_ceiling']:,.0f} rows/s",
                ),
                ("serial ceiling / COPY", f"{summary['copy_serial_ceiling_ratio']:.2f}"),
            ],
            summary,
        )
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work_root, ignore_errors=True)


def _record_raw(t: dict[str, list[float]], dsn: str, slot: str, expected: int) -> None:
    t["raw"].append(_checked(raw_drain(dsn, slot), expected))


def _record_source(
    t: dict[str, list[float]], name: str, run: Callable[[str], tuple[float, float]], work: str
) -> None:
    elapsed, busy = run(work)
    t[name].append(elapsed)
    t[f"{name}_busy"].append(busy)


def _checked(result: tuple[float, int], expected: int) -> float:
    elapsed, count = result
    if count != expected:
        raise SystemExit(f"expected {expected} changes, read {count}")
    return elapsed


if __name__ == "__main__":
    main()
