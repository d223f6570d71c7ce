"""Database outage: PostgreSQL restarted mid-run. The harvester backs off, reconnects and drains;
nothing is lost and per-key order holds. The server is the module's own (the shared one is never
restarted: other work uses it)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, OutboxRecord, Stasher
from sluiceway.harvest import LeaderAcquired
from sluiceway.testing import Broker, PrivatePostgres, wait_until
from tests.support.harvest import Recorder, kafka_config, started
from tests.support.order import check_per_key_order, read_topic
from tests.support.outbox import outbox_count, prepare_outbox

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(300)]


def test_postgres_restart_mid_run(server: PrivatePostgres, kafka: Broker, topic: str, tmp_path: Path) -> None:
    postgres_dsn = server.dsn()
    prepare_outbox(postgres_dsn)
    total, keys = 20_000, 50
    expected: dict[str, int] = {}
    with psycopg.connect(postgres_dsn) as conn:
        st = Stasher().prepare(conn)
        for i in range(total):
            key = f"key-{i % keys}"
            expected[key] = expected.get(key, 0) + 1
            st.stash(OutboxRecord(topic, key, f'{{"seq": {expected[key]}}}'))
    # NELI keeps leadership through the database outage, so this tests reconnection alone.
    cfg = kafka_config(
        postgres_dsn,
        kafka.bootstrap,
        f"outage-{topic}",
        election={"kind": "kafka"},
        leaderTopic=f"{topic}-leader",
        leaderGroupID=f"{topic}-g",
        limits={"ioErrorBackoff": "200ms", "heartbeatTimeout": "3s"},
    )
    recorder = Recorder()
    harvest = started(Harvest(cfg), recorder)
    try:
        wait_until(lambda: recorder.of(LeaderAcquired), timeout=30)
        wait_until(
            lambda: outbox_count(postgres_dsn) < total - 2000, timeout=30, message="harvesting to start"
        )
        server.restart("fast")
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=120, message="drain after the restart")
    finally:
        harvest.stop()
    messages = read_topic(kafka.bootstrap, topic, total)
    check_per_key_order([(k, s) for k, s, _ in messages], expected)
