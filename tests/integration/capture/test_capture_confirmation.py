"""The position ``sluice capture`` confirms to PostgreSQL is never ahead of its destination.

Tried as a user checking the promise would, for every destination: a writer commits single-row
transactions for a few seconds, then stops; as soon as the slot's ``confirmed_flush_lsn`` is at
or past the WAL end, the destination is read *to its end as it is at that moment* and must hold
every committed change. Every byte the capture sends to a broker goes through a proxy that
delivers it 2 s late, so a capture that confirmed what it had only handed to its client library
(or turned a quiet position into a confirmation while changes were in flight) would lose this
race every time, by the proxy's delay.

And a ``kill -9`` in that window: the proxy holds back everything the capture sends; changes are
written; the slot must not confirm them; the capture is killed and what was held is dropped (as
if the network had lost it); a new capture must publish every change.

Reading Kafka "to its end" stops at each partition's end as the fetch reports it (the consumer's
partition EOF). The Kafka-protocol broker the tests use answers ``ListOffsets`` (what
``get_watermark_offsets`` asks) with the first offset of the last batch plus one after a batch of
several messages, so a reader that stops at that "high watermark" misses the rest of the batch
although the broker holds it (seen with Tansu 0.6.0: five messages produced in one batch, offsets
0 to 4 fetched, high watermark 1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.capture import Capture
from sluiceway.testing import Broker, free_port, wait_until
from tests.support.brokers import PORTS, CuttableProxy, Place, make_place
from tests.support.capture import (
    Change,
    ItemsWriter,
    check_changes,
    config,
    parse,
    seed_items,
    source_rows,
)
from tests.support.cdc import journal_records, slot_confirmed, wal_now

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
DESTINATIONS = ["kafka", "nats", "rabbitmq", "redis", "journal"]
#: How late every byte the capture sends reaches a broker in the confirmation test: longer than
#: a reader takes to start (a Kafka consumer's first fetch), so a confirmation ahead of the broker
#: is always seen.
DELAY = 2.0


@pytest.fixture
def items(cdc_dsn: str) -> str:
    return seed_items(cdc_dsn, 200)


class Destination:
    """One destination behind a proxy: its capture settings, and a read of what it holds now."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.place: Place | None = None
        self.broker: Broker | None = None
        self.proxy: CuttableProxy | None = None
        self.journal = tmp / "journal"
        if kind == "kafka":
            # Its own broker, advertising the proxy: metadata sends every client through it.
            port = free_port()
            self.proxy = CuttableProxy(port)
            self.broker = Broker(port, advertised_port=self.proxy.port).start()
            self.topic = self.broker.create_topic(f"cdc-confirm-{time.time_ns()}", partitions=3)
        elif kind != "journal":
            self.place = make_place(kind)
            self.proxy = CuttableProxy(PORTS[kind])
            self.topic = f"{self.place.prefix}.items"

    def settings(self) -> dict[str, Any]:
        if self.kind == "journal":
            return {"journal": {"path": str(self.journal), "fsync": False}}
        assert self.proxy is not None
        if self.kind == "kafka":
            return {"kafka": {"bootstrap.servers": self.proxy.url("kafka")}, "topic": self.topic}
        assert self.place is not None
        target = self.place.target(self.proxy.url(self.kind))
        return {"target": target, "topic": f"{self.place.prefix}.{{table}}"}

    def delay(self, seconds: float) -> None:
        """From now on, what clients send reaches the broker ``seconds`` late (bytes already on
        their way keep the time they were given)."""
        if self.proxy is not None:
            self.proxy.delay = seconds

    def read_now(self) -> list[Change]:
        """Every change the destination holds at this moment (nothing that arrives later)."""
        self.delay(0.0)  # the reader's own requests go straight through
        if self.kind == "journal":
            return [parse(r["key"], r["value"], r["headers"]) for r in journal_records(self.journal)]
        if self.kind == "kafka":
            return self._read_kafka()
        assert self.place is not None
        held = self.place.count()  # the broker's own count, now; then read that many
        seen = self.place.read(expected=held) if self.kind == "rabbitmq" else self.place.read()
        return [parse(k, v, h) for k, v, h in seen[:held]]

    def _read_kafka(self) -> list[Change]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        assert self.broker is not None
        consumer = Consumer({
            "bootstrap.servers": f"127.0.0.1:{self.broker.port}", "group.id": f"read-{time.time_ns()}",
            "enable.auto.commit": False, "enable.partition.eof": True,
        })  # fmt: skip
        partitions = list(consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions)
        consumer.assign([TopicPartition(self.topic, p, 0) for p in partitions])
        out, ended = [], set()
        deadline = time.monotonic() + 30
        try:
            while len(ended) < len(partitions):
                assert time.monotonic() < deadline, f"partitions {set(partitions) - ended} never ended"
                for m in consumer.consume(1000, 0.5):
                    if m.error() is None:
                        out.append(parse(m.key().decode(), m.value(), m.headers()))
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        ended.add(m.partition())
        finally:
            consumer.close()
        return out

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        if self.broker is not None:
            self.broker.stop()
        if self.place is not None:
            self.place.cleanup()


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_once_the_slot_confirms_the_wal_end_the_destination_holds_every_change(
    items: str, tmp_path: Path, kind: str
) -> None:
    slot = f"confirm_{kind}"
    destination = Destination(kind, tmp_path)
    try:
        cfg = config(items, slot, tmp_path / "state", **destination.settings())
        writer = ItemsWriter(items, pace=0.01)
        with Capture(cfg) as capture:
            wait_until(lambda: capture.meter.changes >= 200, timeout=60, message="the copy")
            start = wal_now(items)
            wait_until(lambda: slot_confirmed(items, slot) >= start, timeout=60, message="the copy's acks")
            destination.delay(DELAY)  # connected and caught up: from here every publish lands DELAY late
            writer.start()
            time.sleep(4)
            writer.finish()
            end = wal_now(items)
            wait_until(lambda: slot_confirmed(items, slot) >= end, timeout=60, message="the slot to confirm")
            seen = destination.read_now()
        assert writer.ops > 100
        check_changes(seen, writer, source_rows(items))
    finally:
        destination.close()


