"""Change data capture benchmark: the postgres-cdc source against PostgreSQL's own ceilings.

(a) sync: the same N changes (inserts in transactions of T rows) read through the
    ``sluice-postgres-cdc`` source into Spark's ``noop`` sink (``availableNow``), against a raw
    ``pg_logical_slot_get_binary_changes`` drain of the same changes by a client (same slot
    options, rows fetched, nothing parsed). Two slots are created at the same position before
    the changes are written. Also shown: the reader alone (no Spark), and a whole pipeline
    into a journal sink.
(b) copy: a table of M rows copied by the source (``snapshot: initial``, chunks) into ``noop``,
    against ``COPY table TO STDOUT`` read by a client.

Rounds alternate the order of ours and the baseline; the best round of each counts. The server
is a private PostgreSQL (wal_level = logical) started for the run.

    .venv/bin/python bench/cdc.py [--changes 200000] [--txn 50] [--rows 500000] [--rounds 3]

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


def raw_copy(dsn: str) -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        t0 = time.perf_counter()
        size = 0
        with cur.copy("COPY accounts TO STDOUT") as copy:
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
    return time.perf_counter() - t0


def reader_alone(dsn: str, slot: str, work: str) -> tuple[float, int]:
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
        while True:
            end = reader.latest_offset(position, 100_000)
            if end == position:
                return time.perf_counter() - t0, n
            n += reader.read(position, end, 0).num_rows
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


def drop_slots(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def best(times: list[float]) -> float:
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--txn", type=int, default=50, help="rows per transaction of the changes")
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the copied table")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sluiceway.pipeline import register_sources
    from sluiceway.pipeline.session import build_session

    work_root = tempfile.mkdtemp(prefix="sluice-bench-cdc-")
    server = PrivatePostgres(
        {
            "wal_level": "logical",
            "max_replication_slots": "20",
            "shared_buffers": "'256MB'",
            "max_wal_size": "'4GB'",
        }
    ).start()
    spark = build_session("local[2]", app_name="bench-cdc")
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    dsn = server.dsn()
    try:
        setup(dsn, args.rows)
        raw_sync: list[float] = []
        ours_sync: list[float] = []
        alone: list[float] = []
        journal: list[float] = []
        raw_copy_t: list[float] = []
        ours_copy: list[float] = []
        next_id = 1
        copy_bytes = 0
        for round_no in range(args.rounds):
            work = os.path.join(work_root, f"r{round_no}")
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name in ("raw", "ours", "alone", "journal"):
                    conn.execute(
                        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{name}_{round_no}",)
                    )
            write_changes(dsn, next_id, args.changes, args.txn)
            next_id += args.changes
            steps: list[Callable[[], None]] = [
                partial(_timed_raw, raw_sync, dsn, f"raw_{round_no}", args.changes),
                partial(
                    _timed_source,
                    ours_sync,
                    spark,
                    dsn,
                    f"ours_{round_no}",
                    "bench_pub",
                    "public.events",
                    "never",
                    work + "-n",
                ),
            ]
            for step in steps if round_no % 2 == 0 else reversed(steps):
                step()
            alone.append(_checked(reader_alone(dsn, f"alone_{round_no}", work + "-a"), args.changes))
            journal.append(pipeline_to_journal(spark, dsn, f"journal_{round_no}", work + "-j"))
            copy_steps: list[Callable[[], None]] = [
                partial(_timed_copy, raw_copy_t, dsn),
                partial(
                    _timed_source,
                    ours_copy,
                    spark,
                    dsn,
                    f"copy_{round_no}",
                    "copy_pub",
                    "public.accounts",
                    "initial",
                    work + "-c",
                ),
            ]
            for step in copy_steps if round_no % 2 == 0 else reversed(copy_steps):
                step()
            copy_bytes = raw_copy(dsn)[1]
            drop_slots(dsn)
            shutil.rmtree(work_root, ignore_errors=True)
            os.makedirs(work_root, exist_ok=True)
            print(
                f"round {round_no}: raw drain {raw_sync[-1]:.2f}s, source→noop {ours_sync[-1]:.2f}s, "
                f"reader alone {alone[-1]:.2f}s, pipeline→journal {journal[-1]:.2f}s, "
                f"COPY {raw_copy_t[-1]:.2f}s, copy→noop {ours_copy[-1]:.2f}s",
                flush=True,
            )
        n, m = args.changes, args.rows
        raw_rate, ours_rate = n / best(raw_sync), n / best(ours_sync)
        copy_raw_rate, copy_rate = m / best(raw_copy_t), m / best(ours_copy)
        summary = {
            "bench": "cdc",
            "changes": n,
            "rows_per_txn": args.txn,
            "copy_rows": m,
            "rounds": args.rounds,
            "raw_drain_changes_per_s": round(raw_rate),
            "source_noop_changes_per_s": round(ours_rate),
            "sync_ratio": round(ours_rate / raw_rate, 3),
            "reader_alone_changes_per_s": round(n / best(alone)),
            "pipeline_journal_changes_per_s": round(n / best(journal)),
            "journal_ratio": round(n / best(journal) / raw_rate, 3),
            "raw_copy_rows_per_s": round(copy_raw_rate),
            "copy_rows_per_s": round(copy_rate),
            "copy_ratio": round(copy_rate / copy_raw_rate, 3),
            "copy_table_bytes_text": copy_bytes,
        }
        report(
            "postgres-cdc vs PostgreSQL's own ceilings (best of each)",
            [
                ("raw slot drain (get_binary_changes, fetched)", f"{raw_rate:,.0f} changes/s"),
                ("sluice-postgres-cdc → noop", f"{ours_rate:,.0f} changes/s"),
                ("sync ratio", f"{ours_rate / raw_rate:.2f}"),
                ("reader alone (no Spark)", f"{n / best(alone):,.0f} changes/s"),
                ("pipeline → journal sink", f"{n / best(journal):,.0f} changes/s"),
                ("COPY accounts TO STDOUT", f"{copy_raw_rate:,.0f} rows/s"),
                ("copy → noop", f"{copy_rate:,.0f} rows/s"),
                ("copy ratio", f"{copy_rate / copy_raw_rate:.2f}"),
            ],
            summary,
        )
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work_root, ignore_errors=True)


def _timed_raw(into: list[float], dsn: str, slot: str, expected: int) -> None:
    into.append(_checked(raw_drain(dsn, slot), expected))


def _timed_copy(into: list[float], dsn: str) -> None:
    into.append(raw_copy(dsn)[0])


def _timed_source(into: list[float], *args: Any) -> None:
    into.append(source_to_noop(*args))


def _checked(result: tuple[float, int], expected: int) -> float:
    elapsed, count = result
    if count != expected:
        raise SystemExit(f"expected {expected} changes, read {count}")
    return elapsed


if __name__ == "__main__":
    main()
