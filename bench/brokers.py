"""Outbox -> NATS JetStream, RabbitMQ and Redis through the harvester, against a raw publish loop
with the same client library, in the same run.

    .venv/bin/python bench/brokers.py [--rows 50000] [--keys 1000] [--rounds 3] [--brokers nats,redis]

For each broker, interleaved rounds of:
(a) raw loop: the same messages (same topic, key, 100-byte value, the same headers the harvester
    adds: key, message id) published with the broker's client library alone — nats-py
    ``publish_async``, aio-pika confirmed publishes, redis-py pipelined ``XADD`` — in groups of
    ``--group`` with at most ``--window`` unacknowledged at once, every acknowledgement awaited
    (JetStream ack, publisher confirm, Redis reply) within the same timeout the harvester's client
    uses. That is how the harvester awaits them: up to ``maxInFlightRecords`` (the same window)
    across keys, one per key — the rows cycle through ``--keys`` keys, so a raw-loop window holds
    each key at most once too;
(b) the harvester draining the same rows from PostgreSQL into the broker (election by database
    lease; timed from leadership to an empty outbox);
(c) both jobs with no engine, side by side in one process as the harvester has them: the raw SQL
    loop of bench/harvest.py (mark + batched delete of the same rows, on a thread) while the raw
    loop publishes the same messages; timed until both are done. On a machine whose cores
    PostgreSQL, the broker server and the Python process share, this — not the raw loop alone — is
    the most an outbox harvester could do here.
Needs the three servers on their default loopback ports. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, scratch_postgres, timed_drain
from harvest import VALUE, load, outbox_rows
from harvest import side_by_side as harvest_side_by_side
from sluiceway.brokers import Message
from sluiceway.harvest import HarvestConfig
from sluiceway.heap import tune_collector

NATS_URL = "nats://127.0.0.1:4222"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
REDIS_URL = "redis://127.0.0.1:6379/0"


# -- a private place on each broker ------------------------------------------------------------------
class Place:
    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.prefix = f"sluicebench{uuid.uuid4().hex[:8]}"
        self.topic = f"{self.prefix}.orders"
        self.stream = self.prefix.upper()
        self.exchange = f"{self.prefix}.x"
        self.queue = f"{self.prefix}.q"

    def target(self) -> dict[str, Any]:
        if self.broker == "nats":
            return {"type": "nats", "servers": [NATS_URL], "stream": self.stream}
        if self.broker == "rabbitmq":
            return {"type": "rabbitmq", "url": AMQP_URL, "exchange": self.exchange}
        return {"type": "redis", "url": REDIS_URL}

    async def create(self) -> None:
        if self.broker == "nats":
            import nats
            from nats.js.api import StorageType, StreamConfig

            nc = await nats.connect(NATS_URL)
            await nc.jetstream().add_stream(
                StreamConfig(name=self.stream, subjects=[f"{self.prefix}.>"], storage=StorageType.FILE)
            )
            await nc.close()
        elif self.broker == "rabbitmq":
            import aio_pika

            conn = await aio_pika.connect(AMQP_URL)
            ch = await conn.channel()
            exchange = await ch.declare_exchange(self.exchange, "topic")
            queue = await ch.declare_queue(self.queue, durable=True)
            await queue.bind(exchange, routing_key="#")
            await conn.close()

    async def empty(self) -> None:
        """Drop what the last run stored, so every run writes into the same empty place."""
        await self.remove()
        await self.create()

    async def remove(self) -> None:
        if self.broker == "nats":
            import nats

            nc = await nats.connect(NATS_URL)
            with contextlib.suppress(Exception):  # not there yet
                await nc.jetstream().delete_stream(self.stream)
            await nc.close()
        elif self.broker == "rabbitmq":
            import aio_pika

            conn = await aio_pika.connect(AMQP_URL)
            ch = await conn.channel()
            await ch.queue_delete(self.queue)
            await ch.exchange_delete(self.exchange)
            await conn.close()
        else:
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(REDIS_URL)
            await client.delete(self.topic)
            await client.aclose()


# -- the raw loops ---------------------------------------------------------------------------------------
Publish = Callable[[list[Message]], Awaitable[None]]


async def windowed(messages: list[Message], publish: Publish, group: int, window: int) -> float:
    """Publish ``messages`` in groups, at most ``window`` unacknowledged; return messages/s."""
    slots = asyncio.Semaphore(max(1, window // group))
    tasks = []

    async def one(chunk: list[Message]) -> None:
        try:
            await publish(chunk)
        finally:
            slots.release()

    start = time.perf_counter()
    for i in range(0, len(messages), group):
        await slots.acquire()
        tasks.append(asyncio.create_task(one(messages[i : i + group])))
    await asyncio.gather(*tasks)
    return len(messages) / (time.perf_counter() - start)


async def raw_nats(place: Place, messages: list[Message], group: int, window: int) -> float:
    import nats

    from sluiceway.brokers.nats import to_nats

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()

    async def publish(chunk: list[Message]) -> None:
        futures = []
        for m in chunk:
            subject, payload, headers = to_nats(m, place.stream)
            futures.append(await js.publish_async(subject, payload, headers=headers))
        for ack in await asyncio.gather(*futures):
            assert ack.seq > 0

    try:
        return await windowed(messages, publish, group, window)
    finally:
        await nc.close()


async def raw_rabbitmq(place: Place, messages: list[Message], group: int, window: int) -> float:
    import aio_pika

    from sluiceway.brokers.rabbitmq import amqp_headers

    conn = await aio_pika.connect(AMQP_URL)
    ch = await conn.channel(publisher_confirms=True)
    exchange = await ch.get_exchange(place.exchange, ensure=False)

    async def publish(chunk: list[Message]) -> None:
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(
                        m.value or b"",
                        headers=amqp_headers(m),
                        message_id=m.msg_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    m.topic,
                    mandatory=False,
                )
                for m in chunk
            )
        )

    try:
        return await windowed(messages, publish, group, window)
    finally:
        await conn.close()


async def raw_redis(place: Place, messages: list[Message], group: int, window: int) -> float:
    from sluiceway.brokers.redis import connect_redis, xadd_args
    from sluiceway.config.brokers import RedisSettings

    # The client as the publishers configure it: commands packed by hiredis, the replies of a
    # pipeline awaited within one timeout.
    settings = RedisSettings(url=REDIS_URL)
    client = connect_redis(settings, reply_timeout=False)

    async def publish(chunk: list[Message]) -> None:
        pipe = client.pipeline(transaction=False)
        for m in chunk:
            pipe.execute_command(*xadd_args(m, 0))
        async with asyncio.timeout(settings.ack_timeout):
            await pipe.execute()

    try:
        return await windowed(messages, publish, group, window)
    finally:
        await client.aclose()


RAW = {"nats": raw_nats, "rabbitmq": raw_rabbitmq, "redis": raw_redis}


def messages_of(place: Place, rows: int, keys: int) -> list[Message]:
    return [
        Message(place.topic, f"key-{i % keys}", VALUE.encode(), (), f"0123456789:{i + 1}")
        for i in range(rows)
    ]


def raw(place: Place, rows: int, keys: int, group: int, window: int) -> float:
    messages = messages_of(place, rows, keys)

    async def run() -> float:
        await place.empty()
        return await RAW[place.broker](place, messages, group, window)

    return asyncio.run(run())


def side_by_side(dsn: str, place: Place, rows: int, keys: int, group: int, window: int, mark: int) -> float:
    """(c): the raw SQL loop and the raw publish loop at once, over the same rows; rows/s."""
    messages = messages_of(place, rows, keys)
    asyncio.run(place.empty())
    publish = functools.partial(asyncio.run, RAW[place.broker](place, messages, group, window))
    return harvest_side_by_side(dsn, place.topic, rows, keys, mark, publish)


# -- the harvester -----------------------------------------------------------------------------------------
def drain(dsn: str, place: Place, rows: int, mark: int, window: int) -> float:
    asyncio.run(place.empty())
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "name": f"bench-{place.prefix}-{uuid.uuid4().hex[:6]}",
                "dataSource": dsn,
                "target": {**place.target(), "msgIdPrefix": "0123456789:"},
                # The raw loop's messages carry no sluice-id/sluice-leader: the same sizes here.
                "sequenceHeaders": False,
                "limits": {
                    "markQueryRecords": mark,
                    "maxInFlightRecords": window,
                    "minMetricsInterval": "60s",
                },
            }
        }
    )
    return timed_drain(config, rows, lambda: outbox_rows(dsn))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mark-records", type=int, default=500)
    ap.add_argument("--window", type=int, default=1000, help="unacknowledged messages at once (both sides)")
    ap.add_argument("--group", type=int, default=100, help="messages per raw-loop call")
    ap.add_argument("--brokers", default="nats,rabbitmq,redis")
    args = ap.parse_args()
    tune_collector()  # as `sluice reap` does (sluiceway/heap.py), for every side measured here
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    rows: list[tuple[str, str]] = []
    summary: dict[str, Any] = {"bench": "brokers"}
    with scratch_postgres() as dsn:
        for broker in brokers:
            place = Place(broker)
            raws: list[float] = []
            harvests: list[float] = []
            boths: list[float] = []
            try:
                for _ in range(args.rounds):
                    raws.append(raw(place, args.rows, args.keys, args.group, args.window))
                    boths.append(
                        side_by_side(
                            dsn, place, args.rows, args.keys, args.group, args.window, args.mark_records
                        )
                    )
                    load(dsn, args.rows, args.keys, place.topic)
                    harvests.append(drain(dsn, place, args.rows, args.mark_records, args.window))
            finally:
                asyncio.run(place.remove())
            ratios = sorted(h / r for h, r in zip(harvests, raws, strict=True))
            ratio = statistics.median(ratios)
            both_ratio = statistics.median(h / b for h, b in zip(harvests, boths, strict=True))
            rows += [
                (
                    f"{broker}: raw loop ({args.group}/call, window {args.window})",
                    f"{statistics.median(raws):,.0f} rec/s  {_rounds(raws)}",
                ),
                (f"{broker}: harvester", f"{statistics.median(harvests):,.0f} rec/s  {_rounds(harvests)}"),
                (
                    f"{broker}: ratio (target >= 0.5)",
                    f"{ratio:.2f}  (rounds {', '.join(f'{x:.2f}' for x in ratios)})",
                ),
                (
                    f"{broker}: raw SQL loop + raw loop, side by side",
                    f"{statistics.median(boths):,.0f} rec/s  {_rounds(boths)}",
                ),
                (f"{broker}: harvester / side by side", f"{both_ratio:.2f}"),
            ]
            summary[f"{broker}_raw_rps"] = round(statistics.median(raws))
            summary[f"{broker}_harvest_rps"] = round(statistics.median(harvests))
            summary[f"{broker}_ratio"] = round(ratio, 3)
            summary[f"{broker}_side_by_side_rps"] = round(statistics.median(boths))
            summary[f"{broker}_side_by_side_ratio"] = round(
                statistics.median(boths) / statistics.median(raws), 3
            )
            summary[f"{broker}_harvest_vs_side_by_side"] = round(both_ratio, 3)
    report(
        f"brokers: {args.rows:,} rows, {args.keys} keys, 100-byte values, median of {args.rounds} rounds",
        rows,
        summary,
    )


def _rounds(values: list[float]) -> str:
    return "(" + " / ".join(f"{v:,.0f}" for v in values) + ")"


if __name__ == "__main__":
    main()
