"""Harvester throughput and latency against the raw SQL ceiling, in one run.

    .venv/bin/python bench/harvest.py [--rows 200000] [--keys 1000] [--few-keys-rows 20000]

(a) ceiling: a tight mark + batch-delete loop on the same rows, no broker;
(b) the harvester draining the same rows into a Kafka-protocol broker (Tansu, loopback);
(b') side by side, no engine: the ceiling's loop on a thread while a raw confluent-kafka loop
    produces the same records (the harvester's producer settings and sequence headers) and
    waits for every acknowledgement, in one process: on a machine whose two cores PostgreSQL,
    the broker and the harvester share, the most an outbox harvester into this broker could do;
(c) the same with all rows over 10 keys (the per-key barrier's worst case), with perKeyInFlight 1
    (goharvest's barrier) and with each N of --per-key (pipelined keys), the best N reported;
(d) end-to-end latency (row commit -> broker ack) at a fixed offered load of 2,000 rec/s;
(f) with --wakeups: the outbox's notify trigger (PostgreSQL) against polling, in turns: an idle
    harvester's transactions per second, latency at 20 rec/s, and the trigger's cost per insert;
(e) with --versus REV: paired drains of the many-keys rows, this tree against REV (built from git
    in a temporary directory), each in a fresh process, alternating which goes first.
(g) with --tracing 1%|100%: paired drains of the same rows with ``tracing: {enabled: true}`` and
    without, alternating which goes first; every row carries a ``traceparent`` header as an
    application tracing its requests writes it, 1 % (or all) of them sampled; spans are exported
    over OTLP/HTTP to a receiver in this process. ``--tracing off`` drains without it only.
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import otlp_sink, report, scratch_postgres, timed_drain
from sluiceway.db import Database
from sluiceway.harvest import Harvest, HarvestConfig, LeaderAcquired
from sluiceway.harvest.ports import Delivery, Publisher
from sluiceway.heap import tune_collector
from sluiceway.outbox import init_outbox
from sluiceway.outbox.record import MarkedRecord
from sluiceway.testing import Broker, wait_until

VALUE = "x" * 100


def load(dsn: str, rows: int, keys: int, topic: str, traced: float | None = None) -> None:
    """``rows`` rows over ``keys`` keys; ``traced``: each with a ``traceparent`` of a trace of its
    own, that share of them sampled (as an application sampling its requests writes them)."""
    with Database(dsn) as db:
        init_outbox(db)
        db.execute("TRUNCATE outbox")
    every = 0 if not traced else max(1, round(1 / traced))
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        buf = io.StringIO()
        for i in range(rows):
            if traced is None:
                headers = "{}\t{}"
            else:
                flags = "01" if i % every == 0 else "00"
                headers = f"{{traceparent}}\t{{00-{i + 1:032x}-{i + 1:016x}-{flags}}}"
            buf.write(f"2026-11-25 00:00:00+00\t{topic}\tkey-{i % keys}\t{VALUE}\t{headers}\n")
        buf.seek(0)
        with cur.copy(
            "COPY outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
            "kafka_header_values) FROM STDIN"
        ) as copy:
            copy.write(buf.read())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox")


def ceiling(dsn: str, batch: int) -> float:
    """Mark + delete in a tight loop: the most any MP/R harvester could do on this database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        total = 0
        while True:
            rows = conn.execute(
                "UPDATE outbox SET leader_id = %s WHERE id IN (SELECT id FROM outbox WHERE leader_id IS NULL "
                "OR leader_id <> %s ORDER BY id LIMIT %s) RETURNING id, create_time, kafka_topic, kafka_key, "
                "kafka_value, kafka_header_keys, kafka_header_values, leader_id",
                ("00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000001", batch),
            ).fetchall()
            if not rows:
                break
            # The ids as PostgreSQL's array literal, as the harvester's purge sends them.
            ids = "{" + ",".join(str(r[0]) for r in rows) + "}"
            conn.execute("DELETE FROM outbox WHERE id = ANY(%s::bigint[])", (ids,))
            total += len(rows)
        return total / (time.perf_counter() - start)


