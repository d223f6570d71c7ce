"""``sluice capture`` benchmark: commit → broker acknowledgement, and throughput against the slot's
ceiling side by side with the destination's, in one run.

(a) latency: a writer commits transactions of 10 rows at a steady 5,000 changes/s (by default) for
    ``--seconds`` while a capture (snapshot never) publishes the table's changes to Kafka (the
    Tansu broker, started for the run), then to NATS JetStream (the local server). Per change:
    its commit time (from the stream) → the broker's acknowledgement of its message (the
    delivery report, timed as it arrives), p50/p99/max. Sequin reports 55 ms average and 253 ms
    p99 for the same measure at 50k/s on its own hardware.
(b) throughput: N changes (inserts, transactions of T rows) written first; then, per destination
    (``--brokers``, default Kafka, NATS JetStream, RabbitMQ and Redis Streams):
    * the capture drains the slot into it, timed from leadership until the position it confirms
      passes the last change;
    * **side by side**, no engine: a receive-only replication client of the same slot contents
      (psycopg2, nothing parsed or published) on a thread, while a raw publish loop sends the
      very messages the capture publishes (recorded once per round from a capture of the same
      changes: the same keys, JSON bodies and headers) with the destination's client library
      alone — confluent-kafka's ``produce`` with every delivery report awaited; nats-py,
      aio-pika confirmed publishes and redis-py pipelined ``XADD`` in groups of 100 with at most
      1,000 unacknowledged, as bench/brokers.py — timed until both are done. On a machine whose
      cores PostgreSQL, the broker and the client share, this is the most a capture that must
      both read the slot and publish could do here (bench/harvest.py measures the harvester so).
    Slots are created at the same position before the writes; rounds alternate the order.
    Beside: the receive-only client alone (the slot's ceiling).

The server is a private PostgreSQL (wal_level = logical) started for the run, on this host; NATS,
RabbitMQ and Redis are the machine's own servers on their default loopback ports.

    .venv/bin/python bench/capture.py [--rate 5000] [--seconds 10] [--changes 200000] [--txn 50]
                                      [--rounds 2] [--brokers kafka,nats,rabbitmq,redis]

Prints a table, then one JSON line: {"bench": "capture", "kafka_vs_side_by_side": …, …}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report
from brokers import RAW, Place
from cdc import create_slot, flush_lsn, raw_receiver, setup, write_changes
from sluiceway.capture import Capture
from sluiceway.harvest.ports import Delivery, Publisher
from sluiceway.heap import tune_collector
from sluiceway.outbox.record import MarkedRecord
from sluiceway.testing import Broker, PrivatePostgres

KAFKA_TOPIC = "cdc-events"
#: The broker raw loops: messages per call, and unacknowledged at most (bench/brokers.py's).
GROUP, WINDOW = 100, 1000


class Timed:
    """A publisher that times each change from its commit to its acknowledgement: (when, ms)
    pairs, written to ``path`` when it closes (it runs in the capture's publishing process)."""

    def __init__(self, inner: Publisher, path: str) -> None:
        self.inner, self.path = inner, path
        self.samples: list[tuple[float, float]] = []

    def _timed(self, on_done: Callable[[Delivery], None]) -> Callable[[Delivery], None]:
        samples = self.samples

        def done(delivery: Delivery) -> None:
            created = delivery.record.create_time
            if created is not None and delivery.error is None:
                now = time.time()
                samples.append((now, (now - created.timestamp()) * 1000.0))
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
        with open(self.path, "a") as out:
            out.writelines(f"{when} {ms}\n" for when, ms in self.samples)


class TimedWrap:
    """Wraps a term's publisher in :class:`Timed` (picklable: it crosses to the publishing process)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, inner: Publisher) -> Publisher:
        return Timed(inner, self.path)  # type: ignore[return-value]


class Recorder:
    """A publisher that keeps what it is given and acknowledges it at once: the capture's own
    messages, for the raw loops to send."""

    def __init__(self, out: list[MarkedRecord]) -> None:
        self.out = out

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        self.send_many([record], on_done)

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        self.out.extend(records)
        for record in records:
            on_done(Delivery(record))

    def flush(self, timeout: float) -> int:
        return 0

    def close(self) -> None:
        pass


def config(dsn: str, slot: str, work: str, destination: dict[str, Any]) -> dict[str, Any]:
    return {
        "capture": {
            "name": slot, "dsn": dsn, "tables": ["public.events"], "slot": slot,
            "publication": "bench_pub", "snapshot": "never", "stateDir": os.path.join(work, slot),
            **destination,
        }
    }  # fmt: skip


def capture_for(cfg: dict[str, Any], wrap: Callable[[Publisher], Publisher] | None = None) -> Capture:
    return Capture(cfg, wrap=wrap)


def wait_position(capture: Capture, upto: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while capture.position < upto:
        if time.monotonic() > deadline:
            raise SystemExit(f"the capture did not reach {upto} within {timeout} s")
        if capture.wait(timeout=0.005):
            raise SystemExit("the capture stopped")


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
    path = os.path.join(work, f"{slot}.samples")
    create_slot(dsn, slot)
    with capture_for(config(dsn, slot, work, destination), TimedWrap(path)) as capture:
        while capture.position == 0:
            time.sleep(0.05)
        started = time.time()  # nothing before the steady writer counts
        base = 10_000_000 * (1 + len(os.listdir(work)))
        write_rate(dsn, rate, seconds, base, rows)
        wait_position(capture, flush_lsn(dsn))
    with open(path) as lines:
        pairs = [tuple(map(float, line.split())) for line in lines]
    return [ms for when, ms in pairs if when >= started]


def drain(dsn: str, slot: str, work: str, destination: dict[str, Any], upto: int) -> tuple[float, int]:
    """The capture from leadership until it has confirmed ``upto``: seconds, changes published."""
    with capture_for(config(dsn, slot, work, destination)) as capture:
        while capture.position == 0:  # elected, the client ready, the slot found: now the drain
            time.sleep(0.001)
        t0 = time.perf_counter()
        wait_position(capture, upto)
        elapsed = time.perf_counter() - t0
        changes = capture.meter.changes
    return elapsed, changes


def record(dsn: str, slot: str, work: str, upto: int) -> list[MarkedRecord]:
    """The messages a capture publishes for the slot's changes up to ``upto`` (nothing sent)."""
    out: list[MarkedRecord] = []
    destination = {"kafka": {"bootstrap.servers": "127.0.0.1:9"}, "topic": KAFKA_TOPIC}
    capture = Capture(config(dsn, slot, work, destination), publisher_factory=lambda epoch: Recorder(out))
    with capture:
        wait_position(capture, upto)
    return out


# -- side by side: the receive-only client while a raw loop publishes the same messages ----------------
def side_by_side(
    receive: Callable[[], tuple[float, int, float]], publish: Callable[[], object], changes: int
) -> float:
    """``receive`` on a thread while ``publish`` runs here; changes/s until both are done."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _elapsed, count, _cpu = receive()
            if count != changes:
                raise SystemExit(f"the receive-only client got {count} changes of {changes}")
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    start = time.perf_counter()
    thread.start()
    publish()
    thread.join()
    elapsed = time.perf_counter() - start
    if failed:
        raise failed[0]
    return changes / elapsed


def kafka_loop(bootstrap: str, records: list[MarkedRecord]) -> Callable[[], None]:
    """A raw produce loop of ``records`` (as the capture's client is configured: idempotent,
    gapless, a 2 ms linger), every delivery report awaited. The producer is made and warm (its
    producer id assigned) before it is returned, as the capture's client is before it leads."""
    from confluent_kafka import Producer

    from sluiceway.capture import CaptureConfig

    settings = CaptureConfig.from_dict(
        config("postgresql://localhost/x", "side", "", {"kafka": {"bootstrap.servers": bootstrap}})
    )
    producer = Producer(settings.capture.producer_config)
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer.produce(KAFKA_TOPIC, b"warm-up", b"warm-up", on_delivery=delivered)
    if producer.flush(30) or failed:
        raise SystemExit(f"the raw produce loop's producer is not ready: {failed[:3]}")
    messages = [(r.value, r.key.encode(), list(r.headers)) for r in records]

    def run() -> None:
        produce, poll = producer.produce, producer.poll
        for value, key, headers in messages:
            while True:
                try:
                    produce(KAFKA_TOPIC, value, key, on_delivery=delivered, headers=headers)
                    break
                except BufferError:
                    poll(0.05)
            poll(0)
        if producer.flush(120) or failed:
            raise SystemExit(f"the raw produce loop did not deliver everything: {failed[:3]}")

    return run


def broker_loop(place: Place, records: list[MarkedRecord]) -> Callable[[], None]:
    """The broker's raw loop (bench/brokers.py's) over the capture's messages, on ``place``."""
    from sluiceway.harvest.brokers import to_message

    messages = [to_message(r._replace(topic=place.topic), "0123456789:") for r in records]
    run = RAW[place.broker]
    return lambda: asyncio.run(run(place, messages, GROUP, WINDOW))


def side_run(
    dsn: str,
    slot: str,
    upto: int,
    place: Place | None,
    bootstrap: str,
    records: list[MarkedRecord],
    changes: int,
) -> float:
    """One side-by-side run: changes/s."""
    receive = partial(raw_receiver, dsn, slot, upto, changes)
    if place is not None:
        asyncio.run(place.empty())
        publish = broker_loop(place, records)
    else:
        publish = kafka_loop(bootstrap, records)
    return side_by_side(receive, publish, changes)


def capture_run(
    dsn: str, slot: str, work: str, destination: dict[str, Any], upto: int, place: Place | None, changes: int
) -> float:
    """One capture drain into an empty destination: changes/s."""
    if place is not None:
        asyncio.run(place.empty())
    elapsed, count = drain(dsn, slot, work, destination, upto)
    if count < changes:
        raise SystemExit(f"{slot}: expected {changes} changes, got {count}")
    return count / elapsed


def place_for(broker: str) -> Place:
    place = Place(broker)
    place.topic = f"{place.prefix}.events"  # the capture's topic template: "<prefix>.{table}"
    asyncio.run(place.create())
    return place


def destination_of(broker: str, bootstrap: str, place: Place | None) -> dict[str, Any]:
    if broker == "kafka":
        return {"kafka": {"bootstrap.servers": bootstrap}, "topic": KAFKA_TOPIC}
    assert place is not None
    return {"target": place.target(), "topic": f"{place.prefix}.{{table}}"}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5_000, help="latency: changes per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: how long to write")
    parser.add_argument("--rows", type=int, default=10, help="latency: rows per transaction")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--txn", type=int, default=50, help="throughput: rows per transaction")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--brokers", default="kafka,nats,rabbitmq,redis")
    parser.add_argument("--no-latency", action="store_true", help="skip (a)")
    args = parser.parse_args()
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    tune_collector()  # as `sluice capture` does

    work = tempfile.mkdtemp(prefix="sluice-bench-capture-")
    settings = {"wal_level": "logical", "max_replication_slots": "40", "shared_buffers": "'256MB'"}
    server = PrivatePostgres({**settings, "max_wal_size": "'4GB'", "max_wal_senders": "40"}).start()
    broker = Broker(log_path=os.path.join(work, "tansu.log")).start()
    places = {b: place_for(b) for b in brokers if b != "kafka"}
    dsn = server.dsn()
    destinations = {b: destination_of(b, broker.bootstrap, places.get(b)) for b in brokers}
    try:
        setup(dsn, 1)
        broker.create_topic(KAFKA_TOPIC, partitions=3)
        summary: dict[str, Any] = {"bench": "capture"}
        rows: list[tuple[str, str]] = []
        if not args.no_latency:
            for name in ("kafka", "nats"):
                if name not in destinations:
                    continue
                ms = latency(dsn, f"lat_{name}", work, destinations[name], args.rate, args.seconds, args.rows)
                summary.update({
                    f"{name}_samples": len(ms),
                    f"{name}_p50_ms": round(percentile(ms, 0.5), 1),
                    f"{name}_p99_ms": round(percentile(ms, 0.99), 1),
                    f"{name}_max_ms": round(max(ms, default=float("nan")), 1),
                })  # fmt: skip
                p50, p99, top = (summary[f"{name}_{q}_ms"] for q in ("p50", "p99", "max"))
                rows.append((
                    f"(a) commit → {name} acknowledgement at {args.rate:,}/s, p50 / p99 / max",
                    f"{p50} / {p99} / {top} ms",
                ))  # fmt: skip
            summary["latency_rate"] = args.rate
            summary["latency_rows_per_txn"] = args.rows

        recv: list[float] = []
        captured: dict[str, list[float]] = {b: [] for b in brokers}
        sides: dict[str, list[float]] = {b: [] for b in brokers}
        next_id = 1
        for round_no in range(args.rounds):
            slots = ["rec", "recv"] + [f"{b}_{kind}" for b in brokers for kind in ("cap", "side")]
            for slot in slots:
                create_slot(dsn, f"{slot}_{round_no}")
            write_changes(dsn, next_id, args.changes, args.txn)
            next_id += args.changes
            upto = flush_lsn(dsn)
            records = record(dsn, f"rec_{round_no}", work, upto)
            if len(records) != args.changes:
                raise SystemExit(f"recorded {len(records)} messages for {args.changes} changes")
            elapsed, count, _cpu = raw_receiver(dsn, f"recv_{round_no}", upto, args.changes)
            recv.append(count / elapsed)
            line = [f"receive-only {recv[-1]:,.0f}/s"]
            for name in brokers:
                place = places.get(name)
                side = partial(
                    side_run, dsn, f"{name}_side_{round_no}", upto, place, broker.bootstrap, records
                )
                cap = partial(
                    capture_run, dsn, f"{name}_cap_{round_no}", work, destinations[name], upto, place
                )
                for step, into in ((side, sides), (cap, captured))[:: 1 if round_no % 2 == 0 else -1]:
                    into[name].append(step(args.changes))
                line.append(f"{name} {captured[name][-1]:,.0f}/s vs side by side {sides[name][-1]:,.0f}/s")
            print(f"round {round_no}: " + "; ".join(line), flush=True)

        summary.update({"changes": args.changes, "rows_per_txn": args.txn, "rounds": args.rounds})
        summary["raw_receiver_per_s"] = round(max(recv))
        rows.append(("(b) receive-only replication client", f"{max(recv):,.0f} changes/s  {_rounds(recv)}"))
        for name in brokers:
            best, ceiling = max(captured[name]), max(sides[name])
            ratios = [c / s for c, s in zip(captured[name], sides[name], strict=True)]
            summary[f"capture_{name}_per_s"] = round(best)
            summary[f"{name}_side_by_side_per_s"] = round(ceiling)
            summary[f"{name}_vs_side_by_side"] = round(best / ceiling, 3)
            summary[f"{name}_vs_receiver"] = round(best / max(recv), 3)
            per_round = ", ".join(f"{r:.2f}" for r in ratios)
            rows += [
                (f"{name}: receive-only + raw publish loop, side by side",
                 f"{ceiling:,.0f} changes/s  {_rounds(sides[name])}"),
                (f"{name}: capture (acknowledged)", f"{best:,.0f} changes/s  {_rounds(captured[name])}"),
                (f"{name}: capture / side by side", f"{best / ceiling:.2f}  (rounds {per_round})"),
            ]  # fmt: skip
        title = (
            f"sluice capture: {args.changes:,} changes in transactions of {args.txn}, best of {args.rounds}"
        )
        report(title, rows, summary)
    finally:
        for place in places.values():
            try:
                asyncio.run(place.remove())
            except Exception as exc:  # the run's figures matter more than a leftover stream
                print(f"could not remove {place.broker} {place.prefix}: {exc}", file=sys.stderr)
        broker.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _rounds(values: list[float]) -> str:
    return "(" + " / ".join(f"{v:,.0f}" for v in values) + ")"


if __name__ == "__main__":
    main()
