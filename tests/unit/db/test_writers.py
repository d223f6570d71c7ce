"""Our SQLite writers take turns: first come, first served, a lease's renewal first of all."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sluiceway.db import Database
from sluiceway.db.writers import WriteGate, gate_for, is_write
from sluiceway.errors import LockTimeoutError
from sluiceway.testing import wait_until


def test_writers_queue_in_arrival_order_with_the_urgent_first() -> None:
    gate = WriteGate()
    order: list[str] = []
    assert gate.acquire(timeout=1)

    def writer(name: str, urgent: bool) -> None:
        assert gate.acquire(timeout=10, urgent=urgent)
        order.append(name)
        gate.release()

    threads = []
    for i, (name, urgent) in enumerate((("mark", False), ("purge", False), ("lease", True))):
        t = threading.Thread(target=writer, args=(name, urgent))
        t.start()
        threads.append(t)
        wait_until(lambda i=i: gate.waiting == i + 1, message=f"{name} queued")
    gate.release()
    for t in threads:
        t.join(10)
    assert order == ["lease", "mark", "purge"]


def test_a_waiter_that_times_out_leaves_the_queue() -> None:
    gate = WriteGate()
    assert gate.acquire(timeout=1)
    assert not gate.acquire(timeout=0.05)
    assert gate.waiting == 0
    gate.release()
    assert gate.acquire(timeout=0.05)


def test_one_gate_per_file_none_in_memory(tmp_path: Path) -> None:
    a = gate_for(str(tmp_path / "x.db"))
    assert a is not None and a is gate_for(str(tmp_path / "." / "x.db"))
    assert gate_for(":memory:") is None


def test_reads_and_writes_are_told_apart() -> None:
    assert not is_write("SELECT 1") and not is_write("pragma table_info(outbox)")
    assert is_write("UPDATE outbox SET leader_id = ? RETURNING id") and is_write("BEGIN IMMEDIATE")


def test_a_write_waits_out_a_lock_shorter_than_its_budget_and_reports_a_longer_one(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    db = Database(f"sqlite:///{path}", busy_timeout=3.0)
    db.execute("CREATE TABLE t (x INTEGER)")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # not ours: no gate
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    db.execute("INSERT INTO t VALUES (1)")  # waits for the other writer, then writes
    release.join()
    quick = Database(f"sqlite:///{path}", busy_timeout=0.2)
    other.execute("BEGIN IMMEDIATE")
    try:
        try:
            quick.execute("INSERT INTO t VALUES (2)")
            raise AssertionError("expected a lock timeout")
        except LockTimeoutError:
            pass
        with_tx_failed = False
        try:
            with quick.transaction():
                quick.execute("INSERT INTO t VALUES (3)")
        except LockTimeoutError:
            with_tx_failed = True
        assert with_tx_failed
    finally:
        other.execute("COMMIT")
        other.close()
    assert db.fetchall("SELECT x FROM t") == [(1,)]
    with quick.transaction():  # the gate was given back after the failed attempts
        quick.execute("INSERT INTO t VALUES (4)")
    assert db.fetchall("SELECT x FROM t ORDER BY x") == [(1,), (4,)]
    db.close()
    quick.close()
