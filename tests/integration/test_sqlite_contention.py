"""The embedded default under contention: SQLite has one write lock, and many want it.

An application's four threads commit orders with their outbox rows while the harvester marks and
purges and renews its lease, all in one process, and somebody else's connection (another
process, a migration, a backup) takes the write lock and keeps it for longer than SQLite's
``busy_timeout``. "database is locked" is a wait: nothing may fail, nothing may be lost or
reordered, and nothing may be said that reads like a failure.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from sluiceway.demo.shop import check_order, prepare_shop, run_shop
from sluiceway.harvest import Harvest, HarvestConfig
from sluiceway.journal import Journal
from sluiceway.testing import wait_until

pytestmark = pytest.mark.timeout(180)

#: Longer than the 5 s busy_timeout every connection waits before "database is locked".
HOLD_SECONDS = 7.0


def _outbox_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM outbox").fetchone()[0])


def test_a_write_lock_held_past_busy_timeout_is_waited_out_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db_path, journal_path = tmp_path / "shop.db", tmp_path / "journal"
    dsn = f"sqlite:///{db_path}"
    prepare_shop(dsn)
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "name": "contention",
                "dataSource": dsn,
                "journal": {"path": str(journal_path)},
                # A lease whose renewals can outwait the hold (a 5 s lease cannot: its leader
                # must fence itself while it cannot renew, as it should).
                "election": {"kind": "database", "leaseTimeout": "30s"},
            }
        }
    )
    events = 3000
    held = threading.Event()
    released = threading.Event()

    def hold_the_lock() -> None:
        other = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        try:
            other.execute("BEGIN IMMEDIATE")  # somebody else's writer, outside sluiceway
            held.set()
            time.sleep(HOLD_SECONDS)
            other.execute("COMMIT")
        finally:
            other.close()
            released.set()

    locker = threading.Thread(target=hold_the_lock)

    def progress(written: int) -> None:
        # Each thread writes steadily; a third of the way through, the lock is taken away.
        time.sleep(0.002)
        if written == events // 12 and not locker.is_alive() and not held.is_set():
            locker.start()

    caplog.set_level(logging.INFO, logger="sluiceway")
    harvest = Harvest(config).start()
    try:
        shop = run_shop(dsn, events, threads=4, customers=40, progress=progress)
        assert held.is_set() and released.wait(30), "the lock was never taken"
        wait_until(lambda: _outbox_rows(db_path) == 0, timeout=60, message="the outbox drains")
    finally:
        harvest.stop()
    with Journal.open(journal_path, read_only=True) as journal:
        published = [(r.key, r.value) for r in journal.read()]
    count, _dups, problems = check_order(published, shop.expected(per_topic=False))
    assert shop.events == events and count >= events and not problems, problems[:5]
    alarming = [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING or "locked" in r.getMessage()
    ]
    assert not alarming, alarming
