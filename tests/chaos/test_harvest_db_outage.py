"""Database outage: PostgreSQL restarted mid-run. The harvester backs off, reconnects and drains;
nothing is lost and per-key order holds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, OutboxRecord, Stasher
from sluiceway.harvest import LeaderAcquired
from sluiceway.testing import Broker, wait_until
from tests.support.harvest import Recorder, kafka_config, started
from tests.support.order import check_per_key_order, read_topic
from tests.support.outbox import outbox_count, prepare_outbox

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(300)]


def restart_postgres() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.skipif(not os.path.isdir("/etc/postgresql"), reason="needs a local pg_ctlcluster-managed server")
def test_postgres_restart_mid_run(postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path) -> None:
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
        restart_postgres()
        wait_until(lambda: outbox_count(postgres_dsn) == 0, timeout=120, message="drain after the restart")
    finally:
        harvest.stop()
    messages = read_topic(kafka.bootstrap, topic, total)
    check_per_key_order([(k, s) for k, s, _ in messages], expected)
