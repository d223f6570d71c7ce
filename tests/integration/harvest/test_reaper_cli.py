"""`reaper -f reaper.yaml` with goharvest's own file (only addresses changed), metrics, SIGTERM; the
start-up check of the outbox database, goharvest's DSN trap, and an unreachable broker."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.outbox import init_outbox
from sluiceway.testing import Broker, free_port, wait_until
from tests.support.harvest import GOHARVEST_YAML
from tests.support.order import consume
from tests.support.outbox import outbox_count

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


@contextlib.contextmanager
def reaper_process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A reaper process with its stdout and stderr in ``log``; killed if a test leaves it running."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
    with reaper_process(
        [reaper, "-f", str(config), "--metrics-addr", f"127.0.0.1:{metrics_port}"], log
    ) as proc:
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


# --- start-up: the outbox database is checked first; Kafka trouble is reported, not sprayed ---------
def reap(config: Path, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "reap", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def reaper_yaml(
    path: Path, data_source: str, *, table: str = "outbox", level: str = "Info", bootstrap: str = ""
) -> Path:
    harvest = {
        # By default nothing listens there: the outbox is checked first, so its problems are said
        # at once; past them, the start-up check waits startupTimeout for Kafka.
        "baseKafkaConfig": {"bootstrap.servers": bootstrap or f"127.0.0.1:{free_port()}"},
        "dataSource": data_source,
        "outboxTable": table,
        "election": {"kind": "database"},
        "startupTimeout": "2s",
    }
    path.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": level}}))
    return path


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_an_unreachable_outbox_database_stops_start_up_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=app connect_timeout=2"
    result = reap(reaper_yaml(tmp_path / "reaper.yaml", dsn))
    assert result.returncode == 1
    (line,) = stderr_lines(result)
    assert line.startswith(
        f"error: cannot start: PostgreSQL at 127.0.0.1:{port} unreachable for 2 s "
        "(cannot connect to host=127.0.0.1"
    ), line
    assert "Connection refused" in line and line.endswith("; set startupTimeout to wait longer"), line


def test_a_missing_outbox_table_stops_start_up_with_one_line_naming_the_database(tmp_path: Path) -> None:
    db_file = tmp_path / "app.db"
    result = reap(reaper_yaml(tmp_path / "reaper.yaml", f"sqlite:///{db_file}"))
    assert result.returncode == 1
    assert stderr_lines(result) == [
        f"error: cannot start: outboxTable: outbox table 'outbox' does not exist in sqlite database "
        f"'{db_file}' (create it with `sluice outbox init`)"
    ]


def goharvest_style(postgres_dsn: str, password: str) -> str:
    """``postgres_dsn`` written as goharvest's sample writes one, with ``password`` as given."""
    params = conninfo_to_dict(postgres_dsn)
    if params.get("password"):
        pytest.skip("the test server needs a password: the empty-password sample cannot connect")
    host, port, user, dbname = params["host"], params["port"], params["user"], params["dbname"]
    return f"host={host} port={port} user={user} {password} dbname={dbname}"


@pytest.fixture
def table(postgres_dsn: str) -> str:
    """An outbox of this test's own in the module's PostgreSQL database."""
    name = f"outbox_{uuid.uuid4().hex[:8]}"
    with Database(postgres_dsn) as db:
        init_outbox(db, name)
    return name


def test_goharvests_dsn_trap_is_named_and_so_is_the_database_it_reached(
    postgres_dsn: str, table: str, tmp_path: Path
) -> None:
    # goharvest's "password= dbname=…": libpq reads "dbname=…" as the password and connects to the
    # database named after the user, where this test's outbox table is not.
    result = reap(
        reaper_yaml(tmp_path / "reaper.yaml", goharvest_style(postgres_dsn, "password="), table=table)
    )
    assert result.returncode == 1
    warning, error = stderr_lines(result)
    assert "WARNING sluiceway.harvest: dataSource: password= is empty but followed by a space" in warning
    assert "write password='' or leave password out" in warning
    user = conninfo_to_dict(postgres_dsn)["user"]
    assert error == (
        f"error: cannot start: outboxTable: outbox table '{table}' does not exist in postgres database "
        f"'{user}' (create it with `sluice outbox init`)"
    )


def test_an_unreachable_broker_is_a_warning_every_ten_seconds_not_a_flood(
    postgres_dsn: str, table: str, tmp_path: Path
) -> None:
    # A broker of its own, there for the start-up check and gone once the harvester leads.
    broker = Broker(log_path=str(tmp_path / "tansu.log")).start()
    try:
        config = reaper_yaml(
            tmp_path / "reaper.yaml",
            goharvest_style(postgres_dsn, "password=''"),
            table=table,
            bootstrap=broker.bootstrap,
        )
        log = tmp_path / "reaper.log"
        started = time.monotonic()
        args = [sys.executable, "-m", "sluiceway.cli.main", "reap", "-f", str(config)]
        with reaper_process(args, log) as proc:
            wait_until(lambda: "leading: marking" in log.read_text(), timeout=60, message="leadership")
            broker.stop()
            # Leading, with a publisher whose broker connections are refused every ~50 ms. The
            # client first sees the broker go (a disconnect), then its reconnects refused: watch
            # until the first refusal is logged, then a few seconds of them.
            wait_until(lambda: "Connection refused" in log.read_text(), timeout=60, message="a refusal")
            time.sleep(3)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    finally:
        broker.stop()
    ran_for = time.monotonic() - started
    lines = log.read_text().splitlines()
    dbname = conninfo_to_dict(postgres_dsn)["dbname"]
    assert any(f"outbox {table} found in postgres database '{dbname}'" in line for line in lines)
    refused = [line for line in lines if "Connection refused" in line]
    assert not [line for line in lines if line.startswith("%")], "librdkafka wrote to stderr itself"
    # One line when the trouble starts, one per 10 s after that, one with the count at shutdown
    # (unthrottled, librdkafka writes ~20 lines a second per client).
    assert 1 <= len(refused) <= 2 + int(ran_for // 10), "\n".join(refused)
    assert "held back since the last one" in lines[-2]
