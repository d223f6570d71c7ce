"""The embedded API on the embedded default (SQLite + journal): events, context manager, fencing
of a stale leader by the journal's epoch register."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from sluiceway import Harvest, HarvestConfig, LeadershipError, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.harvest import LeaderAcquired, LeaderRevoked, MeterRead
from sluiceway.harvest.journal_target import JournalPublisher
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.outbox.record import MarkedRecord
from sluiceway.testing import wait_until
from tests.support.harvest import Recorder
from tests.support.outbox import outbox_count


def sqlite_outbox(tmp_path: Path, records: list[OutboxRecord]) -> str:
    """An SQLite outbox holding ``records``; returns its DSN."""
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    conn = sqlite3.connect(tmp_path / "app.db")
    stash = Stasher().prepare(conn)
    for record in records:
        stash.stash(record)
    conn.commit()
    conn.close()
    return dsn


def test_embedded_harvest_into_journal(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    with Database(dsn) as db:
        init_outbox(db)
    conn = sqlite3.connect(tmp_path / "app.db")
    stash = Stasher().prepare(conn)
    for i in range(500):
        stash.stash(
            OutboxRecord(
                f"orders.{'created' if i % 2 else 'paid'}", f"order-{i % 7}", f"v{i}", [("i", str(i))]
            )
        )
    conn.commit()
    conn.close()
    cfg = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": dsn,
                "journal": {"path": str(tmp_path / "journal")},
                "limits": {"minMetricsInterval": "200ms"},
            }
        }
    )
    recorder = Recorder()
    with Harvest(cfg) as harvest:
        harvest.set_event_handler(recorder)
        wait_until(lambda: outbox_count(dsn) == 0, timeout=30)
        wait_until(lambda: recorder.of(MeterRead), timeout=5)
        assert harvest.is_leader
        assert not harvest.wait(timeout=0.01)
    names = recorder.names()
    assert names.index("LeaderAcquired") < names.index("MeterRead") < names.index("LeaderRevoked")
    assert isinstance(recorder.of(LeaderAcquired)[0].leader_id, str)
    assert recorder.of(LeaderRevoked)
    with Journal.open(tmp_path / "journal", read_only=True) as journal:
        records = list(journal.read())
        assert journal.registers()["sluiceway.harvest.epoch"] == "1"
    assert len(records) == 500
    assert {r.namespace for r in records} == {"orders.created", "orders.paid"}
    per_key: dict[str, list[int]] = {}
    for r in records:
        per_key.setdefault(r.key, []).append(int(r.value.decode()[1:]))  # type: ignore[union-attr]
    assert all(seq == sorted(seq) for seq in per_key.values())
    first = next(r for r in records if r.value == b"v0")
    leader = recorder.of(LeaderAcquired)[0].leader_id
    # A new configuration: the row's headers, then the sequence headers (row id, leader id).
    assert first.headers == [("i", "0"), ("sluice-id", "1"), ("sluice-leader", leader)]


def test_the_database_reached_is_logged_at_start_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.harvest")
    db_file = tmp_path / "app.db"
    with Database(f"sqlite:///{db_file}") as db:
        init_outbox(db)
    cfg = {"harvest": {"dataSource": f"sqlite:///{db_file}", "journal": {"path": str(tmp_path / "journal")}}}
    line = f"outbox outbox found in sqlite database '{db_file}'"
    with Harvest(cfg):
        wait_until(lambda: line in caplog.messages, timeout=30, message="the start-up line")


def test_stale_leader_appends_are_rejected_by_the_epoch_register(tmp_path: Path) -> None:
    path = str(tmp_path / "journal")
    old = JournalPublisher(path, epoch=1, fsync=False)
    results: list[str | None] = []
    record = MarkedRecord(1, None, "t", "k", b"v", (), "L")
    old.send(record, lambda d: results.append(d.error))
    old.flush(5)
    assert results == [None]
    # A newer leader moves the epoch (simulated by claiming the register directly, as it would).
    with old.journal.append(
        expect_registers={"sluiceway.harvest.epoch": "1"}, set_registers={"sluiceway.harvest.epoch": "2"}
    ):
        pass
    old.send(record, lambda d: results.append(d.error))
    old.flush(5)
    assert results[1] is not None and "fenced" in results[1]
    old.close()
    with pytest.raises(LeadershipError, match="newer leader"):
        JournalPublisher(path, epoch=1, fsync=False)


def test_journal_destination_requires_database_election() -> None:
    from sluiceway import ConfigError

    with pytest.raises(ConfigError, match="database"):
        HarvestConfig.from_dict(
            {
                "harvest": {
                    "dataSource": "sqlite:///x.db",
                    "journal": {"path": "j"},
                    "election": {"kind": "kafka"},
                    "baseKafkaConfig": {"bootstrap.servers": "127.0.0.1:1"},
                }
            }
        )


def test_pipelined_keys_into_the_journal(tmp_path: Path) -> None:
    dsn = sqlite_outbox(tmp_path, [OutboxRecord("orders", f"order-{i % 5}", str(i)) for i in range(2000)])
    cfg = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": dsn,
                "journal": {"path": str(tmp_path / "journal"), "fsync": False},
                "limits": {"perKeyInFlight": 8},
            }
        }
    )
    with Harvest(cfg):
        wait_until(lambda: outbox_count(dsn) == 0, timeout=60)
    with Journal.open(tmp_path / "journal", read_only=True) as journal:
        records = list(journal.read())
    per_key: dict[str, list[int]] = {}
    for r in records:
        per_key.setdefault(r.key, []).append(int(r.value or b""))
    # Several appends of a key in flight at once, and still each key exactly in order.
    assert per_key == {f"order-{k}": list(range(k, 2000, 5)) for k in range(5)}


def test_journal_withholds_a_failed_keys_queued_records(tmp_path: Path) -> None:
    publisher = JournalPublisher(str(tmp_path / "journal"), epoch=1, fsync=False)
    real = publisher.journal

    class FailsOnce:
        failed = False

        def append(self, **kwargs: object) -> object:
            if not self.failed:
                self.failed = True
                raise OSError("disk full")
            return real.append(**kwargs)  # type: ignore[arg-type]

    outcomes: dict[tuple[str, str], str | None] = {}

    def rec(rid: int, key: str, leader: str) -> tuple[MarkedRecord, object]:
        record = MarkedRecord(rid, None, "t", key, str(rid).encode(), (), leader)
        return record, lambda d: outcomes.__setitem__((f"{key}{rid}", leader), d.error)

    publisher.journal = FailsOnce()  # type: ignore[assignment]
    try:
        publisher._append([rec(1, "a", "L1"), rec(2, "b", "L1")])  # type: ignore[list-item]
        # Queued behind the failure under the same leader id: a and b fail without being appended.
        publisher._append([rec(3, "a", "L1"), rec(4, "b", "L1"), rec(5, "c", "L1")])  # type: ignore[list-item]
        # The re-send, marked under a fresh leader id, goes through from the failed record on.
        publisher._append([rec(1, "a", "L2"), rec(3, "a", "L2")])  # type: ignore[list-item]
    finally:
        publisher.journal = real
        publisher.close()
    assert outcomes[("a1", "L1")] and outcomes[("b2", "L1")]
    assert "earlier record of its key failed" in str(outcomes[("a3", "L1")])
    assert outcomes[("b4", "L1")] and outcomes[("c5", "L1")] is None
    assert outcomes[("a1", "L2")] is None and outcomes[("a3", "L2")] is None
    with Journal.open(tmp_path / "journal", read_only=True) as journal:
        assert [(r.key, r.value) for r in journal.read()] == [("c", b"5"), ("a", b"1"), ("a", b"3")]
