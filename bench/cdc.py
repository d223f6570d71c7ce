"""Change data capture benchmark: the capture (slot → journal) against PostgreSQL's own ceilings.

(a) sync: the same N changes (inserts in transactions of T rows) captured into a journal (fsync on,
    durable) by the capture engine, against a raw streaming receiver of the same slot contents
    (psycopg2's replication protocol, receive only, nothing parsed), over the same connection
    kind — loopback TCP and the Unix socket both — and against a raw SQL drain
    (``pg_logical_slot_get_binary_changes``, rows fetched, nothing parsed; what the old source
    was built on). Slots are created at the same position before the changes are written.
(b) the server's decoding work: CPU time (``/proc``) of the process that decodes — the walsender
    for the capture, the backend for the SQL drain — per run of N changes.
(c) latency: a writer commits single-row transactions at a steady rate (5,000/s by default) while
    the capture runs; commit → durable in the journal, p50/p99 (the commit time is the
    transaction's own, from the stream; the append time is taken when the append returns). Beside
    it, commit → a whole pipeline's journal sink with the default trigger (500/s by default, on a
    local[2] Spark session): the sink's journal is followed and each arrival timed.
(d) copy: a table of M rows copied by the capture (``snapshot: initial``, chunks) into a journal,
    against ``COPY table TO STDOUT`` read by a client, and against the server's own JSON ceiling,
    ``COPY (SELECT row_to_json(t) FROM table t) TO STDOUT`` (records carry each row as JSON).

Rounds alternate the order of ours and the baselines; the best round of each counts. The server
is a private PostgreSQL (wal_level = logical) started for the run, on this host.

    .venv/bin/python bench/cdc.py [--changes 500000] [--txn 50] [--rows 500000] [--rounds 3]
                                  [--rate 5000] [--seconds 10]

Prints a table, then one JSON line: {"bench": "cdc", "capture_ratio_unix": …, …}.

``--source mariadb`` runs the MariaDB/MySQL capture's bench instead (``bench/cdc_mariadb.py``).
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report
from sluiceway.cdc import CaptureOptions, CaptureService
from sluiceway.cdc.stream import local_socket_dsn
from sluiceway.testing import PrivatePostgres

OPTIONS = "'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true'"
TICK = os.sysconf("SC_CLK_TCK")


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


def create_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def flush_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
        assert row is not None
        return int(row[0])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (the server runs on this host)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def slot_pid(dsn: str, slot: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def raw_sql_drain(dsn: str, slot: str) -> tuple[float, int, float]:
    """Seconds, changes and the backend's CPU seconds of one SQL drain of the slot."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        cpu0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        cur = conn.cursor(binary=True)
        cur.execute(
            f"SELECT lsn, xid, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, {OPTIONS})",
            (slot,),
        )
        changes = sum(1 for _lsn, _xid, data in cur if data[:1] == b"I")
        elapsed = time.perf_counter() - t0
        return elapsed, changes, cpu_seconds(pid) - cpu0


