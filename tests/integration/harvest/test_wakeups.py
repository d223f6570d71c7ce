"""Harvester wake-ups on a real PostgreSQL: ``sluice outbox init --notify`` adds the trigger, an
idle harvester waits on LISTEN instead of polling, a new row wakes it, and a LISTEN connection
killed by the server is reopened with a catch-up mark. The idle poll is set far beyond every wait
here, so each pick-up below came from a notification (or the catch-up), never from the timer."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, HarvestConfig, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.errors import ConfigError
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.outbox.store import SqlOutboxStore
from sluiceway.testing import wait_until
from tests.support.outbox import user_connection

IDLE_POLL = "120s"


def stash(dsn: str, key: str) -> None:
    """One row, committed by an application connection (the trigger fires on its INSERT)."""
    conn = user_connection(dsn)
    try:
        Stasher().prepare(conn).stash(OutboxRecord("orders", key, "v"))
        conn.commit()
    finally:
        conn.close()


def journal_keys(path: Path) -> list[str]:
    if not path.exists():
        return []
    with Journal.open(path, read_only=True) as journal:
        return [r.key for r in journal.read()]


@pytest.fixture
def marks(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the real store marked (the SQL statement still runs: this only counts the calls)."""
    times: list[float] = []
    mark = SqlOutboxStore.mark

    def counted(self: SqlOutboxStore, leader_id: str, limit: int):  # type: ignore[no-untyped-def]
        times.append(time.monotonic())
        return mark(self, leader_id, limit)

    monkeypatch.setattr(SqlOutboxStore, "mark", counted)
    return times


@pytest.fixture
def harvest(postgres_dsn: str, tmp_path: Path) -> Iterator[tuple[Harvest, Path]]:
    with Database(postgres_dsn) as db:
        layout = init_outbox(db, notify=True)
        assert init_outbox(db, notify=True).notify and layout.notify  # idempotent
        db.execute("DELETE FROM outbox")
    journal = tmp_path / "journal"
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": postgres_dsn,
                "journal": {"path": str(journal)},
                "limits": {"idlePoll": IDLE_POLL, "minMetricsInterval": "600s"},
            }
        }
    )
    with Harvest(config) as running:
        wait_until(lambda: running.is_leader, timeout=30, message="leadership")
        yield running, journal


def test_an_idle_harvester_listens_and_a_new_row_wakes_it(
    marks: list[float], harvest: tuple[Harvest, Path], postgres_dsn: str
) -> None:
    # ``marks`` before ``harvest``: the count is in place before the harvester starts. After it,
    # the harvester's one mark at start-up could come first, and then (idle, listening) no other.
    _, journal = harvest
    wait_until(lambda: len(marks) > 0, timeout=10)
    time.sleep(0.5)
    before = len(marks)
    time.sleep(1.5)
    assert len(marks) - before <= 1, "idle with the trigger: no polling (markBackoff is 10 ms)"
    stash(postgres_dsn, "woken")
    wait_until(lambda: journal_keys(journal) == ["woken"], timeout=20, message="the wake-up")


def test_a_killed_listen_connection_is_reopened_and_nothing_is_missed(
    harvest: tuple[Harvest, Path], postgres_dsn: str
) -> None:
    _, journal = harvest
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        # The listener's connection sits idle after its LISTEN statement.
        killed = wait_until(
            lambda: admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
            ).fetchall(),
            timeout=10,
            message="the LISTEN connection",
        )
        assert killed and all(row[0] for row in killed)
    stash(postgres_dsn, "after-kill")
    wait_until(lambda: "after-kill" in journal_keys(journal), timeout=20, message="the catch-up")
    # Listening again: a later row is a wake-up too.
    stash(postgres_dsn, "later")
    wait_until(lambda: journal_keys(journal)[-1:] == ["later"], timeout=20, message="the next wake-up")


def test_notify_needs_postgresql(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db, pytest.raises(ConfigError, match="LISTEN/NOTIFY"):
        init_outbox(db, notify=True)
    cli = subprocess.run(
        [sys.executable, "-m", "sluiceway.cli.main", "outbox", "init", "--dsn", dsn, "--notify"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode != 0 and "LISTEN/NOTIFY" in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
