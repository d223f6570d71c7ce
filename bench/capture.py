"""``sluice capture`` benchmark: commit → broker acknowledgement, and throughput against the slot.

(a) latency: a writer commits transactions of 10 rows at a steady 5,000 changes/s (by default) for
    ``--seconds`` while a capture (snapshot never) publishes the table's changes to Kafka (the
    Tansu broker, started for the run), then to NATS JetStream (the local server). Per change:
    its commit time (from the stream) → the broker's acknowledgement of its message (the
    delivery report, timed as it arrives), p50/p99/max. Sequin reports 55 ms average and 253 ms
    p99 for the same measure at 50k/s on its own hardware.
(b) throughput: N changes (inserts, transactions of T rows) written first, then the capture
    drains the slot to Kafka, against a raw streaming receiver of the same slot contents
    (psycopg2's replication protocol, receive only, nothing parsed or published: the ceiling of
    any client) — slots created at the same position before the writes; rounds alternate.

The server is a private PostgreSQL (wal_level = logical) started for the run, on this host.

    .venv/bin/python bench/capture.py [--rate 5000] [--seconds 10] [--changes 200000] [--txn 50]
                                      [--rounds 2]

Prints a table, then one JSON line: {"bench": "capture", "kafka_p99_ms": …, …}.
"""

from __future__ import annotations

import argparse
import asyncio
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
from cdc import create_slot, flush_lsn, raw_receiver, setup, write_changes
from sluiceway.capture import Capture
from sluiceway.harvest.ports import Delivery, Publisher
from sluiceway.outbox.record import MarkedRecord
from sluiceway.testing import Broker, PrivatePostgres

NATS_URL = os.environ.get("SLUICE_BENCH_NATS", "nats://127.0.0.1:4222")


class Timed:
    """A publisher that times each change from its commit to its acknowledgement."""

    def __init__(self, inner: Publisher, samples: list[float]) -> None:
        self.inner, self.samples = inner, samples

    def _timed(self, on_done: Callable[[Delivery], None]) -> Callable[[Delivery], None]:
        samples = self.samples

        def done(delivery: Delivery) -> None:
            created = delivery.record.create_time
            if created is not None and delivery.error is None:
                samples.append((time.time() - created.timestamp()) * 1000.0)
            on_done(delivery)

        return done

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        self.inner.send(record, self._timed(on_done))

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        many = getattr(self.inner, "send_many", None)
        timed = self._timed(on_done)
        if many is not None:
            many(records, timed)
        else:
            for record in records:
                self.inner.send(record, timed)

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def config(dsn: str, slot: str, work: str, destination: dict[str, Any]) -> dict[str, Any]:
    return {
        "capture": {
            "name": slot, "dsn": dsn, "tables": ["public.events"], "slot": slot,
            "publication": "bench_pub", "snapshot": "never", "stateDir": os.path.join(work, slot),
            **destination,
        }
    }  # fmt: skip


def capture_for(cfg: dict[str, Any], samples: list[float] | None) -> Capture:
    capture = Capture(cfg)
    if samples is not None:
        plain = capture._publisher_factory
        capture._publisher_factory = lambda epoch: Timed(plain(epoch), samples)
    return capture


def wait_position(capture: Capture, upto: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while capture.position < upto:
        if time.monotonic() > deadline:
            raise SystemExit(f"the capture did not reach {upto} within {timeout} s")
        time.sleep(0.005)


def write_rate(dsn: str, rate: int, seconds: float, base: int, rows: int) -> None:
    """``rate`` changes a second for ``seconds``: transactions of ``rows`` inserted rows, evenly paced."""
    stop = time.perf_counter() + seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        i, next_at = 0, time.perf_counter()
        while time.perf_counter() < stop:
            conn.execute(
                "INSERT INTO events (id, account, amount, note) SELECT g, 1, 1, 'x' "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (base + i, base + i + rows - 1),
            )
            i += rows
            next_at += rows / rate
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)


