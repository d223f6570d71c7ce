"""A sink's destination that goes away mid-run, with the real clients and servers (no mocks): the
write stops saying the destination is unreachable, blames no record and replays none one at a
time (issue 21, item 4). Driven through ``write_part``, the code a Spark task runs, without Spark."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from sluiceway.config.brokers import RedisSettings
from sluiceway.pipeline.failures import RetryPolicy
from sluiceway.pipeline.sinks.brokers import BrokerSink
from sluiceway.pipeline.sinks.files import FileSink
from sluiceway.pipeline.sinks.kafka import KafkaSink
from sluiceway.pipeline.sinks.part import PartResult, write_part
from sluiceway.testing import Broker
from tests.support.brokers import PORTS, REDIS_URL, CuttableProxy

pytestmark = pytest.mark.timeout(120)

#: Short waits: the outage is given up after a second (the default is a minute).
POLICY = RetryPolicy(attempts=3, backoff=0.05, max_backoff=0.2, record_attempts=2, outage=1.0)


def records(n: int, first: int = 0) -> pa.Table:
    offsets = list(range(first, first + n))
    return pa.table(
        {
            "offset": offsets,
            "namespace": ["orders"] * n,
            "key": [f"k{i % 3}" for i in offsets],
            "value": [f'{{"n": {i}}}'.encode() for i in offsets],
        }
    )


def write(writer: object, table: pa.Table, batch: int) -> PartResult:
    return write_part(
        table,
        part=0,
        sink="out",
        writer=writer,
        dead_writer=None,
        policy=POLICY,
        run="r",
        batch=batch,  # type: ignore[arg-type]
    )


def assert_no_record_blamed(result: PartResult, *words: str) -> None:
    assert not result.ok
    assert result.failed_offset is None and result.written == 0
    assert (result.last, result.rank) == (None, 0)  # resumes from the first record of the batch
    assert result.error is not None and result.error.startswith("destination unreachable: "), result.error
    for word in words:
        assert word in result.error


# --- kafka -------------------------------------------------------------------------------------
@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[Broker]:
    """A broker of this test's own, to stop (the session's is shared)."""
    broker = Broker(log_path=str(tmp_path / "tansu.log")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.kafka
def test_a_kafka_sink_whose_broker_goes_away_blames_no_record(private_kafka: Broker) -> None:
    topic = private_kafka.create_topic("out", partitions=1)
    # Deliveries time out after 3 s with the broker gone (librdkafka's default is five minutes).
    sink = KafkaSink(topic, {"bootstrap.servers": private_kafka.bootstrap, "message.timeout.ms": "3000"})
    try:
        assert write(sink, records(3), batch=0).ok  # reachable: written
        private_kafka.stop()
        result = write(sink, records(3, first=3), batch=1)
    finally:
        sink.close()
    assert_no_record_blamed(result, f"kafka {private_kafka.bootstrap}: ")


@pytest.mark.kafka
def test_a_kafka_producer_is_kept_for_the_next_task_but_never_after_a_failed_write(
    private_kafka: Broker,
) -> None:
    """Each Spark task makes its writer and closes it; the producer outlives it (a new idempotent
    producer waits half a second for its id), unless the write failed."""
    topic = private_kafka.create_topic("kept", partitions=1)
    config = {"bootstrap.servers": private_kafka.bootstrap, "message.timeout.ms": "3000"}
    used: list[object] = []

    def task(batch: int) -> PartResult:
        sink = KafkaSink(topic, config)
        try:
            result = write(sink, records(3, first=3 * batch), batch=batch)
            used.append(sink._client)
            return result
        finally:
            sink.close()

    assert task(0).ok and task(1).ok
    assert used[1] is used[0]  # the second task's writer took the first one's producer
    private_kafka.stop()
    assert not task(2).ok
    assert_no_record_blamed(task(3), f"kafka {private_kafka.bootstrap}: ")
    assert used[2] is None and used[3] is None  # a failed write drops its producer...
    other = KafkaSink(topic, config)
    try:
        assert other._open() is not used[0]  # ...and it is never handed out again
    finally:
        other._drop()


# --- a broker sink (Redis) behind a proxy that is cut ---------------------------------------------
@pytest.fixture
def stream() -> Iterator[str]:
    import redis

    name = f"sluice-test-outage-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(name)
    client.close()


def test_a_redis_sink_whose_server_goes_away_blames_no_record(stream: str) -> None:
    import redis

    proxy = CuttableProxy(PORTS["redis"])
    settings = RedisSettings.model_validate(
        {
            "url": proxy.url("redis"),
            "deliveryTimeout": "1s",
            "ackTimeout": "500ms",
            "connectTimeout": "500ms",
            "maxBackoff": "200ms",
        }
    )
    sink = BrokerSink(settings, stream)
    try:
        assert write(sink, records(3), batch=0).ok
        proxy.cut()
        result = write(sink, records(3, first=3), batch=1)
    finally:
        sink.close()
        proxy.close()
    assert_no_record_blamed(result, f"redis redis://127.0.0.1:{proxy.port}/0: ")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert client.xlen(stream) == 3  # only the first batch: nothing of the cut one
    finally:
        client.close()


# --- a file sink whose directory it may not write --------------------------------------------------
@pytest.fixture
def forbidden_dir() -> Iterator[str]:
    """A directory this process may not create files in (root may write anywhere, but not /sys)."""
    if os.geteuid() == 0:
        yield f"/sys/sluice-test-{uuid.uuid4().hex[:8]}/lake"
        return
    with tempfile.TemporaryDirectory() as tmp:
        locked = Path(tmp) / "lake"
        locked.mkdir(mode=0o500)
        yield str(locked)
        locked.chmod(0o700)


def test_a_file_sink_denied_its_directory_stops_at_once_blaming_no_record(forbidden_dir: str) -> None:
    sink = FileSink(forbidden_dir, "parquet", staged=True)  # as a Spark task writes it
    result = write(sink, records(3), batch=0)
    assert_no_record_blamed(result)
    assert ("Permission denied" in result.error) or ("Operation not permitted" in result.error)  # type: ignore[operator]
