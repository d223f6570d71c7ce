"""The capture engine on a real PostgreSQL with logical decoding: slot → journal, streamed once.

Each test reads back the capture's journal as a key-upserting sink would and compares it with the
source tables; per-key order is checked through each row's ever-growing ``version``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.cdc.capture import CaptureOptions, SlotCapture
from sluiceway.cdc.errors import LostChangesError
from sluiceway.cdc.service import CaptureService
from sluiceway.cdc.target import JournalTarget
from sluiceway.journal import Journal
from sluiceway.testing import PrivatePostgres, wait_until
from tests.support.cdc import (
    TABLES,
    Running,
    Sink,
    Writer,
    capture_records,
    create_tables,
    slot_confirmed,
    source_state,
    version_regressions,
)

pytestmark = pytest.mark.timeout(240)


def options(dsn: str, tmp: Path, slot: str, **extra: Any) -> CaptureOptions:
    return CaptureOptions(
        dsn=dsn, tables=TABLES, slot=slot, publication=slot, state_dir=str(tmp / "state"), **extra
    )


@pytest.fixture
def tables(cdc_dsn: str) -> Iterator[str]:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS orders, lines, customers CASCADE")
    create_tables(cdc_dsn, orders=3_000, lines=2_000, customers=300)
    yield cdc_dsn


def test_copy_under_writes_then_sync_the_log_equals_the_source_in_per_key_order(
    tables: str, tmp_path: Path
) -> None:
    dsn = tables
    writer = Writer(dsn, seed=3)
    writer.start()
    running = Running(options(dsn, tmp_path, "cap_copy", chunk_size=700), tmp_path / "log")
    try:
        assert running.capture.copy_done.wait(120), running.error
        writer.stop()
        running.caught_up()
    finally:
        running.close()
    assert writer.ops > 50
    records = capture_records(tmp_path / "log")
    sink = Sink()
    sink.apply(records)
    assert sink.state == source_state(dsn)
    assert version_regressions(records) == []
    assert sink.modes() == {"copy", "sync"}
    # The slot was released up to what the log holds, and no further.
    held = int(Journal.open(tmp_path / "log", read_only=True).registers()["cdc.lsn"])
    assert 0 < slot_confirmed(dsn, "cap_copy") <= held


def test_a_restart_resumes_from_the_log_without_loss_or_a_second_copy(tables: str, tmp_path: Path) -> None:
    dsn = tables
    opts = options(dsn, tmp_path, "cap_restart", snapshot="never")
    first = Running(opts, tmp_path / "log")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE orders SET version = version + 1 WHERE id <= 100")
    first.caught_up()
    first.close()
    count = len(capture_records(tmp_path / "log"))
    assert count == 100
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE orders SET version = version + 1 WHERE id <= 50")
    second = Running(opts, tmp_path / "log")
    second.caught_up()
    second.close()
    records = capture_records(tmp_path / "log")
    assert len(records) == 150
    assert [r["op"] for r in records] == ["update"] * 150
    assert version_regressions(records) == []


def test_a_log_behind_its_slot_is_refused_as_lost_changes(tables: str, tmp_path: Path) -> None:
    dsn = tables
    opts = options(dsn, tmp_path, "cap_lost", snapshot="never")
    first = Running(opts, tmp_path / "log")
    first.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active")
        wait_until(
            lambda: not conn.execute("SELECT count(*) FROM pg_replication_slots WHERE active").fetchone()[0],
            timeout=10,
        )
        conn.execute("SELECT pg_drop_replication_slot('cap_lost')")
        conn.execute("UPDATE orders SET version = version + 1 WHERE id <= 10")
        conn.execute("SELECT pg_create_logical_replication_slot('cap_lost', 'pgoutput')")
    capture = SlotCapture(opts, JournalTarget(str(tmp_path / "log")))
    with pytest.raises(LostChangesError, match="changes in between are gone"):
        capture.prepare()
    capture.close()
    capture.target.close()


def test_the_slot_follows_writes_outside_the_publication_yet_never_passes_the_log(
    tables: str, tmp_path: Path
) -> None:
    # Writes only to a table outside the publication: the server sends keepalives, no changes.
    # The slot must move on (else it holds that WAL for ever) and must never pass what the log
    # holds (else a restart finds it ahead and refuses, as if changes were lost).
    dsn = tables
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE elsewhere (id serial PRIMARY KEY, pad text)")
    running = Running(options(dsn, tmp_path, "cap_quiet", snapshot="never"), tmp_path / "log")
    try:
        start = slot_confirmed(dsn, "cap_quiet")
        gaps: list[int] = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(40):
                conn.execute(
                    "INSERT INTO elsewhere (pad) SELECT repeat('x', 200) FROM generate_series(1, 500)"
                )
                slot = slot_confirmed(dsn, "cap_quiet")  # the slot first: the log is written before it moves
                held = int(Journal.open(tmp_path / "log", read_only=True).registers()["cdc.lsn"])
                gaps.append(slot - held)
                time.sleep(0.1)
        wait_until(
            lambda: slot_confirmed(dsn, "cap_quiet") > start, timeout=30, message="the slot to move on"
        )
    finally:
        running.close()
    assert max(gaps) <= 0, f"the slot passed the log by {max(gaps)} bytes"
    held = int(Journal.open(tmp_path / "log", read_only=True).registers()["cdc.lsn"])
    assert start < slot_confirmed(dsn, "cap_quiet") <= held
    assert capture_records(tmp_path / "log") == []
    again = SlotCapture(
        options(dsn, tmp_path, "cap_quiet", snapshot="never"), JournalTarget(str(tmp_path / "log"))
    )
    try:
        again.prepare()  # a restart takes the slot where the log left it, with no loss reported
    finally:
        again.close()
        again.target.close()


def test_a_server_restart_is_waited_out_and_the_capture_resumes_without_loss(
    tables: str, tmp_path: Path, logical_pg: PrivatePostgres
) -> None:
    dsn = tables
    service = CaptureService(options(dsn, tmp_path, "cap_bounce", snapshot="never"), tmp_path / "log")
    service.prepare()
    service.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET version = version + 1 WHERE id <= 200")
        wait_until(lambda: _count(tmp_path / "log") >= 200, timeout=30, message="the first changes")
        logical_pg.restart("fast")
        conn = wait_until(lambda: _connect(dsn), timeout=30, message="the server back")
        with conn:
            conn.execute("UPDATE orders SET version = version + 1 WHERE id > 2800")
        wait_until(lambda: _count(tmp_path / "log") >= 400, timeout=60, message="changes after the restart")
        assert service.error is None
    finally:
        service.close()
    records = capture_records(tmp_path / "log")
    assert len(records) == 400  # at least once, and here exactly once: the journal said where to resume
    assert version_regressions(records) == []
    held = int(Journal.open(tmp_path / "log", read_only=True).registers()["cdc.lsn"])
    assert 0 < slot_confirmed(dsn, "cap_bounce") <= held


def _count(log: Path) -> int:
    return Journal.head_offset(log) if log.exists() else 0


def _connect(dsn: str) -> psycopg.Connection[Any] | None:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        return None


def _slots_and_publications(dsn: str) -> tuple[set[str], set[str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        slots = {r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()}
        pubs = {r[0] for r in conn.execute("SELECT pubname FROM pg_publication").fetchall()}
    return slots, pubs


def test_a_dropped_slot_is_refused_before_anything_is_created(tables: str, tmp_path: Path) -> None:
    """The log holds changes, the slot is gone (``pipeline drop-slot``): the run refuses — and
    leaves no new slot behind holding WAL on the user's database."""
    dsn = tables
    opts = options(dsn, tmp_path, "cap_dropped", snapshot="never")
    Running(opts, tmp_path / "log").close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_until(
            lambda: (
                not conn.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cap_dropped' AND active"
                ).fetchone()[0]
            ),
            timeout=10,
        )
        conn.execute("SELECT pg_drop_replication_slot('cap_dropped')")
    service = CaptureService(opts, tmp_path / "log")
    with pytest.raises(LostChangesError, match="does not exist: the changes since are gone"):
        service.prepare()
    assert "cap_dropped" not in _slots_and_publications(dsn)[0]


def test_a_refused_first_run_creates_no_log_slot_or_publication(tables: str, tmp_path: Path) -> None:
    """A first run that a check refuses (a table that does not exist) makes nothing: no log
    directory, no publication, no slot."""
    dsn = tables
    opts = CaptureOptions(
        dsn=dsn,
        tables=["public.orders", "public.no_such_table"],
        slot="cap_refused",
        publication="cap_refused",
        state_dir=str(tmp_path / "state"),
    )
    before = _slots_and_publications(dsn)
    with pytest.raises(Exception, match="no_such_table"):
        CaptureService(opts, tmp_path / "cdc" / "log").prepare()
    assert _slots_and_publications(dsn) == before
    assert not (tmp_path / "cdc").exists()