def raw_receiver(dsn: str, slot: str, upto: int, expected: int | None = None) -> tuple[float, int, float]:
    """psycopg2's replication protocol, receive only: seconds, changes, the walsender's CPU.

    It stops at the first message at or past ``upto``, or with ``expected`` given, once it has
    received that many changes (a lull in the stream while the server reports a WAL end past
    ``upto`` is then not taken for the end: on a busy machine it came before the last changes)."""
    import psycopg2
    import psycopg2.extras

    from sluiceway.cdc.stream import _libpq_dsn

    conn = psycopg2.connect(_libpq_dsn(dsn), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    try:
        t0 = time.perf_counter()
        cur.start_replication(
            slot_name=slot,
            decode=False,
            options={"proto_version": "1", "publication_names": "bench_pub", "messages": "true"},
        )
        pid = None
        changes = 0
        while True:
            message = cur.read_message()
            if message is None:
                if expected is None and cur.wal_end >= upto and changes:
                    break
                select.select([cur.fileno()], [], [], 0.05)
                continue
            if pid is None:
                pid = slot_pid(dsn, slot)
                cpu0 = cpu_seconds(pid) if pid else 0.0
            if message.payload[:1] == b"I":
                changes += 1
            if message.data_start >= upto or (expected is not None and changes >= expected):
                break
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
        return elapsed, changes, cpu
    finally:
        conn.close()


def capture(
    dsn: str, slot: str, work: str, *, unix: bool, snapshot: str = "never", table: str = "public.events"
) -> tuple[float, int, float]:
    """The capture into a durable journal until it has caught up: seconds, records, walsender CPU."""
    publication = "bench_pub" if table == "public.events" else "copy_pub"
    options = CaptureOptions(
        dsn=dsn,
        tables=(table,),
        slot=slot,
        publication=publication,
        state_dir=os.path.join(work, "state"),
        snapshot=snapshot,
        chunk_size=50_000,
        unix_socket=unix,
    )
    service = CaptureService(options, os.path.join(work, "log"))
    cap = service.prepare()
    pid_box: list[int] = []
    cpu_box: list[float] = []

    def sample() -> None:
        # The walsender's CPU, read while it still exists (it exits with the connection).
        while not pid_box:
            pid = slot_pid(dsn, slot)
            if pid:
                pid_box.append(pid)
                cpu_box.append(cpu_seconds(pid))
            else:
                time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    cap.start()
    sampler.start()
    cap.catch_up()
    elapsed = time.perf_counter() - t0
    sampler.join(5)
    cpu = cpu_seconds(pid_box[0]) - cpu_box[0] if pid_box else 0.0
    records = cap.appended
    service.close()
    return elapsed, records, cpu


def latency(dsn: str, slot: str, work: str, rate: int, seconds: float) -> list[float]:
    """Commit → durable in the journal, in ms, for single-row transactions at ``rate``/s."""
    options = CaptureOptions(
        dsn=dsn, tables=("public.events",), slot=slot, publication="bench_pub",
        state_dir=os.path.join(work, "state"), snapshot="never",
    )  # fmt: skip
    service = CaptureService(options, os.path.join(work, "log"))
    service.prepare()
    samples: list[float] = []
    target = service.target
    assert target is not None
    plain_append = target.append

    def timed_append(batch: pa.RecordBatch, end: int) -> None:
        plain_append(batch, end)
        done = time.time() * 1e6
        if batch.num_rows:
            stamps = batch.column("timestamp").cast(pa.int64()).to_numpy()
            samples.extend(((done - stamps) / 1000.0).tolist())

    target.append = timed_append  # type: ignore[method-assign]
    service.start()
    write_steadily(dsn, rate, seconds, 50_000_000)
    time.sleep(1.0)
    service.close()
    return samples


def write_steadily(dsn: str, rate: int, seconds: float, base: int) -> None:
    """Single-row transactions at ``rate`` per second for ``seconds``."""
    stop = time.perf_counter() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        next_at = time.perf_counter()
        while time.perf_counter() < stop:
            conn.execute("INSERT INTO events (id, account, amount, note) VALUES (%s, 1, 1, 'x')", (base + i,))
            i += 1
            next_at += 1 / rate
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)


