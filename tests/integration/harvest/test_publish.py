"""What lands in Kafka is exactly what was in the row; optional columns work; poison records are
dead-lettered while other keys keep flowing."""

from __future__ import annotations

import psycopg
import pytest

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.harvest import Harvest, RecordDeadLettered
from sluiceway.outbox import init_outbox
from sluiceway.testing import Broker, wait_until
from tests.support.harvest import Recorder, kafka_config, started
from tests.support.order import consume
from tests.support.outbox import outbox_count, user_connection

pytestmark = pytest.mark.kafka


@pytest.fixture
def fresh_outbox(postgres_dsn: str) -> str:
    with Database(postgres_dsn) as db:
        db.execute("DROP TABLE IF EXISTS outbox_dead")
        db.execute("DROP TABLE IF EXISTS outbox")
    return postgres_dsn


def test_key_value_headers_exact_and_tombstone(fresh_outbox: str, kafka: Broker, topic: str) -> None:
    dsn = fresh_outbox
    with Database(dsn) as db:
        init_outbox(db)
    with psycopg.connect(dsn) as conn:
        st = Stasher().prepare(conn)
        st.stash(OutboxRecord(topic, "k1", '{"a": "é"}', [("h1", "v1"), ("h1", "v2"), ("empty", "")]))
        st.stash(OutboxRecord(topic, "k1"))
    harvest = started(Harvest(kafka_config(dsn, kafka.bootstrap, topic)), Recorder())
    try:
        msgs = consume(kafka.bootstrap, topic, 2)
    finally:
        harvest.stop()
    first, second = sorted(msgs, key=lambda m: m.offset())  # type: ignore[attr-defined]
    assert first.key() == b"k1" and first.value() == '{"a": "é"}'.encode()  # type: ignore[attr-defined]
    headers = first.headers()  # type: ignore[attr-defined]
    assert headers[:3] == [("h1", b"v1"), ("h1", b"v2"), ("empty", b"")]
    # A sluiceway configuration: the sequence headers follow the row's own.
    assert headers[3] == ("sluice-id", b"1") and headers[4][0] == "sluice-leader"
    assert second.value() is None  # tombstone  # type: ignore[attr-defined]
    assert outbox_count(dsn) == 0


def test_partition_column_and_binary_values(fresh_outbox: str, kafka: Broker, topic: str) -> None:
    dsn = fresh_outbox
    with Database(dsn) as db:
        init_outbox(db, partition_column=True, binary_value=True)
    with psycopg.connect(dsn) as conn:
        st = Stasher(binary_value=True).prepare(conn)
        st.stash(OutboxRecord(topic, "pinned", b"\x00\xff\x10", partition=2))
        st.stash(OutboxRecord(topic, "pinned", b"\x01", partition=0))
        st.stash(OutboxRecord(topic, "by-key", b"\x02", partition=-1))
    harvest = started(Harvest(kafka_config(dsn, kafka.bootstrap, topic)), Recorder())
    try:
        msgs = consume(kafka.bootstrap, topic, 3)
    finally:
        harvest.stop()
    by_value = {m.value(): m.partition() for m in msgs}  # type: ignore[attr-defined]
    assert by_value[b"\x00\xff\x10"] == 2 and by_value[b"\x01"] == 0
    assert b"\x02" in by_value


@pytest.mark.parametrize("dialect", ["postgres", "sqlite", "mysql"])
def test_oversized_and_invalid_topic_go_to_dead_letters(
    dialect: str, request: pytest.FixtureRequest, kafka: Broker, topic: str
) -> None:
    dsn = str(request.getfixturevalue(f"{dialect}_dsn"))
    with Database(dsn) as db:
        init_outbox(db)
        db.execute("DELETE FROM outbox")
        db.execute("DELETE FROM outbox_dead")
    conn = user_connection(dsn)
    st = Stasher().prepare(conn)
    for i in range(30):
        st.stash(OutboxRecord(topic, f"key-{i % 3}", f"small-{i}"))
        if i == 10:
            st.stash(OutboxRecord(topic, "key-0", "x" * 9000))  # over the producer's message.max.bytes
    conn.commit()
    # A writer that bypasses the stasher can still insert a topic Kafka rejects.
    with Database(dsn) as db:
        keys = "'[\"h\"]'" if dialect != "postgres" else "ARRAY['h']"
        now = {"postgres": "now()", "sqlite": "'2026-11-25T00:00:00Z'", "mysql": "UTC_TIMESTAMP(6)"}[dialect]
        db.execute(
            f"INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
            f"kafka_header_values) VALUES ({now}, 'no such topic!', 'key-1', 'v', {keys}, {keys})"
        )
    conn.close()
    recorder = Recorder()
    cfg = kafka_config(
        dsn,
        kafka.bootstrap,
        f"{topic}-{dialect}",
        producerKafkaConfig={"message.max.bytes": 5000},
        deadLetter={"parkKey": False},  # the key goes on without its poison record
    )
    harvest = started(Harvest(cfg), recorder)
    try:
        msgs = consume(kafka.bootstrap, topic, 30)
        wait_until(lambda: outbox_count(dsn) == 0, timeout=20)
    finally:
        harvest.stop()
    assert sorted(m.value().decode() for m in msgs) == sorted(f"small-{i}" for i in range(30))  # type: ignore[attr-defined]
    with Database(dsn) as db:
        dead = db.fetchall("SELECT kafka_topic, kafka_key, error, attempts FROM outbox_dead ORDER BY id")
    assert [(d[0], d[1]) for d in dead] == [(topic, "key-0"), ("no such topic!", "key-1")]
    assert "MSG_SIZE_TOO_LARGE" in dead[0][2] and "invalid topic" in dead[1][2]
    assert len(recorder.of(RecordDeadLettered)) == 2
