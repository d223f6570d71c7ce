"""``sluice-nats``: a NATS JetStream stream as a Spark streaming source (Arrow batches).

>>> (spark.readStream.format("sluice-nats").option("servers", "nats://127.0.0.1:4222")  # doctest: +SKIP
...    .option("stream", "ORDERS").load())

Options: ``servers`` (comma-separated), ``stream`` (required), ``subject`` (a filter, NATS
wildcards), ``startingOffset`` (``earliest`` | ``latest`` | a stream sequence),
``maxRecordsPerBatch`` (default 100,000: sequences per micro-batch), ``pollTimeout`` (s).

Offsets are stream sequences, ``{"seq": next}``. A micro-batch is the sequence range
``[start, end)``, read by one task with an ephemeral consumer that starts at ``start`` (nothing is
acknowledged, no durable consumer is left behind), so a replay reads the same messages. Records:
``offset`` = stream sequence, ``namespace`` = subject, ``key``/``value``/``headers`` as the
harvester's mapping (``sluiceway.brokers.nats``), ``timestamp`` = when the stream stored it.
Messages removed from the stream (limits, deletes) are simply not there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluiceway.brokers.nats import from_nats, map_error
from sluiceway.pipeline.offsets import next_end
from sluiceway.pipeline.sources.common import (
    RecordSource,
    float_option,
    limit_rows,
    max_records,
    message_row,
    option,
    record_batch,
    required,
)

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition  # isort: skip
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # isort: skip

NAME = "sluice-nats"
_FETCH = 1000


@dataclass(frozen=True)
class NatsPartition(InputPartition):
    servers: tuple[str, ...]
    stream: str
    subject: str | None
    lo: int
    hi: int


async def _bounds(servers: list[str], stream: str) -> tuple[int, int]:
    """(first sequence, next sequence) of the stream."""
    import nats

    try:
        nc = await nats.connect(servers=servers, allow_reconnect=False)
    except Exception as exc:
        raise map_error(exc, "connect", ",".join(servers)) from exc
    try:
        info = await nc.jetstream().stream_info(stream)
    except Exception as exc:
        raise map_error(exc, "read stream info", stream) from exc
    finally:
        await nc.close()
    return int(info.state.first_seq), int(info.state.last_seq) + 1


def stream_bounds(servers: list[str], stream: str) -> tuple[int, int]:
    return asyncio.run(_bounds(servers, stream))


async def _read(part: NatsPartition, poll_timeout: float) -> list[dict[str, Any]]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    rows: list[dict[str, Any]] = []
    nc = await nats.connect(servers=list(part.servers), allow_reconnect=False)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            part.subject or "",
            durable=None,
            stream=part.stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=part.lo,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=60.0,
                filter_subject=part.subject,
            ),
        )
        try:
            while True:
                try:
                    msgs = await sub.fetch(_FETCH, timeout=poll_timeout)
                except nats.errors.TimeoutError:
                    break  # nothing more in the stream: the rest of the range was removed
                done = False
                for msg in msgs:
                    meta = msg.metadata
                    seq = int(meta.sequence.stream)
                    if seq >= part.hi:
                        done = True
                        break
                    decoded = from_nats(msg.headers, msg.data)
                    rows.append(message_row(seq, msg.subject, decoded, meta.timestamp))
                    if seq + 1 >= part.hi or meta.num_pending == 0:
                        done = True
                        break
                if done:
                    break
        finally:
            await sub.unsubscribe()
    except Exception as exc:
        raise map_error(exc, "read", part.stream) from exc
    finally:
        await nc.close()
    return rows


def read_range(part: NatsPartition, poll_timeout: float = 2.0) -> Iterator[pa.RecordBatch]:
    """The stream's messages with ``lo <= sequence < hi`` as Arrow batches (executor side)."""
    rows = asyncio.run(_read(part, poll_timeout))
    for i in range(0, len(rows), 65_536):
        yield record_batch(rows[i : i + 65_536])


def _servers(options: Any) -> list[str]:
    raw = option(options, "servers", "nats://127.0.0.1:4222") or ""
    return [s.strip() for s in raw.split(",") if s.strip()]


class NatsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, Any]) -> None:
        self.servers = _servers(options)
        self.stream = required(options, "stream", NAME)
        self.subject = option(options, "subject")
        self.starting = (option(options, "startingOffset", "earliest") or "earliest").lower()
        self.max_rows = max_records(options)
        self.poll_timeout = float_option(options, "pollTimeout", 2.0)
        self.target: int | None = None

    def initialOffset(self) -> dict[str, int]:
        first, head = stream_bounds(self.servers, self.stream)
        if self.starting == "earliest":
            return {"seq": first}
        if self.starting == "latest":
            return {"seq": head}
        return {"seq": max(1, int(self.starting))}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = stream_bounds(self.servers, self.stream)[1]

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        _, head = stream_bounds(self.servers, self.stream)
        return {"seq": next_end(int(start["seq"]), head, limit_rows(limit), self.target)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"seq": stream_bounds(self.servers, self.stream)[1]}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[NatsPartition]:
        lo, hi = int(start["seq"]), int(end["seq"])
        if hi <= lo:
            return []
        # One task: the range is read in stream order, so each key's records stay in order.
        return [NatsPartition(tuple(self.servers), self.stream, self.subject, lo, hi)]

    def read(self, partition: NatsPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(partition, self.poll_timeout)


class NatsDataSource(RecordSource):
    """Reads a JetStream stream. See the module docstring for options."""

    NAME = NAME
    READER = NatsStreamReader