class CaptureProcess:
    """``sluice capture -f FILE`` in a process group of its own, for a kill -9."""

    def __init__(self, spec: Path, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(spec)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.mark.parametrize("kind", ["kafka", "nats", "rabbitmq", "redis"])
def test_a_kill_while_the_broker_has_not_acknowledged_loses_nothing(
    items: str, tmp_path: Path, kind: str
) -> None:
    slot = f"window_{kind}"
    destination = Destination(kind, tmp_path)
    spec = tmp_path / "capture.yaml"
    spec.write_text(yaml.safe_dump(config(items, slot, tmp_path / "state", **destination.settings())))
    assert destination.proxy is not None
    proxy = destination.proxy
    first = second = None
    confirmed: Callable[[], int] = lambda: slot_confirmed(items, slot)  # noqa: E731
    try:
        first = CaptureProcess(spec, tmp_path / "first.log")
        wait_until(lambda: confirmed() > 0 and first.alive(), timeout=60, message="the first capture")
        writer = ItemsWriter(items, pace=0.01)
        writer.start()
        wait_until(lambda: writer.ops > 50, timeout=30)
        mark = wal_now(items)
        wait_until(lambda: confirmed() >= mark, timeout=30, message="changes to flow")
        proxy.hold()  # from here the broker gets nothing and acknowledges nothing
        time.sleep(0.5)
        writer.finish()
        end = wal_now(items)
        time.sleep(3)  # keepalives, quiet positions, the lease's own writes: none may confirm past them
        assert confirmed() < end, "the slot confirmed changes the broker never acknowledged"
        assert first.alive()
        first.kill()
        proxy.cut()  # what was held is lost with the connection
        proxy.restore()
        second = CaptureProcess(spec, tmp_path / "second.log")
        wait_until(lambda: confirmed() >= end, timeout=90, message="the second capture to catch up")
        seen = destination.read_now()
        check_changes(seen, writer, source_rows(items))
    finally:
        for process in (first, second):
            if process is not None:
                process.kill(signal.SIGTERM)
        destination.close()