def latency(
    dsn: str, slot: str, work: str, destination: dict[str, Any], rate: int, seconds: float, rows: int
) -> list[float]:
    samples: list[float] = []
    create_slot(dsn, slot)
    with capture_for(config(dsn, slot, work, destination), samples) as capture:
        while capture.position == 0:
            time.sleep(0.05)
        samples.clear()  # nothing before the steady writer counts
        base = 10_000_000 * (1 + len(os.listdir(work)))
        write_rate(dsn, rate, seconds, base, rows)
        wait_position(capture, flush_lsn(dsn))
    return samples


def drain(dsn: str, slot: str, work: str, destination: dict[str, Any], upto: int) -> tuple[float, int, float]:
    with capture_for(config(dsn, slot, work, destination), None) as capture:
        while capture.position == 0:  # elected, the client ready, the slot found: now the drain
            time.sleep(0.001)
        t0 = time.perf_counter()
        wait_position(capture, upto)
        elapsed = time.perf_counter() - t0
        changes = capture.meter.changes
    return elapsed, changes, 0.0


def nats_stream(action: str, name: str, subject: str) -> None:
    async def run() -> None:
        import nats
        from nats.js.api import StreamConfig

        nc = await nats.connect(NATS_URL)
        try:
            js = nc.jetstream()
            if action == "add":
                await js.add_stream(StreamConfig(name=name, subjects=[subject]))
            else:
                await js.delete_stream(name)
        finally:
            await nc.close()

    asyncio.run(run())


