"""Feed throughput on PostgreSQL, against a raw claim/complete ceiling measured in the same run.

    .venv/bin/python bench/feed.py                 # SLUICE_BENCH_POSTGRES overrides the server DSN

* ceiling: 4 processes, each looping one tight claim of 100 rows
  (``UPDATE … WHERE id IN (SELECT … WHERE status = 'available' ORDER BY id LIMIT 100 FOR UPDATE
  SKIP LOCKED) RETURNING id`` over a partial index of available rows) and one batched complete;
* feed: 4 worker processes (``FeedWorker``, no-op processor, batch 100) over the same number of
  items in partitions — leases, gates, version checks and fan-in included.

Three rounds (``SLUICE_BENCH_FEED_ROUNDS``), each the ceiling then the feed; the ratio is the
median of the rounds' ratios.

and pick-up latency, wake-ups (LISTEN/NOTIFY) and polling side by side:

* one idle ``FeedWorker`` process (defaults: lease 20 s, ``poll_interval`` 0.5 s, fallback 30 s);
  first it rests ``SLUICE_BENCH_FEED_IDLE`` seconds (20) with nothing to do, counting the
  statements it sends (its queries per second idle); then one-item partitions are added one at a
  time at random intervals (``SLUICE_BENCH_FEED_PICKUPS`` of them, 60), and each one's latency is
  enqueue commit (``add`` returned) → processor call, on the machine's monotonic clock;
* the same with ``wake_ups=False`` (polling every 0.5 s), in the same run.

    .venv/bin/python bench/feed.py --only pickup      # just the latency part (about a minute)
    .venv/bin/python bench/feed.py --only throughput

Creates its own database and drops it afterwards. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console
from rich.table import Table

from sluiceway.feed import Feed, FeedWorker, NewPartition
from sluiceway.heap import tune_collector

SERVER = os.environ.get("SLUICE_BENCH_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
PROCESSES = 4
BATCH = 100
ITEMS = int(os.environ.get("SLUICE_BENCH_FEED_ITEMS", "200000"))
PER_PARTITION = 100
ROUNDS = int(os.environ.get("SLUICE_BENCH_FEED_ROUNDS", "3"))
PICKUPS = int(os.environ.get("SLUICE_BENCH_FEED_PICKUPS", "60"))
IDLE = float(os.environ.get("SLUICE_BENCH_FEED_IDLE", "20"))
#: Seconds between two adds in the pick-up measure: uniform in this range (mean 0.2 s).
GAP = (0.05, 0.35)


def noop(item: Any) -> dict[str, bool]:
    return {"done": True}


# -- ceiling -----------------------------------------------------------------------------------
CLAIM = (
    "UPDATE bench_jobs SET status = 'running' WHERE id IN ("
    " SELECT id FROM bench_jobs WHERE status = 'available' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
    ") RETURNING id"
)
COMPLETE = "UPDATE bench_jobs SET status = 'complete' WHERE id = ANY(%s)"


def ceiling_process(dsn: str, barrier: Any, done: Any) -> None:
    tune_collector()  # both sides as `sluice feed worker` runs (sluiceway/heap.py)
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        n = 0
        while True:
            ids = [r[0] for r in conn.execute(CLAIM).fetchall()]
            if not ids:
                break
            conn.execute(COMPLETE, (ids,))
            n += len(ids)
    done.put(n)


def run_ceiling(dsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_jobs")
        conn.execute(
            "CREATE TABLE bench_jobs (id BIGSERIAL PRIMARY KEY, status TEXT NOT NULL DEFAULT 'available', "
            "data BYTEA NOT NULL)"
        )
        conn.execute("CREATE INDEX bench_jobs_available ON bench_jobs (id) WHERE status = 'available'")
        conn.execute("INSERT INTO bench_jobs (data) SELECT 'x'::bytea FROM generate_series(1, %s)", (ITEMS,))
        conn.execute("VACUUM ANALYZE bench_jobs")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES + 1)
    done = ctx.Queue()
    procs = [ctx.Process(target=ceiling_process, args=(dsn, barrier, done)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    total = sum(done.get(timeout=120) for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    assert total == ITEMS, (total, ITEMS)
    return ITEMS / elapsed


# -- feed --------------------------------------------------------------------------------------
def feed_process(dsn: str, prefix: str, barrier: Any, stop: Any, done: Any) -> None:
    tune_collector()
    worker = FeedWorker(
        dsn, noop, prefix=prefix, batch_size=BATCH, lease=6.0, poll_interval=0.05, migrate=False
    )
    barrier.wait()
    worker.start()
    stop.wait()
    worker.stop()
    done.put(worker.stats.completed)


def run_feed(dsn: str, prefix: str) -> float:
    with Feed(dsn, prefix=prefix) as feed:
        batch = [NewPartition(f"p{i:06d}", [b"x"] * PER_PARTITION) for i in range(ITEMS // PER_PARTITION)]
        feed.add_many(batch)
        feed.db.execute(f"VACUUM ANALYZE {prefix}items")
        feed.db.execute(f"VACUUM ANALYZE {prefix}partitions")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES + 1)
    stop = ctx.Event()
    done = ctx.Queue()
    args = (dsn, prefix, barrier, stop, done)
    procs = [ctx.Process(target=feed_process, args=args) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        t0 = time.perf_counter()
        open_partitions = f"SELECT count(*) FROM {prefix}partitions WHERE status = 'available'"
        while True:
            row = conn.execute(open_partitions).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        stop.set()
        per_worker = [done.get(timeout=60) for _ in procs]
        completed = sum(per_worker)
        if os.environ.get("SLUICE_BENCH_VERBOSE"):
            print(f"feed: {elapsed:.2f}s, completed per worker {per_worker}", file=sys.stderr)
        for p in procs:
            p.join()
        left = conn.execute(f"SELECT count(*) FROM {prefix}items WHERE status <> 'complete'").fetchone()
    assert left is not None and left[0] == 0, left
    assert completed >= ITEMS, (completed, ITEMS)
    return ITEMS / elapsed


# -- pick-up latency -----------------------------------------------------------------------------
def pickup_process(dsn: str, prefix: str, wake_ups: bool, stamps: Any, idle: Any, stop: Any) -> None:
    """One worker with default settings: its idle statements a second, then its processor calls."""
    from sluiceway.db import connection

    statements = [0]
    run = connection.Database._run

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        statements[0] += 1  # every statement of the worker's connection (BEGIN/COMMIT included)
        return run(self, *args, **kwargs)

    connection.Database._run = counted  # type: ignore[method-assign]

    def stamp(item: Any) -> dict[str, bool]:
        stamps.put((int(item.data), time.monotonic()))
        return {"done": True}

    worker = FeedWorker(dsn, stamp, prefix=prefix, wake_ups=wake_ups, migrate=False)
    worker.start()
    time.sleep(2.0)  # start-up: first renewal and balance, the LISTEN and its catch-up look
    before = statements[0]
    t0 = time.monotonic()
    time.sleep(IDLE)
    idle.put((statements[0] - before) / (time.monotonic() - t0))
    stop.wait()
    worker.stop()


def run_pickup(dsn: str, prefix: str, wake_ups: bool) -> dict[str, float]:
    with Feed(dsn, prefix=prefix):
        pass  # tables in place before the worker starts
    ctx = mp.get_context("spawn")
    stamps, idle, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=pickup_process, args=(dsn, prefix, wake_ups, stamps, idle, stop))
    proc.start()
    qps = float(idle.get(timeout=IDLE + 60))
    committed: dict[int, float] = {}
    rng = random.Random(26)
    with Feed(dsn, prefix=prefix, migrate=False) as feed:
        for i in range(PICKUPS):
            feed.add(f"pick-{i:04d}", [str(i).encode()])
            committed[i] = time.monotonic()  # add returned: its transaction committed
            time.sleep(rng.uniform(*GAP))
    called: dict[int, float] = {}
    while len(called) < PICKUPS:
        i, at = stamps.get(timeout=60)
        called.setdefault(i, at)
    stop.set()
    proc.join(60)
    latencies = sorted((called[i] - committed[i]) * 1000 for i in range(PICKUPS))
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_ms": cuts[49], "p99_ms": cuts[98], "max_ms": latencies[-1], "idle_qps": qps}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("throughput", "pickup"), help="run one part only")
    only = parser.parse_args().only
    name = f"sluice_bench_feed_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(SERVER)
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params["dbname"] = name
    dsn = make_conninfo(**params)  # type: ignore[arg-type]
    ceilings: list[float] = []
    feeds: list[float] = []
    pickups: dict[str, dict[str, float]] = {}
    try:
        if only != "pickup":
            for r in range(ROUNDS):
                ceilings.append(run_ceiling(dsn))
                feeds.append(run_feed(dsn, f"bench{r}_"))
        if only != "throughput":
            pickups["wake-ups"] = run_pickup(dsn, "pickw_", wake_ups=True)
            pickups["polling"] = run_pickup(dsn, "pickp_", wake_ups=False)
    finally:
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    console = Console()
    result: dict[str, Any] = {"bench": "feed"}
    if feeds:
        ceiling, feed = max(ceilings), max(feeds)
        # Each round runs the ceiling, then the feed: the ratio is the median of the rounds' own
        # ratios, each taken under the same load (this machine is shared and varies by ±20 %).
        ratios = [f / c for c, f in zip(ceilings, feeds, strict=True)]
        ratio = statistics.median(ratios)
        table = Table(title=f"feed on PostgreSQL: {ITEMS} items, {PROCESSES} processes, batch {BATCH}")
        table.add_column("run")
        table.add_column("items/s", justify="right")
        table.add_column("runs (items/s)", justify="right")
        table.add_row(
            "raw claim/complete ceiling", f"{ceiling:,.0f}", ", ".join(f"{c:,.0f}" for c in ceilings)
        )
        table.add_row(
            f"feed ({ITEMS // PER_PARTITION} partitions x {PER_PARTITION})",
            f"{feed:,.0f}",
            ", ".join(f"{f:,.0f}" for f in feeds),
        )
        table.add_row("ratio (median of rounds)", f"{ratio:.2f}", ", ".join(f"{r:.2f}" for r in ratios))
        console.print(table)
        result.update(
            ceiling_ips=round(ceiling),
            feed_ips=round(feed),
            ratio=round(ratio, 3),
            ratios=[round(r, 3) for r in ratios],
        )
    if pickups:
        table = Table(
            title=f"pick-up: one idle worker, {PICKUPS} one-item partitions added "
            f"{GAP[0]:g}-{GAP[1]:g} s apart; idle statements over {IDLE:g} s"
        )
        for column in ("worker", "p50 ms", "p99 ms", "max ms", "idle statements/s"):
            table.add_column(column, justify="left" if column == "worker" else "right")
        for mode, m in pickups.items():
            table.add_row(
                mode, f"{m['p50_ms']:.1f}", f"{m['p99_ms']:.1f}", f"{m['max_ms']:.1f}", f"{m['idle_qps']:.2f}"
            )
        console.print(table)
        result["pickup"] = {
            mode: {key: round(value, 2) for key, value in m.items()} for mode, m in pickups.items()
        }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