def produce_loop(dsn: str, bootstrap: str, topic: str, rows: int, keys: int) -> Callable[[], None]:
    """(b') the publishing half, ready to run: ``rows`` records as the harvester publishes them
    (key, 100-byte value, its two sequence headers), every delivery report awaited. The producer
    is made and has delivered one record before it is returned, as the harvester's standby keeps
    a warm one: an idempotent client waits ~0.5 s for its producer id, outside the timing."""
    from confluent_kafka import Producer

    producer = Producer(harvest_config(dsn, bootstrap, "side-by-side", 500).harvest.producer_config)
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer.produce(topic, b"warm-up", b"warm-up", on_delivery=delivered)
    if producer.flush(30) or failed:
        raise SystemExit(f"the raw produce loop's producer is not ready: {failed[:3]}")

    def run() -> None:
        leader = "00000000-0000-0000-0000-000000000002"
        value = VALUE.encode()
        for i in range(rows):
            headers = [("sluice-id", str(i + 1)), ("sluice-leader", leader)]
            while True:
                try:
                    producer.produce(
                        topic, value, f"key-{i % keys}".encode(), headers=headers, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        if producer.flush(120) or failed:
            raise SystemExit(f"the raw produce loop did not deliver everything: {failed[:3]}")

    return run


def side_by_side(
    dsn: str, topic: str, rows: int, keys: int, mark: int, publish: Callable[[], object]
) -> float:
    """(b'): the raw SQL loop on a thread while ``publish`` sends the same rows' messages; rows/s.
    (bench/brokers.py runs its raw loops through it too.)"""
    load(dsn, rows, keys, topic)
    sql = threading.Thread(target=ceiling, args=(dsn, mark))
    start = time.perf_counter()
    sql.start()
    publish()
    sql.join()
    elapsed = time.perf_counter() - start
    if outbox_rows(dsn):
        raise SystemExit("the raw SQL loop left rows in the outbox")
    return rows / elapsed


def harvest_config(
    dsn: str, bootstrap: str, name: str, mark: int, per_key: int = 1, tracing: bool = False
) -> HarvestConfig:
    return HarvestConfig.from_dict(
        {
            "harvest": {
                "name": name,
                "dataSource": dsn,
                "baseKafkaConfig": {"bootstrap.servers": bootstrap},
                "election": {"kind": "database"},
                "limits": {"markQueryRecords": mark, "minMetricsInterval": "60s", "perKeyInFlight": per_key},
                "tracing": {"enabled": tracing},
            }
        }
    )


def outbox_rows(dsn: str) -> int:
    with Database(dsn) as db:
        return int(db.fetchone("SELECT count(*) FROM outbox")[0])  # type: ignore[index]


def tree_of(rev: str, into: Path) -> Path:
    """The package as it was at ``rev`` (``git archive`` of its ``src``), under ``into``."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def drain_in_process(
    src: Path, dsn: str, bootstrap: str, name: str, mark: int, rows: int, *extra: str
) -> float:
    """``bench/_drain.py`` in a fresh interpreter with the package from ``src``."""
    script = Path(__file__).resolve().parent / "_drain.py"
    out = subprocess.run(
        [sys.executable, str(script), dsn, bootstrap, name, str(mark), str(rows), *extra],
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return float(out.stdout.strip().splitlines()[-1])


def drain(dsn: str, bootstrap: str, name: str, mark: int, rows: int, per_key: int = 1) -> float:
    return timed_drain(harvest_config(dsn, bootstrap, name, mark, per_key), rows, lambda: outbox_rows(dsn))


class AckClock:
    """Wraps the real publisher to note when the broker acknowledged each record id."""

    def __init__(self, inner: Publisher, acks: dict[int, float]) -> None:
        self.inner, self.acks = inner, acks

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        def done(d: Delivery) -> None:
            if d.error is None:
                self.acks.setdefault(record.id, time.perf_counter())
            on_done(d)

        self.inner.send(record, done)

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def latency(
    dsn: str, bootstrap: str, topic: str, rate: int, seconds: float, mark: int
) -> tuple[float, float, int]:
    with Database(dsn) as db:
        db.execute("TRUNCATE outbox")
    acks: dict[int, float] = {}
    commits: dict[int, float] = {}
    acquired = threading.Event()
    harvest = Harvest(harvest_config(dsn, bootstrap, f"{topic}-lat", mark))
    base = harvest._publisher_factory
    harvest._publisher_factory = lambda epoch: AckClock(base(epoch), acks)
    harvest.set_event_handler(lambda e: acquired.set() if isinstance(e, LeaderAcquired) else None)
    harvest.start()
    try:
        wait_until(acquired.is_set, timeout=30)
        per_tick = max(1, rate // 100)  # at most 100 small transactions a second
        tick = per_tick / rate
        with psycopg.connect(dsn) as conn:
            start = time.perf_counter()
            n = 0
            while time.perf_counter() - start < seconds:
                due = start + (n // per_tick) * tick
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                ids = []
                for _ in range(per_tick):
                    row = conn.execute(
                        "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, "
                        "kafka_header_keys, kafka_header_values) "
                        "VALUES (now(), %s, %s, %s, '{}', '{}') RETURNING id",
                        (topic, f"key-{n % 1000}", VALUE),
                    ).fetchone()
                    ids.append(row[0])  # type: ignore[index]
                    n += 1
                conn.commit()
                committed = time.perf_counter()
                for rid in ids:
                    commits[rid] = committed
        wait_until(lambda: len(acks) >= len(commits), timeout=60)
    finally:
        harvest.stop()
    lat = sorted((acks[i] - commits[i]) * 1000 for i in commits if i in acks)
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], len(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--few-keys-rows", type=int, default=20_000)
    ap.add_argument(
        "--mark-records", type=int, default=500, help="rows per mark, for both ceiling and harvester"
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="interleaved ceiling/harvester rounds (median reported)"
    )
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument(
        "--per-key",
        default="4,8,16,32,64",
        help="perKeyInFlight values (> 1) tried on the 10-key outbox, beside 1 (goharvest's barrier)",
    )
    ap.add_argument(
        "--versus",
        metavar="REV",
        help="only paired drains of the many-keys rows: this tree against the package at REV",
    )
    ap.add_argument("--wakeups", action="store_true", help="only the wake-up measures (f)")
    ap.add_argument(
        "--tracing", choices=["off", "1%", "100%"], help="only (g): paired drains, traced and not"
    )
    ap.add_argument("--idle-seconds", type=float, default=30.0, help="(f): idle window per round")
    args = ap.parse_args()
    tune_collector()  # as `sluice reap` does (sluiceway/heap.py); the ceiling runs in this process too
    if args.wakeups:
        wakeups(args)
        return
    if args.versus:
        versus(args)
        return
    if args.tracing:
        tracing(args)
        return
    per_key_values = [1, *sorted({int(n) for n in args.per_key.split(",") if int(n) > 1})]
    ceilings: list[float] = []
    harvests: list[float] = []
    sides: list[float] = []
    few: dict[int, list[float]] = {n: [] for n in per_key_values}
    with Broker() as broker, scratch_postgres() as dsn:
        topic = broker.create_topic("bench-harvest", 8)
        # Interleaved rounds: this shared 2-core machine's speed drifts, so each harvester run is
        # compared with a ceiling measured right beside it.
        for r in range(args.rounds):
            load(dsn, args.rows, args.keys, topic)
            ceilings.append(ceiling(dsn, args.mark_records))
            load(dsn, args.rows, args.keys, topic)
            harvests.append(drain(dsn, broker.bootstrap, f"bench-{r}", args.mark_records, args.rows))
            produce = produce_loop(dsn, broker.bootstrap, topic, args.rows, args.keys)
            sides.append(side_by_side(dsn, topic, args.rows, args.keys, args.mark_records, produce))
            # The 10-key runs sit in the same rounds, so the ratio to the many-keys rate is same-run.
            for n in per_key_values:
                load(dsn, args.few_keys_rows, 10, topic)
                few[n].append(
                    drain(
                        dsn, broker.bootstrap, f"bench-10-{n}-{r}", args.mark_records, args.few_keys_rows, n
                    )
                )
        p50, p99, samples = latency(
            dsn, broker.bootstrap, topic, 2000, args.latency_seconds, args.mark_records
        )
    ratios = sorted(h / c for h, c in zip(harvests, ceilings, strict=True))
    ratio = statistics.median(ratios)
    ceiling_rps, harvest_rps = statistics.median(ceilings), statistics.median(harvests)
    side_ratios = sorted(h / s for h, s in zip(harvests, sides, strict=True))
    side_rps = statistics.median(sides)
    few_median = {n: statistics.median(v) for n, v in few.items()}
    best_n = max((n for n in per_key_values if n > 1), key=lambda n: few_median[n], default=1)
    few_keys_rps, best_rps = few_median[1], few_median[best_n]
    per_key_rows = [
        (f"  perKeyInFlight {n}", f"{few_median[n]:,.0f} rec/s  {_rounds(few[n])}")
        for n in per_key_values[1:]
    ]
    report(
        f"harvest: {args.rows:,} rows, {args.keys} keys, 100-byte values (mark {args.mark_records}), "
        f"median of {args.rounds} rounds",
        [
            ("raw SQL ceiling (mark + delete, no broker)", f"{ceiling_rps:,.0f} rec/s  {_rounds(ceilings)}"),
            ("harvester -> broker", f"{harvest_rps:,.0f} rec/s  {_rounds(harvests)}"),
            ("ratio (target >= 0.6)", _ratio(ratios)),
            ("raw SQL loop + raw produce loop, side by side", f"{side_rps:,.0f} rec/s  {_rounds(sides)}"),
            ("harvester / side by side", _ratio(side_ratios)),
            (
                f"harvester, 10 keys ({args.few_keys_rows:,} rows), perKeyInFlight 1",
                f"{few_keys_rps:,.0f} rec/s  {_rounds(few[1])}",
            ),
            *per_key_rows,
            (
                f"10 keys, best perKeyInFlight ({best_n}) (target >= 6,140 = 10x goharvest)",
                f"{best_rps:,.0f} rec/s  ({best_rps / few_keys_rps:.1f}x perKeyInFlight 1)",
            ),
            ("10 keys best / many keys (target >= 0.8)", f"{best_rps / harvest_rps:.2f}"),
            ("latency p50 @ 2,000 rec/s (commit -> ack)", f"{p50:.1f} ms"),
            ("latency p99 @ 2,000 rec/s (target <= 25)", f"{p99:.1f} ms ({samples:,} samples)"),
        ],
        {
            "bench": "harvest",
            "ceiling_rps": round(ceiling_rps),
            "harvest_rps": round(harvest_rps),
            "ratio": round(ratio, 3),
            "side_by_side_rps": round(side_rps),
            "harvest_vs_side_by_side": round(statistics.median(side_ratios), 3),
            "few_keys_rps": round(few_keys_rps),
            "few_keys_best_per_key": best_n,
            "few_keys_best_rps": round(best_rps),
            "few_keys_best_over_many": round(best_rps / harvest_rps, 3),
            "few_keys_by_per_key": {str(n): round(v) for n, v in few_median.items()},
            "p50_ms": round(p50, 2),
            "p99_ms": round(p99, 2),
        },
    )


def tracing(args: argparse.Namespace) -> None:
    """(g): drains of the same traced rows, with the harvester's tracing on and off, in turns."""
    share = {"off": None, "1%": 0.01, "100%": 1.0}[args.tracing]
    modes = [False] if share is None else [False, True]
    rates: dict[bool, list[float]] = {m: [] for m in modes}
    with otlp_sink() as (endpoint, spans), Broker() as broker, scratch_postgres() as dsn:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        os.environ.setdefault("OTEL_SERVICE_NAME", "bench-harvest")
        topic = broker.create_topic("bench-harvest", 8)
        for r in range(args.rounds):
            for traced in modes[r % 2 :] + modes[: r % 2]:
                load(dsn, args.rows, args.keys, topic, traced=share)
                config = harvest_config(
                    dsn, broker.bootstrap, f"bench-{r}-{traced}", args.mark_records, tracing=traced
                )
                rates[traced].append(timed_drain(config, args.rows, lambda: outbox_rows(dsn)))
        exported = spans()
    off = statistics.median(rates[False])
    rows = [("tracing off", f"{off:,.0f} rec/s  {_rounds(rates[False])}")]
    summary: dict[str, Any] = {"bench": "harvest-tracing", "rows": args.rows, "off_rec_s": round(off)}
    if share is not None:
        on = statistics.median(rates[True])
        ratios = sorted(t / o for t, o in zip(rates[True], rates[False], strict=True))
        rows += [
            (f"tracing on, {args.tracing} of rows sampled", f"{on:,.0f} rec/s  {_rounds(rates[True])}"),
            ("traced / untraced (median of the rounds' ratios)", f"{statistics.median(ratios):.3f}"),
            ("spans received by the OTLP receiver", f"{exported:,}"),
        ]
        summary |= {"on_rec_s": round(on), "traced_vs_untraced": round(statistics.median(ratios), 3),
                    "spans": exported, "sampled": args.tracing}  # fmt: skip
    report(f"harvest with tracing: {args.rows:,} rows, {args.keys} keys, {args.rounds} rounds", rows, summary)


def versus(args: argparse.Namespace) -> None:
    """(e): this tree and ``--versus`` drain the same rows, each in a fresh process, in turns.

    This tree twice: as configured here (the database election is one of sluiceway's keys, so the
    sequence headers are on, as for any new configuration), and with ``sequenceHeaders: false``,
    which publishes what the older tree publishes, byte for byte."""
    here = Path(__file__).resolve().parent.parent / "src"
    with tempfile.TemporaryDirectory() as tmp, Broker() as broker, scratch_postgres() as dsn:
        then = tree_of(args.versus, Path(tmp))
        series: list[tuple[str, Path, tuple[str, ...]]] = [
            ("this tree, sequenceHeaders off", here, ("off",)),
            (args.versus, then, ()),
            ("this tree, sequence headers (default)", here, ("on",)),
        ]
        rates: dict[str, list[float]] = {label: [] for label, _, _ in series}
        topic = broker.create_topic("bench-harvest", 8)
        for r in range(args.rounds):
            for label, src, extra in series[r % 3 :] + series[: r % 3]:
                load(dsn, args.rows, args.keys, topic)
                rates[label].append(
                    drain_in_process(
                        src,
                        dsn,
                        broker.bootstrap,
                        f"bench-{r}-{label}",
                        args.mark_records,
                        args.rows,
                        *extra,
                    )
                )
    new, old, headers = (rates[label] for label, _, _ in series)
    ratios = sorted(n / o for n, o in zip(new, old, strict=True))
    with_headers = sorted(h / o for h, o in zip(headers, old, strict=True))
    report(
        f"harvest, paired drains: {args.rows:,} rows, {args.keys} keys, this tree against {args.versus}",
        [
            *(
                (label, f"{statistics.median(rates[label]):,.0f} rec/s  {_rounds(rates[label])}")
                for label, _, _ in series
            ),
            (
                "this tree / it (target >= 0.95)",
                _ratio(ratios),
            ),
            (
                "with sequence headers / it",
                _ratio(with_headers),
            ),
        ],
        {
            "bench": "harvest-versus",
            "versus": args.versus,
            "new_rps": round(statistics.median(new)),
            "old_rps": round(statistics.median(old)),
            "new_headers_rps": round(statistics.median(headers)),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_with_headers": round(statistics.median(with_headers), 3),
        },
    )


def use_trigger(dsn: str, on: bool) -> None:
    with Database(dsn) as db:
        if on:
            init_outbox(db, notify=True)
        else:
            db.execute("DROP TRIGGER IF EXISTS outbox_sluice_notify ON outbox")
        db.execute("TRUNCATE outbox")


def commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0])  # type: ignore[index]


