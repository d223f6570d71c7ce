"""Three ``sluice capture`` processes on one slot under a writer (inserts, updates, deletes over 200
keys): the leader killed with kill -9 twice and PostgreSQL restarted once. Per key, what a
consumer sees is in order apart from re-sent tails, nothing committed is missing, and the last
state of every key is the table's; into NATS, JetStream's de-duplication leaves no re-send."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from sluiceway.testing import Broker, PrivatePostgres, free_port, wait_until
from tests.support.brokers import make_place
from tests.support.capture import SCHEMA, ItemsWriter, check_changes, config, parse, read_kafka, source_rows
from tests.support.cdc import slot_confirmed, wal_now

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
_LEADER = re.compile(r"^sluice_capture_leader\{[^}]*\} 1\.0$", re.M)


class Processes:
    """``sluice capture -f FILE`` processes, each with its metrics endpoint (to tell the leader)."""

    def __init__(self, spec: Path, logs: Path) -> None:
        self.spec, self.logs = spec, logs
        self.procs: list[tuple[int, subprocess.Popen[bytes]]] = []
        self.started = 0

    def start(self) -> None:
        port = free_port()
        self.started += 1
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.logs / f"capture{self.started}.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sluiceway.cli.main", "capture", "-f", str(self.spec),
                 "--metrics-addr", f"127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self.procs.append((port, proc))

        def up() -> bool:  # past its start-up checks: serving metrics
            assert proc.poll() is None, f"capture{self.started} exited: see its log"
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=60, message=f"capture{self.started} to start")

    def leader(self) -> int | None:
        leaders = []
        for port, proc in self.procs:
            if proc.poll() is not None:
                continue
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
            except httpx.HTTPError:
                continue
            if _LEADER.search(text):
                leaders.append(port)
        assert len(leaders) <= 1, f"two processes capture at once: {leaders}"
        return leaders[0] if leaders else None

    def kill_leader(self) -> None:
        port = wait_until(self.leader, timeout=60, message="a leader")
        proc = next(p for at, p in self.procs if at == port and p.poll() is None)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def alive(self) -> list[int]:
        return [p.pid for _, p in self.procs if p.poll() is None]


def run_chaos(
    dsn: str, slot: str, destination: dict[str, Any], tmp: Path, pg: PrivatePostgres
) -> ItemsWriter:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO items SELECT g, g, 'seed' FROM generate_series(1, 200) g")
    cfg = config(dsn, slot, tmp / "state", **destination)
    spec = tmp / "capture.yaml"
    spec.write_text(yaml.safe_dump(cfg))
    procs = Processes(spec, tmp)
    writer = ItemsWriter(dsn, pace=0.003)
    confirmed: Callable[[], int] = lambda: slot_confirmed(dsn, slot)  # noqa: E731
    try:
        for _ in range(3):
            procs.start()
        wait_until(procs.leader, timeout=60, message="a leader")
        wait_until(lambda: confirmed() > 0, timeout=30, message="the slot")
        writer.start()
        for _ in range(2):
            wait_until(lambda: writer.ops > 0, timeout=10)
            time.sleep(2.5)  # changes flow; then the leader dies mid-stream
            procs.kill_leader()
            dead_at = wal_now(dsn)
            procs.start()  # keep three
            wait_until(lambda: confirmed() >= dead_at, timeout=60, message="a standby to take over")  # noqa: B023
        pg.restart("fast")
        back_at = wal_now(dsn)
        wait_until(
            lambda: confirmed() >= back_at, timeout=90, message="the capture to resume after the restart"
        )
        time.sleep(2)
        writer.finish()
        target = wal_now(dsn)
        wait_until(lambda: confirmed() >= target, timeout=120, message="the capture to catch up")
        assert len(procs.alive()) == 3, "a capture process died"
    finally:
        writer.stop_event.set()
        procs.stop()
    return writer


def test_kafka_three_processes_kill_9_twice_and_a_server_restart(
    cdc_dsn: str, kafka: Broker, tmp_path: Path, logical_pg: PrivatePostgres
) -> None:
    topic = kafka.create_topic(f"cdc-chaos-{time.time_ns()}", partitions=3)
    destination = {"kafka": {"bootstrap.servers": kafka.bootstrap}, "topic": topic}
    writer = run_chaos(cdc_dsn, "chaos_kafka", destination, tmp_path, logical_pg)
    changes = read_kafka(kafka.bootstrap, topic)
    check_changes(changes, writer, source_rows(cdc_dsn))
    assert writer.ops > 1000


def test_nats_three_processes_kill_9_twice_and_a_server_restart_no_duplicate(
    cdc_dsn: str, tmp_path: Path, logical_pg: PrivatePostgres
) -> None:
    place = make_place("nats")
    try:
        destination = {"target": place.target(), "topic": f"{place.prefix}.{{table}}"}
        writer = run_chaos(cdc_dsn, "chaos_nats", destination, tmp_path, logical_pg)
        seen = [parse(k, v, h) for k, v, h in place.read()]
        check_changes(seen, writer, source_rows(cdc_dsn))
        assert len({c.sid for c in seen}) == len(seen), "a re-send passed JetStream's de-duplication"
    finally:
        place.cleanup()
