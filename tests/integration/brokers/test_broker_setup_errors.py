"""Broker set-up mistakes stop `sluice reap` at once, with one line; trouble after a good start is
retried with backoff and a rate-limited warning.

* start-up: a NATS, RabbitMQ or Redis server that is not there (once ``startupTimeout`` has
  passed), a JetStream stream that is missing, a wrong RabbitMQ password, a missing exchange, an
  unknown target type or key — each is exit 1 and one line on stderr naming the broker, the
  server and what is wrong; the harvester never campaigns and the outbox rows stay as they were
  (unmarked);
* run time: NATS cut away after a good start — the deliveries in flight fail after
  ``deliveryTimeout`` and their rows are reset (not a silent stall), the retries warn once per
  interval, and everything is published once the broker is back.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway import Harvest, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.errors import BrokerError
from sluiceway.harvest import HarvestConfig, MeterRead
from sluiceway.outbox import init_outbox
from sluiceway.testing import free_port, wait_until
from tests.support.brokers import AMQP_URL, NATS_URL, PORTS, CuttableProxy, Place
from tests.support.harvest import Recorder, started

pytestmark = [pytest.mark.brokers, pytest.mark.timeout(120)]

ROWS = 3


def sqlite_outbox(path: Path, topic: str = "orders.created", rows: int = ROWS) -> str:
    """An SQLite outbox holding ``rows`` records; its DSN."""
    dsn = f"sqlite:///{path}"
    with Database(dsn) as db:
        init_outbox(db)
    stash(path, topic, range(rows))
    return dsn


def stash(path: Path, topic: str, numbers: range) -> None:
    conn = sqlite3.connect(path)
    try:
        batch = Stasher().prepare(conn)
        for i in numbers:
            batch.stash(OutboxRecord(topic, f"k{i}", str(i)))
        conn.commit()
    finally:
        conn.close()


def rows(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, leader_id FROM outbox ORDER BY id").fetchall()
    finally:
        conn.close()


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def reap(tmp_path: Path, target: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`sluice reap -f reaper.yaml` on a fresh SQLite outbox, as a user runs it."""
    db = tmp_path / "app.db"
    config = tmp_path / "reaper.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "harvest": {
                    "name": "setup-errors",
                    "dataSource": sqlite_outbox(db),
                    "target": target,
                    "startupTimeout": "1s",  # a broker out of reach is waited for this long
                }
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "reap", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=30,  # the start-up check is bounded by startupTimeout plus a connectTimeout (5 s)
        cwd=tmp_path,
    )
    return result, db


def unknown_stream() -> str:
    return f"SLUICEMISSING{uuid.uuid4().hex[:8].upper()}"


DEAD_PORT = free_port()  # nothing listens there

CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "nats unreachable": (
        {"type": "nats", "servers": [f"nats://127.0.0.1:{DEAD_PORT}"]},
        [f"nats: connect 'nats://127.0.0.1:{DEAD_PORT}' failed: cannot connect: Connection refused"],
    ),
    "jetstream stream missing": (
        {"type": "nats", "servers": [NATS_URL], "stream": "<stream>"},
        ["nats: check stream '<stream>' failed: no such JetStream stream on nats://127.0.0.1:4222"],
    ),
    "rabbitmq wrong password": (
        {"type": "rabbitmq", "url": "amqp://guest:not-the-password@127.0.0.1:5672/"},
        [
            "rabbitmq: connect 'amqp://guest:***@127.0.0.1:5672/' failed: authentication failed",
            "ACCESS_REFUSED",
        ],
    ),
    "rabbitmq unreachable": (  # aiormq's own ERROR line about it is left out: one line
        {"type": "rabbitmq", "url": f"amqp://guest:guest@127.0.0.1:{DEAD_PORT}/"},
        [f"rabbitmq: connect 'amqp://guest:***@127.0.0.1:{DEAD_PORT}/' failed: Connection refused"],
    ),
    "rabbitmq exchange missing": (
        {"type": "rabbitmq", "url": AMQP_URL, "exchange": "<stream>"},
        ["rabbitmq: check exchange '<stream>' failed: not found", "no exchange '<stream>'", "127.0.0.1:5672"],
    ),
    "redis unreachable": (
        {"type": "redis", "url": f"redis://127.0.0.1:{DEAD_PORT}/0"},
        [
            f"redis: connect 'redis://127.0.0.1:{DEAD_PORT}/0' failed: cannot connect",
            f"127.0.0.1:{DEAD_PORT}",
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broker_set_up_mistake_stops_start_up_with_one_line(case: str, tmp_path: Path) -> None:
    target, expected = CASES[case]
    name = unknown_stream()
    target = {k: (v.replace("<stream>", name) if isinstance(v, str) else v) for k, v in target.items()}
    result, db = reap(tmp_path, target)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("error: cannot start: "), line
    for fragment in expected:
        assert fragment.replace("<stream>", name) in line, line
    assert "not-the-password" not in line
    assert "Traceback" not in result.stderr
    # Never campaigned (no lease table made), nothing marked.
    assert rows(db) == [(i, None) for i in range(1, ROWS + 1)]
    assert "sluiceway_leases" not in tables(db)


def test_a_stream_created_as_docs_harvester_md_shows_passes_the_start_up_check(tmp_path: Path) -> None:
    import asyncio

    import nats

    stream = unknown_stream()
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": sqlite_outbox(tmp_path / "app.db"),
                "target": {"type": "nats", "servers": [NATS_URL], "stream": stream},
            }
        }
    )
    with pytest.raises(BrokerError, match=f"no such JetStream stream on {NATS_URL}"):
        Harvest(config).check_destination()

    async def admin(create: bool) -> None:
        nc = await nats.connect(NATS_URL)
        try:
            js = nc.jetstream()
            if create:  # as docs/harvester.md shows it, with this test's own name and subjects
                await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
            else:
                await js.delete_stream(stream)
        finally:
            await nc.close()

    asyncio.run(admin(create=True))
    try:
        Harvest(config).check_destination()
    finally:
        asyncio.run(admin(create=False))


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            {"type": "nat", "servers": [NATS_URL]},
            "harvest.target.type: unknown target type 'nat'; expected one of nats, rabbitmq, redis",
        ),
        (
            {"type": "nats", "server": NATS_URL},
            "harvest.target.server: unknown key (not a recognised setting; check its spelling and "
            "indentation)",
        ),
        ({"servers": [NATS_URL]}, "harvest.target.type: required but missing"),
    ],
)
def test_a_mistyped_target_names_the_file_and_the_key_as_written(
    target: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    result, db = reap(tmp_path, target)
    assert result.returncode == 1
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: {tmp_path / 'reaper.yaml'}: invalid configuration: {expected}"
    ]
    assert rows(db) == [(i, None) for i in range(1, ROWS + 1)]


# nats-py leaves the socket of a connection the cut proxy refused half-way for the garbage
# collector to close (as in test_harvest_targets.py).
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("place", ["nats"], indirect=True)
def test_nats_lost_after_a_good_start_resets_in_flight_deliveries_and_warns_at_a_limited_rate(
    place: Place, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.brokers")
    db = tmp_path / "app.db"
    topic = place.topic("orders")
    dsn = sqlite_outbox(db, topic)
    proxy = CuttableProxy(PORTS["nats"])
    target = place.target(
        proxy.url("nats"), deliveryTimeout="2s", ackTimeout="1s", connectTimeout="1s", maxBackoff="500ms"
    )
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "name": f"setup-{place.prefix}",
                "dataSource": dsn,
                "target": target,
                "limits": {"heartbeatTimeout": "2s", "minMetricsInterval": "200ms"},
            }
        }
    )
    recorder = Recorder()
    harvest = Harvest(config)
    try:
        harvest.check_destination()  # passes: the stream is there, through the proxy
        started(harvest, recorder)
        wait_until(lambda: not rows(db), timeout=30, message="the first records to be published")
        proxy.cut()
        stash(db, topic, range(ROWS, 2 * ROWS))
        # Refused reconnects, then the deliveries' timeout: their rows are reset, not left in flight.
        wait_until(
            lambda: sum(e.stats.reset for e in recorder.of(MeterRead)) >= 1,
            timeout=30,
            message="in-flight deliveries to be reset after deliveryTimeout",
        )
        refused = proxy.refused
        assert refused >= 3, "the sender should have tried to reconnect several times"
        proxy.restore()
        wait_until(lambda: not rows(db), timeout=30, message="the outbox to drain once NATS is back")
    finally:
        harvest.stop()
        proxy.close()
    retry_warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "not acknowledged" in r.getMessage()
    ]
    # Each refused attempt is a retry; the warnings come at most one per 10 s (the whole outage
    # here lasts a few seconds): the first at once, the rest held back and counted.
    assert 1 <= len(retry_warnings) <= 2, [r.getMessage() for r in retry_warnings]
    assert any("acknowledged again" in r.getMessage() for r in caplog.records)
    seen = place.read(topic)
    assert sorted(value for _, value, _ in seen) == [str(i).encode() for i in range(2 * ROWS)]
