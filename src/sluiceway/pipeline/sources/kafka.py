"""``sluice-kafka``: Kafka topics as a Spark streaming source and sink (confluent-kafka client).

>>> (spark.readStream.format("sluice-kafka")                               # doctest: +SKIP
...    .option("kafka.bootstrap.servers", "localhost:9092").option("topic", "orders").load())

Options: ``topic`` (comma-separated list); ``kafka.<setting>`` (any librdkafka setting, e.g.
``kafka.bootstrap.servers``); ``startingOffsets`` (``earliest``, default, or ``latest``);
``maxRecordsPerBatch`` (default 100,000, shared across partitions in proportion to their
backlog); ``pollTimeout`` (seconds a task waits for a record it knows exists, default 30).

Offsets are per partition, ``{"<topic>/<partition>": next offset}``, kept in Spark's checkpoint;
the consumer group is never used. Records: ``offset`` is the partition offset, ``namespace`` the
topic, ``key`` the key decoded as UTF-8, ``timestamp`` the record timestamp.

The writer (``df.writeStream.format("sluice-kafka")``) produces each row to ``topic`` (or to the
row's ``namespace`` when no topic is given) and waits for every delivery ack before its task
succeeds, so a micro-batch only commits once the broker has it all (at-least-once).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa

from sluiceway.errors import PublishError
from sluiceway.pipeline.errors import SourceError, SourceOptionError
from sluiceway.pipeline.offsets import cap_to_target, distribute_limit
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import (
    RecordSource,
    float_option,
    limit_rows,
    max_records,
    option,
    required,
)

from pyspark.sql.datasource import (  # isort: skip
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # isort: skip

NAME = "sluice-kafka"
_CHUNK = 10_000
#: The latest record timestamp (ms) whose microseconds fit the record's 64-bit timestamp.
_LATEST_MS = (2**63 - 1) // 1000


def kafka_config(options: Mapping[str, Any]) -> dict[str, str]:
    """librdkafka settings from ``kafka.*`` options (``bootstrap.servers`` also accepted bare)."""
    conf = {str(k)[6:]: str(v) for k, v in options.items() if str(k).lower().startswith("kafka.")}
    bare = option(options, "bootstrap.servers")
    if bare and "bootstrap.servers" not in conf:
        conf["bootstrap.servers"] = bare
    if "bootstrap.servers" not in conf:
        raise SourceOptionError(
            "kafka.bootstrap.servers", f"{NAME}: option 'kafka.bootstrap.servers' is required"
        )
    return conf


def part_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition("/")
    return topic, int(p)


@dataclass(frozen=True)
class KafkaPartition(InputPartition):
    topic: str
    partition: int
    lo: int
    hi: int


class KafkaAdmin:
    """Driver-side metadata and watermarks, through one long-lived consumer."""

    def __init__(self, conf: dict[str, str], topics: list[str], timeout: float = 10.0) -> None:
        from confluent_kafka import Consumer

        self.topics = topics
        self.timeout = timeout
        self.consumer = Consumer(
            {
                **conf,
                "group.id": f"sluice-meta-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            }
        )

    def partitions(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for topic in self.topics:
            md = self.consumer.list_topics(topic, timeout=self.timeout)
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None:
                raise SourceError(f"{NAME}: topic {topic!r} is not available: {getattr(meta, 'error', None)}")
            out.extend((topic, p) for p in sorted(meta.partitions))
        return out

    def watermarks(self, low: bool) -> dict[str, int]:
        from confluent_kafka import TopicPartition

        marks = {}
        for topic, p in self.partitions():
            lo, hi = self.consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=self.timeout, cached=False
            )
            marks[part_key(topic, p)] = int(lo if low else hi)
        return marks if low else self._confirm_ends(marks)

    def _confirm_ends(self, listed: dict[str, int]) -> dict[str, int]:
        """Check each listed end with a fetch from it: the fetch's end-of-partition is the truth.

        Some Kafka-protocol brokers (Tansu, our test broker) answer ListOffsets(latest) with
        the last *batch's* base offset + 1; a fetch reports the real high watermark. On Kafka
        itself this costs one empty fetch per partition and changes nothing.
        """
        from confluent_kafka import KafkaError, TopicPartition

        ends = dict(listed)
        pending = set(listed)
        self.consumer.assign([TopicPartition(*split_key(k), off) for k, off in listed.items()])
        deadline = time.monotonic() + self.timeout
        try:
            while pending and time.monotonic() < deadline:
                for msg in cast("list[Any]", self.consumer.consume(num_messages=10_000, timeout=0.2)):
                    key = part_key(msg.topic(), msg.partition())
                    err = msg.error()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        ends[key] = max(ends[key], int(msg.offset()))
                        pending.discard(key)
                    elif err is None:
                        ends[key] = max(ends[key], int(msg.offset()) + 1)
        finally:
            self.consumer.unassign()
        return ends

    def close(self) -> None:
        self.consumer.close()


class KafkaDataSource(RecordSource):
    """Reads and writes Kafka topics. See the module docstring for options."""

    NAME = NAME

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> KafkaStreamWriter:
        return KafkaStreamWriter(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, Any]) -> None:
        self.conf = kafka_config(options)
        self.topics = [t.strip() for t in required(options, "topic", NAME).split(",") if t.strip()]
        self.max_rows = max_records(options)
        self.poll_timeout = float_option(options, "pollTimeout", 30.0)
        self.starting = (option(options, "startingOffsets", "earliest") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise SourceOptionError(
                "startingOffsets",
                f"{NAME}: startingOffsets must be earliest or latest, got {self.starting!r}",
            )
        self.target: dict[str, int] | None = None
        self._admin: KafkaAdmin | None = None

    @property
    def admin(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self.conf, self.topics)
        return self._admin

    def initialOffset(self) -> dict[str, int]:
        return self.admin.watermarks(low=self.starting == "earliest")

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.admin.watermarks(low=False)

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        latest = cap_to_target(self.admin.watermarks(low=False), self.target)
        # A partition added since the query started is read from its beginning.
        begin = {k: int(v) for k, v in start.items()}
        return distribute_limit(begin, latest, limit_rows(limit))

    def reportLatestOffset(self) -> dict[str, int]:
        return self.admin.watermarks(low=False)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[KafkaPartition]:
        out = []
        for key in sorted(end):
            lo, hi = int(start.get(key, 0)), int(end[key])
            if hi > lo:
                topic, p = split_key(key)
                out.append(KafkaPartition(topic, p, lo, hi))
        return out

    def read(self, partition: KafkaPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(self.conf, partition, self.poll_timeout)

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def read_partition(
    conf: dict[str, str], part: KafkaPartition, poll_timeout: float
) -> Iterator[pa.RecordBatch]:
    """Consume ``[lo, hi)`` of one partition into Arrow batches (executor side)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"sluice-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.lo)])
        cols: dict[str, list[Any]] = {n: [] for n in RECORD_SCHEMA.names}
        idle_since = time.monotonic()
        done = False
        while not done:
            msgs: list[Any] = consumer.consume(num_messages=_CHUNK, timeout=0.5)
            if not msgs:
                if time.monotonic() - idle_since > poll_timeout:
                    raise SourceError(
                        f"{NAME}: {part.topic}/{part.partition}: no record for {poll_timeout:.0f}s while "
                        f"reading offsets {part.lo}..{part.hi}"
                    )
                continue
            idle_since = time.monotonic()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # The end of the log: offsets up to it that never arrived were gaps
                        # (transaction markers, compaction), not records still to come.
                        done = done or msg.offset() >= part.hi
                        continue
                    raise SourceError(f"{NAME}: {part.topic}/{part.partition}: {err}")
                off = msg.offset()
                if off >= part.hi:
                    done = True
                    break
                _append(cols, msg, off)
                if off + 1 >= part.hi:
                    done = True
                    break
            if len(cols["offset"]) >= _CHUNK:
                yield _batch(cols)
                cols = {n: [] for n in RECORD_SCHEMA.names}
        if cols["offset"]:
            yield _batch(cols)
    finally:
        consumer.close()