class StatementCount:
    """Counts the statements this process sends through psycopg while ``on`` (the harvester's:
    marks, purges, lease renewals, meter queries)."""

    def __init__(self) -> None:
        self.on = False
        self.count = 0
        self._execute = psycopg.Cursor.execute

        def counted(cursor: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.count += 1
            return self._execute(cursor, query, *args, **kwargs)

        psycopg.Cursor.execute = counted  # type: ignore[method-assign,assignment]

    def close(self) -> None:
        psycopg.Cursor.execute = self._execute  # type: ignore[method-assign]


def idle_rate(dsn: str, bootstrap: str, name: str, seconds: float) -> tuple[float, float]:
    """While a harvester idles on an empty outbox: the statements it sends a second, and the
    transactions a second the server counts on that database (everything: autovacuum too)."""
    acquired = threading.Event()
    harvest = Harvest(harvest_config(dsn, bootstrap, name, 500))
    harvest.set_event_handler(lambda e: acquired.set() if isinstance(e, LeaderAcquired) else None)
    statements = StatementCount()
    harvest.start()
    try:
        wait_until(acquired.is_set, timeout=30)
        time.sleep(3)
        before = commits(dsn)
        statements.on = True
        time.sleep(seconds)
        statements.on = False
        after = commits(dsn)
    finally:
        harvest.stop()
        statements.close()
    return statements.count / seconds, (after - before - 1) / seconds  # the reading's own aside


def insert_cost(dsn: str, rows: int) -> float:
    """Microseconds per one-row insert transaction (commit included), from one connection."""
    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        for i in range(rows):
            conn.execute(
                "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
                "kafka_header_values) VALUES (now(), 'bench', %s, %s, '{}', '{}')",
                (f"key-{i % 1000}", VALUE),
            )
            conn.commit()
        return (time.perf_counter() - start) / rows * 1e6


def wakeups(args: argparse.Namespace) -> None:
    """(f): the notify trigger against polling (goharvest's markBackoff, 10 ms), in turns."""
    idle: dict[bool, list[float]] = {True: [], False: []}
    server: dict[bool, list[float]] = {True: [], False: []}
    p99: dict[bool, list[float]] = {True: [], False: []}
    cost: dict[bool, list[float]] = {True: [], False: []}
    with Broker() as broker, scratch_postgres() as dsn:
        load(dsn, 0, 1, "bench-wake")
        topic = broker.create_topic("bench-wake", 8)
        # The trigger's cost: blocks of one-row insert transactions, with and without it, in turns.
        for r in range(10):
            for on in (True, False) if r % 2 == 0 else (False, True):
                use_trigger(dsn, on)
                cost[on].append(insert_cost(dsn, 1000))
        for r in range(args.rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                use_trigger(dsn, on)
                sent, counted = idle_rate(dsn, broker.bootstrap, f"idle-{r}-{on}", args.idle_seconds)
                idle[on].append(sent)
                server[on].append(counted)
                p99[on].append(latency(dsn, broker.bootstrap, topic, 20, 10.0, 500)[1])
    med = {
        k: {on: statistics.median(v[on]) for on in (True, False)}
        for k, v in (("idle", idle), ("server", server), ("p99", p99), ("cost", cost))
    }

    def both(values: dict[bool, list[float]], fmt: str) -> str:
        return (
            " / ".join(fmt.format(v) for v in values[True])
            + "  vs polling "
            + " / ".join(fmt.format(v) for v in values[False])
        )

    report(
        f"harvest wake-ups: the notify trigger against polling, {args.rounds} rounds in turns",
        [
            (
                "idle harvester, statements/s it sends (target <= 1)",
                f"{med['idle'][True]:.2f}  (polling {med['idle'][False]:.1f})",
            ),
            ("  rounds", both(idle, "{:.2f}")),
            (
                "  transactions/s the server counts on the database",
                f"{med['server'][True]:.2f}  (polling {med['server'][False]:.1f})",
            ),
            (
                "latency p99 @ 20 rec/s (target <= 20 ms)",
                f"{med['p99'][True]:.1f} ms  (polling {med['p99'][False]:.1f} ms)",
            ),
            ("  rounds", both(p99, "{:.1f}")),
            (
                "one-row insert transaction, µs",
                f"{med['cost'][True]:.0f}  (no trigger {med['cost'][False]:.0f})",
            ),
            ("  rounds", both(cost, "{:.0f}")),
        ],
        {
            "bench": "harvest-wakeups",
            "idle_tps": round(med["idle"][True], 3),
            "idle_tps_polling": round(med["idle"][False], 2),
            "idle_server_tps": round(med["server"][True], 3),
            "idle_server_tps_polling": round(med["server"][False], 2),
            "p99_ms_20rps": round(med["p99"][True], 2),
            "p99_ms_20rps_polling": round(med["p99"][False], 2),
            "insert_us": round(med["cost"][True], 1),
            "insert_us_no_trigger": round(med["cost"][False], 1),
        },
    )


def _ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}  (rounds {', '.join(f'{x:.2f}' for x in ratios)})"


def _rounds(values: list[float]) -> str:
    return "(" + " / ".join(f"{v:,.0f}" for v in values) + ")"


if __name__ == "__main__":
    main()
