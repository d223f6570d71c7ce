"""Smoke tests of the test rig itself: each real service answers."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluiceway.db import Database
from sluiceway.testing import Broker, wait_until


def test_postgres(postgres_dsn: str) -> None:
    with Database(postgres_dsn) as db:
        assert db.fetchone("SELECT current_database()")[0].startswith("sluice_")  # type: ignore[index]


def test_mysql(mysql_dsn: str) -> None:
    with Database(mysql_dsn) as db:
        assert db.fetchone("SELECT DATABASE()")[0].startswith("sluice_")  # type: ignore[index]


def test_sqlite(sqlite_dsn: str) -> None:
    with Database(sqlite_dsn) as db:
        assert db.fetchone("PRAGMA journal_mode")[0] == "wal"  # type: ignore[index]


def test_kafka_round_trip(kafka: Broker, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, key=b"k", value=b"v", partition=1)
    assert producer.flush(10) == 0
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "rig", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 1, 0)])
    try:
        msg = wait_until(lambda: consumer.poll(0.2), timeout=10, message="a message")
        assert (msg.key(), msg.value()) == (b"k", b"v")
    finally:
        consumer.close()


@pytest.mark.spark
def test_spark(spark) -> None:  # type: ignore[no-untyped-def]
    assert spark.range(10).selectExpr("sum(id)").first()[0] == 45