def raw_nats(stream: str, n: int, group: int = 100, window: int = 1000) -> float:
    """The NATS client's own ceiling: ``n`` change-sized messages published to JetStream with the
    same client library, in groups of ``group``, ``window`` unacknowledged at most (as the
    capture's sender), every acknowledgement awaited; messages/s."""
    from brokers import windowed
    from sluiceway.brokers import Message
    from sluiceway.brokers.nats import to_nats

    row = b'{"id":1,"account":1,"amount":0.01,"note":"event 1","at":"2026-11-27T00:00:00+00:00"}'
    value = b'{"op":"insert","after":%s,"source":{"table":"public.events","lsn":"0/1A2B3C8"}}' % row
    messages = [Message("benchcapture.raw", str(i), value, (), f"raw:{i}") for i in range(n)]

    async def run() -> float:
        import nats

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()

        async def publish(chunk: list[Message]) -> None:
            futures = []
            for m in chunk:
                subject, payload, headers = to_nats(m, stream)
                futures.append(await js.publish_async(subject, payload, headers=headers))
            await asyncio.gather(*futures)

        try:
            return await windowed(messages, publish, group, window)
        finally:
            await nc.close()

    return asyncio.run(run())


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5_000, help="latency: transactions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: how long to write")
    parser.add_argument("--rows", type=int, default=10, help="latency: rows per transaction")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--txn", type=int, default=50, help="throughput: rows per transaction")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="sluice-bench-capture-")
    settings = {"wal_level": "logical", "max_replication_slots": "20", "shared_buffers": "'256MB'"}
    server = PrivatePostgres({**settings, "max_wal_size": "'4GB'"}).start()
    broker = Broker(log_path=os.path.join(work, "tansu.log")).start()
    stream = f"BENCHCAPTURE{os.getpid()}"
    nats_stream("add", stream, "benchcapture.>")
    dsn = server.dsn()
    kafka = {"kafka": {"bootstrap.servers": broker.bootstrap}, "topic": "cdc-events"}
    nats = {
        "target": {"type": "nats", "servers": [NATS_URL], "stream": stream},
        "topic": "benchcapture.{table}",
    }
    try:
        setup(dsn, 1)
        broker.create_topic("cdc-events", partitions=3)
        kafka_ms = latency(dsn, "lat_kafka", work, kafka, args.rate, args.seconds, args.rows)
        nats_ms = latency(dsn, "lat_nats", work, nats, args.rate, args.seconds, args.rows)
        times: dict[str, list[float]] = {"recv": [], "kafka": [], "nats": []}
        nats_raw: list[float] = []
        next_id = 1
        for round_no in range(args.rounds):
            for name in times:
                create_slot(dsn, f"{name}_{round_no}")
            write_changes(dsn, next_id, args.changes, args.txn)
            next_id += args.changes
            upto = flush_lsn(dsn)
            steps = {
                "recv": partial(raw_receiver, dsn, f"recv_{round_no}", upto),
                "kafka": partial(drain, dsn, f"kafka_{round_no}", work, kafka, upto),
                "nats": partial(drain, dsn, f"nats_{round_no}", work, nats, upto),
            }
            for name in list(steps) if round_no % 2 == 0 else list(reversed(steps)):
                elapsed, count, _cpu = steps[name]()
                if count < args.changes:
                    raise SystemExit(f"{name}: expected {args.changes} changes, got {count}")
                times[name].append(elapsed)
            nats_raw.append(raw_nats(stream, args.changes))
            print(
                f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True
            )
        rate = {k: args.changes / min(v) for k, v in times.items()}
        summary = {
            "bench": "capture",
            "latency_rate": args.rate,
            "latency_rows_per_txn": args.rows,
            "kafka_samples": len(kafka_ms),
            "kafka_p50_ms": round(percentile(kafka_ms, 0.5), 1),
            "kafka_p99_ms": round(percentile(kafka_ms, 0.99), 1),
            "kafka_max_ms": round(max(kafka_ms, default=float("nan")), 1),
            "nats_samples": len(nats_ms),
            "nats_p50_ms": round(percentile(nats_ms, 0.5), 1),
            "nats_p99_ms": round(percentile(nats_ms, 0.99), 1),
            "nats_max_ms": round(max(nats_ms, default=float("nan")), 1),
            "changes": args.changes,
            "rows_per_txn": args.txn,
            "raw_receiver_per_s": round(rate["recv"]),
            "capture_kafka_per_s": round(rate["kafka"]),
            "capture_kafka_ratio": round(rate["kafka"] / rate["recv"], 3),
            "capture_nats_per_s": round(rate["nats"]),
            "capture_nats_ratio": round(rate["nats"] / rate["recv"], 3),
            "raw_nats_publish_per_s": round(max(nats_raw)),
            "capture_nats_vs_raw_publish": round(rate["nats"] / max(nats_raw), 3),
        }
        report(
            f"sluice capture: commit → broker acknowledgement at {args.rate}/s, and a slot drained to Kafka",
            [
                ("(a) commit → Kafka ack, p50 / p99 / max",
                 f"{summary['kafka_p50_ms']} / {summary['kafka_p99_ms']} / {summary['kafka_max_ms']} ms"),
                ("commit → NATS JetStream ack, p50 / p99 / max",
                 f"{summary['nats_p50_ms']} / {summary['nats_p99_ms']} / {summary['nats_max_ms']} ms"),
                ("(b) raw receiver (receive only)", f"{rate['recv']:,.0f} changes/s"),
                ("capture → Kafka (acknowledged)", f"{rate['kafka']:,.0f} changes/s"),
                ("ratio", f"{summary['capture_kafka_ratio']:.2f}"),
                ("capture → NATS JetStream (acknowledged)", f"{rate['nats']:,.0f} changes/s"),
                ("ratio", f"{summary['capture_nats_ratio']:.2f}"),
                ("raw NATS publish loop (same client, acks awaited)", f"{max(nats_raw):,.0f} messages/s"),
                ("capture → NATS / raw publish loop", f"{summary['capture_nats_vs_raw_publish']:.2f}"),
            ],
            summary,
        )  # fmt: skip
    finally:
        try:
            nats_stream("delete", stream, "")
        except Exception as exc:  # the run's figures matter more than a leftover stream
            print(f"could not delete NATS stream {stream}: {exc}", file=sys.stderr)
        broker.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