def pipeline_latency(dsn: str, slot: str, work: str, rate: int, seconds: float) -> list[float]:
    """Commit → a pipeline's journal sink (default trigger), in ms: the sink's journal is followed
    and each record's arrival compared with its commit time (the record's timestamp)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sluiceway.journal import Journal
    from sluiceway.pipeline import Pipeline, PipelineSpec

    spec = PipelineSpec.from_dict(
        {
            "name": "latency",
            "source": {
                "type": "postgres-cdc", "dsn": dsn, "tables": ["public.events"], "slot": slot,
                "publication": "bench_pub", "snapshot": "never",
            },
            "sinks": [{"name": "log", "type": "journal", "path": os.path.join(work, "sink")}],
            "checkpoint": os.path.join(work, "cp"),
        }
    )  # fmt: skip
    pipeline = Pipeline(spec, master="local[2]")
    runner = threading.Thread(target=lambda: pipeline.run(handle_signals=False), daemon=True)
    runner.start()
    samples: list[float] = []
    done = threading.Event()

    def follow() -> None:
        path = os.path.join(work, "sink")
        while not os.path.exists(path) and not done.is_set():
            time.sleep(0.05)
        with Journal.open(path, read_only=True) as sink:
            for record in sink.read(follow=True, timeout=2.0):
                samples.append((time.time() * 1e6 - record.timestamp_us) / 1000.0)
                if done.is_set():
                    return

    follower = threading.Thread(target=follow, daemon=True)
    try:
        time.sleep(15)  # the queries start and settle
        follower.start()
        write_steadily(dsn, rate, seconds, 70_000_000)
        time.sleep(3)
        done.set()
        follower.join(10)
    finally:
        pipeline.request_stop()
        runner.join(60)
        pipeline.spark.stop()
    return samples


def raw_copy(dsn: str, query: str = "accounts") -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        t0 = time.perf_counter()
        size = 0
        with cur.copy(f"COPY {query} TO STDOUT") as copy:
            for block in copy:
                size += len(block)
        return time.perf_counter() - t0, size


def drop_slots(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=500_000)
    parser.add_argument("--txn", type=int, default=50, help="rows per transaction of the changes")
    parser.add_argument("--rows", type=int, default=500_000, help="rows of the copied table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=5_000, help="latency: transactions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: how long to write")
    parser.add_argument(
        "--pipeline-rate", type=int, default=500, help="latency through a pipeline sink (0: skip; Spark)"
    )
    parser.add_argument(
        "--source", choices=("postgres", "mariadb"), default="postgres", help="mariadb: bench/cdc_mariadb.py"
    )
    args = parser.parse_args()
    if args.source == "mariadb":
        import cdc_mariadb

        cdc_mariadb.run(args)
        return

    work_root = tempfile.mkdtemp(prefix="sluice-bench-cdc-")
    settings = {"wal_level": "logical", "max_replication_slots": "20", "shared_buffers": "'256MB'"}
    server = PrivatePostgres({**settings, "max_wal_size": "'4GB'"}).start()
    dsn = server.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        dirs, port = conn.execute(
            "SELECT current_setting('unix_socket_directories'), current_setting('port')::int"
        ).fetchone()  # type: ignore[misc]
    unix_dsn = local_socket_dsn(dsn, dirs, port)
    assert unix_dsn is not None
    t: dict[str, list[float]] = {k: [] for k in ("sql", "recv_tcp", "recv_unix", "tcp", "unix", "copy_raw",
                                                 "copy_json", "copy")}  # fmt: skip
    cpu: dict[str, list[float]] = {"sql": [], "recv_tcp": [], "recv_unix": [], "tcp": [], "unix": []}
    try:
        setup(dsn, args.rows)
        next_id = 1
        for round_no in range(args.rounds):
            work = os.path.join(work_root, f"r{round_no}")
            names = ("sql", "recv_tcp", "recv_unix", "tcp", "unix")
            for name in names:
                create_slot(dsn, f"{name}_{round_no}")
            write_changes(dsn, next_id, args.changes, args.txn)
            next_id += args.changes
            upto = flush_lsn(dsn)
            steps = {
                "sql": partial(raw_sql_drain, dsn, f"sql_{round_no}"),
                "recv_tcp": partial(raw_receiver, dsn, f"recv_tcp_{round_no}", upto),
                "recv_unix": partial(raw_receiver, unix_dsn, f"recv_unix_{round_no}", upto),
                "tcp": partial(capture, dsn, f"tcp_{round_no}", work + "-t", unix=False),
                "unix": partial(capture, dsn, f"unix_{round_no}", work + "-u", unix=True),
            }
            order = list(steps) if round_no % 2 == 0 else list(reversed(steps))
            for name in order:
                elapsed, count, used = steps[name]()
                if count != args.changes:
                    raise SystemExit(f"{name}: expected {args.changes} changes, got {count}")
                t[name].append(elapsed)
                if name in cpu:
                    cpu[name].append(used)
            copy_steps: dict[str, Callable[[], float]] = {
                "copy_raw": partial(_first, raw_copy, dsn),
                "copy_json": partial(_first, raw_copy, dsn, "(SELECT row_to_json(a) FROM accounts a)"),
                "copy": partial(
                    _copied,
                    partial(
                        capture, dsn, f"copy_{round_no}", work + "-c", unix=True, snapshot="initial",
                        table="public.accounts",
                    ),
                    args.rows,
                ),
            }  # fmt: skip
            for name in copy_steps if round_no % 2 == 0 else reversed(list(copy_steps)):
                t[name].append(copy_steps[name]())
            drop_slots(dsn)
            shutil.rmtree(work_root, ignore_errors=True)
            os.makedirs(work_root, exist_ok=True)
            print(f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in t.items()), flush=True)
        create_slot(dsn, "latency")
        samples = latency(dsn, "latency", os.path.join(work_root, "lat"), args.rate, args.seconds)
        sink_samples: list[float] = []
        if args.pipeline_rate:
            create_slot(dsn, "latency_pipe")
            sink_samples = pipeline_latency(
                dsn, "latency_pipe", os.path.join(work_root, "pipe"), args.pipeline_rate, args.seconds
            )
        n, m = args.changes, args.rows
        rate = {k: (m if k.startswith("copy") else n) / min(v) for k, v in t.items()}
        decode = {k: min(v) * 500_000 / n for k, v in cpu.items()}
        summary = {
            "bench": "cdc",
            "changes": n,
            "rows_per_txn": args.txn,
            "copy_rows": m,
            "rounds": args.rounds,
            **{f"{k}_per_s": round(v) for k, v in rate.items()},
            "capture_ratio_tcp": round(rate["tcp"] / rate["recv_tcp"], 3),
            "capture_ratio_unix": round(rate["unix"] / rate["recv_unix"], 3),
            # The capture's default transport is TCP (faster for it; see CaptureOptions.unix_socket).
            "capture_vs_sql_drain": round(rate["tcp"] / rate["sql"], 3),
            "server_cpu_s_per_500k": {k: round(v, 3) for k, v in decode.items()},
            "server_cpu_ratio": round(decode["tcp"] / decode["sql"], 3) if decode["sql"] else None,
            "server_cpu_vs_raw_receiver": round(decode["tcp"] / decode["recv_tcp"], 3)
            if decode["recv_tcp"]
            else None,
            "latency_rate": args.rate,
            "latency_samples": len(samples),
            "latency_p50_ms": round(percentile(samples, 0.5), 2),
            "latency_p99_ms": round(percentile(samples, 0.99), 2),
            "sink_latency_rate": args.pipeline_rate,
            "sink_latency_samples": len(sink_samples),
            "sink_latency_p50_ms": round(percentile(sink_samples, 0.5), 1),
            "sink_latency_p99_ms": round(percentile(sink_samples, 0.99), 1),
            "copy_ratio": round(rate["copy"] / rate["copy_raw"], 3),
            "json_ceiling_ratio": round(rate["copy_json"] / rate["copy_raw"], 3),
            "copy_vs_json_ceiling": round(rate["copy"] / rate["copy_json"], 3),
        }
        report(
            f"capture (slot → durable journal) against PostgreSQL's own ceilings (best of {args.rounds})",
            [
                (
                    "(a) raw receiver, Unix socket (psycopg2, receive only)",
                    f"{rate['recv_unix']:,.0f} changes/s",
                ),
                ("capture → journal, Unix socket", f"{rate['unix']:,.0f} changes/s"),
                ("ratio, Unix socket", f"{summary['capture_ratio_unix']:.2f}"),
                ("raw receiver, loopback TCP", f"{rate['recv_tcp']:,.0f} changes/s"),
                ("capture → journal, loopback TCP", f"{rate['tcp']:,.0f} changes/s"),
                ("ratio, TCP", f"{summary['capture_ratio_tcp']:.2f}"),
                ("raw SQL drain (get_binary_changes)", f"{rate['sql']:,.0f} changes/s"),
                ("capture (TCP, the default) / SQL drain", f"{summary['capture_vs_sql_drain']:.2f}"),
                ("(b) server CPU per 500k: walsender (capture, TCP)", f"{decode['tcp']:.2f} s"),
                ("server CPU per 500k: walsender (raw receiver, TCP)", f"{decode['recv_tcp']:.2f} s"),
                ("server CPU per 500k: walsender (capture, Unix socket)", f"{decode['unix']:.2f} s"),
                (
                    "server CPU per 500k: walsender (raw receiver, Unix socket)",
                    f"{decode['recv_unix']:.2f} s",
                ),
                ("server CPU per 500k: backend (SQL drain)", f"{decode['sql']:.2f} s"),
                ("capture / SQL drain", f"{summary['server_cpu_ratio']}"),
                (f"(c) commit → journal at {args.rate}/s, p50", f"{summary['latency_p50_ms']} ms"),
                (f"commit → journal at {args.rate}/s, p99", f"{summary['latency_p99_ms']} ms"),
                (
                    f"commit → a pipeline's journal sink (default trigger) at {args.pipeline_rate}/s",
                    f"p50 {summary['sink_latency_p50_ms']} / p99 {summary['sink_latency_p99_ms']} ms",
                ),
                ("(d) COPY accounts TO STDOUT", f"{rate['copy_raw']:,.0f} rows/s"),
                ("COPY of row_to_json (the server's JSON ceiling)", f"{rate['copy_json']:,.0f} rows/s"),
                ("copy → journal", f"{rate['copy']:,.0f} rows/s"),
                ("copy ratio (/ COPY)", f"{summary['copy_ratio']:.2f}"),
                ("copy / JSON ceiling", f"{summary['copy_vs_json_ceiling']:.2f}"),
            ],
            summary,
        )
    finally:
        server.stop()
        shutil.rmtree(work_root, ignore_errors=True)


def _first(run: Callable[..., tuple[float, int]], *args: Any) -> float:
    return run(*args)[0]


def _copied(run: Callable[[], tuple[float, int, float]], expected: int) -> float:
    elapsed, records, _cpu = run()
    if records != expected:
        raise SystemExit(f"copy: expected {expected} rows, got {records}")
    return elapsed


if __name__ == "__main__":
    main()