def _append(cols: dict[str, list[Any]], msg: Any, off: int) -> None:
    key = msg.key()
    value = msg.value()
    headers = msg.headers()
    _ts_type, ts_ms = msg.timestamp()
    cols["offset"].append(off)
    cols["namespace"].append(msg.topic())
    cols["op"].append("delete" if value is None else "insert")
    cols["key"].append(key.decode("utf-8", "replace") if isinstance(key, bytes) else (key or ""))
    cols["value"].append(value)
    cols["headers"].append(
        [{"key": k, "value": v.decode("utf-8", "replace") if isinstance(v, bytes) else v} for k, v in headers]
        if headers
        else []
    )
    # A producer sets any 64-bit number of milliseconds; one before the epoch (-1: none given)
    # or past what microseconds in 64 bits hold (the year 294247) is read as no timestamp.
    cols["timestamp"].append(ts_ms * 1000 if 0 <= ts_ms <= _LATEST_MS else None)


def _batch(cols: dict[str, list[Any]]) -> pa.RecordBatch:
    arrays = [
        pa.array(cols["offset"], pa.int64()),
        pa.array(cols["namespace"], pa.string()),
        pa.array(cols["op"], pa.string()),
        pa.array(cols["key"], pa.string()),
        pa.array(cols["value"], pa.binary()),
        pa.array(cols["headers"], RECORD_SCHEMA.field("headers").type),
        pa.array(cols["timestamp"], pa.int64()).cast(RECORD_SCHEMA.field("timestamp").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA)


# --- writing ------------------------------------------------------------------------------------
class KafkaDeliveryError(PublishError):
    """A :func:`produce_table` that did not get every acknowledgement: ``error`` is the first
    delivery report's ``KafkaError`` (None if none came), ``remaining`` the records still waiting
    when it gave up."""

    def __init__(self, message: str, *, error: Any = None, remaining: int = 0) -> None:
        self.error, self.remaining = error, remaining
        super().__init__(message)


def produce_table(
    producer: Any,
    table: pa.Table | pa.RecordBatch,
    topic: str | None,
    *,
    timeout: float = 60.0,
    on_error: Callable[[int, str], None] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> int:
    """Produce every row and wait for all delivery acks; raise :class:`KafkaDeliveryError` on any
    failure, or when ``give_up()`` turns true while waiting (a client error no wait can cure).

    Rows go in table order; per-key order holds because one producer sends a key's records to
    one partition in order (enable idempotence in the config to keep it across retries).
    """
    n = table.num_rows
    if n == 0:
        return 0
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers = table.column("headers").to_pylist() if "headers" in table.column_names else [None] * n
    topics = [topic] * n if topic else table.column("namespace").to_pylist()
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i in range(n):
        hs = headers[i]
        kwargs: dict[str, Any] = {"key": keys[i], "value": values[i], "on_delivery": delivered}
        if hs:
            kwargs["headers"] = [(h["key"], h["value"]) for h in hs]
        while True:
            try:
                producer.produce(topics[i], **kwargs)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: serve callbacks, then retry
        if i % 1000 == 999:
            producer.poll(0)
        if errors:
            break
    # Waited for in short slices, so that a failed delivery or ``give_up`` ends the wait early.
    deadline = time.monotonic() + timeout
    while True:
        remaining = producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
        if not remaining or errors or time.monotonic() >= deadline or (give_up is not None and give_up()):
            break
    if errors:
        raise KafkaDeliveryError(f"kafka delivery failed: {errors[0]}", error=errors[0], remaining=remaining)
    if remaining:
        within = f" within {timeout:.0f}s" if time.monotonic() >= deadline else ""
        raise KafkaDeliveryError(
            f"kafka delivery not acknowledged{within} ({remaining} records)", remaining=remaining
        )
    return int(n)


@dataclass(frozen=True)
class Produced(WriterCommitMessage):
    rows: int


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, Any]) -> None:
        self.conf = kafka_config(options)
        self.topic = option(options, "topic")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Produced:
        from confluent_kafka import Producer

        producer = Producer({"enable.idempotence": True, **self.conf})
        rows = 0
        for batch in iterator:
            rows += produce_table(producer, batch, self.topic)
        return Produced(rows)

    def commit(self, messages: list[Produced | None], batchId: int) -> None:  # type: ignore[override]
        """Nothing to do: every task waited for its acks before reporting success."""

    def abort(self, messages: list[Produced | None], batchId: int) -> None:  # type: ignore[override]
        """Records already acknowledged stay in the topic (at-least-once); the batch is replayed."""
