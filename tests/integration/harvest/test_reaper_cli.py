"""`reaper -f reaper.yaml` with goharvest's own file (only addresses changed), metrics, SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import Broker, free_port, wait_until
from tests.chaos.harness import outbox_count
from tests.integration.harvest.test_publish import consume
from tests.unit.test_config import GOHARVEST_YAML

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def test_goharvest_reaper_yaml_runs_and_stops_cleanly_on_sigterm(
    postgres_dsn: str, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    with Database(postgres_dsn) as db:
        init_outbox(db)
    with psycopg.connect(postgres_dsn) as conn:
        st = Stasher().prepare(conn)
        for i in range(200):
            st.stash(OutboxRecord(topic, f"k{i % 10}", str(i)))
    text = (
        GOHARVEST_YAML.replace("localhost:9092", kafka.bootstrap)
        .replace(
            "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable", postgres_dsn
        )
        .replace("my-app-name", f"reaper-{topic}")
        .replace("level: Debug", "level: Info")
    )
    config = tmp_path / "reaper.yaml"
    config.write_text(text)
    metrics_port = free_port()
    reaper = shutil.which("reaper", path=os.path.dirname(sys.executable)) or "reaper"
    log = tmp_path / "reaper.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [reaper, "-f", str(config), "--metrics-addr", f"127.0.0.1:{metrics_port}"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: outbox_count(postgres_dsn) == 0, timeout=60, message="the reaper to drain the outbox"
        )

        def scraped() -> bool:
            try:
                body = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).text
            except httpx.HTTPError:
                return False
            return 'sluice_harvest_leader{harvest="sluiceway"} 1.0' in body

        wait_until(scraped, timeout=10, message="metrics to show leadership")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert "received SIGTERM" in output and "harvester stopped" in output
    assert "LeaderRevoked" in output
    # A goharvest file loaded unchanged publishes what goharvest would: no sequence headers.
    msgs = consume(kafka.bootstrap, topic, 200)
    assert all(not m.headers() for m in msgs)  # type: ignore[attr-defined]


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "reaper.yaml"
    config.write_text(GOHARVEST_YAML.replace("sendBuffer: 10", "sendBufer: 10"))
    result = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "reap", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "harvest.limits.sendBufer: unknown key" in result.stderr
    assert "Traceback" not in result.stderr
