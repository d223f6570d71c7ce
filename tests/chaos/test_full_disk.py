"""A full disk under the harvester: its target journal on a small file system (a size-limited
tmpfs the test mounts) fills up mid-run. What must hold (issue 27):

* nothing is lost — every stashed record reaches the journal once space is back, in per-key order,
  and the outbox drains;
* the harvester says so in one warning line for the outage (naming the path and the cause), not
  one per retry;
* it resumes by itself when space is freed; the journal holds only whole appends.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sluiceway import Harvest, HarvestConfig, OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.harvest import LeaderAcquired
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.testing import wait_until
from tests.support.harvest import Recorder, started
from tests.support.order import check_per_key_order

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs mounted for this test (root only; unmounted after)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path, leave: int) -> None:
    """Write a ballast file until about ``leave`` bytes are free on ``path``'s file system.

    A process under test may be writing there at the same time, so the space read up front can
    shrink while the ballast is written: the ballast goes in chunks, and running out of space
    first means the disk is full already, which is what ``leave=0`` asks for (with ``leave`` > 0
    the ballast gives that much back)."""
    st = os.statvfs(path)
    want = max(0, st.f_bavail * st.f_frsize - leave)
    chunk = b"\0" * (64 * 1024)
    fd = os.open(path / "ballast", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < want:
            try:
                written += os.write(fd, chunk[: want - written])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                os.ftruncate(fd, max(0, written - leave))
                break
    finally:
        os.close(fd)


def test_a_full_journal_disk_loses_nothing_says_so_once_and_resumes(
    postgres_dsn: str, small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway")
    table = f"outbox_full_{uuid.uuid4().hex[:6]}"
    with Database(postgres_dsn) as db:
        init_outbox(db, table)
    journal = small_fs / "journal"
    config = HarvestConfig.from_dict(
        {
            "harvest": {
                "dataSource": postgres_dsn,
                "outboxTable": table,
                "journal": {"path": str(journal)},
                "election": {"kind": "database"},
                "limits": {"ioErrorBackoff": "100ms", "minMetricsInterval": "600s"},
            }
        }
    )
    sent: dict[str, int] = defaultdict(int)

    def stash(n: int) -> None:
        with psycopg.connect(postgres_dsn) as conn:
            stasher = Stasher(table).prepare(conn)
            for i in range(n):
                key = f"key-{i % 10}"
                sent[key] += 1
                stasher.stash(OutboxRecord("orders", key, json.dumps({"seq": sent[key], "pad": "x" * 900})))
            conn.commit()

    def outbox_rows() -> int:
        with Database(postgres_dsn) as db:
            row = db.fetchone(f"SELECT count(*) FROM {table}")
            return int(row[0]) if row else -1

    recorder = Recorder()
    harvest = started(Harvest(config), recorder)
    try:
        wait_until(lambda: recorder.of(LeaderAcquired), timeout=30, message="leadership")
        stash(200)
        wait_until(lambda: outbox_rows() == 0, timeout=30, message="the first records to reach the journal")
        fill(small_fs, leave=256 * 1024)
        stash(2000)  # about 2 MB: far more than is left
        full = os.strerror(28)
        wait_until(
            lambda: any(full in r.getMessage() for r in caplog.records), timeout=30, message="the full disk"
        )
        time.sleep(3)  # thirty retries at 100 ms
        assert outbox_rows() > 0, "records are held in the outbox while the disk is full"
        (small_fs / "ballast").unlink()
        wait_until(lambda: outbox_rows() == 0, timeout=60, message="the outbox to drain once space is back")
    finally:
        harvest.stop()

    with Journal.open(journal, read_only=True) as reader:
        records = [(r.key, json.loads(r.value)["seq"]) for r in reader.read()]  # type: ignore[arg-type]
    check_per_key_order(records, dict(sent))  # nothing lost, per-key order
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and full in r.getMessage()
    ]
    print(f"\n{len(records)} records for {sum(sent.values())} stashed; warnings: {warnings}")
    assert len(warnings) == 1, warnings
    assert str(journal) in warnings[0]


def test_a_feed_on_sqlite_on_a_full_disk_fails_claims_cleanly_and_loses_no_item(
    small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The feed's SQLite file fills its disk while a worker runs: adds fail with the project's
    error (not a crash), the worker keeps running and says so once, and once space is back every
    item added is processed and complete (at most one batch run again, at-least-once)."""
    from sluiceway.errors import SluicewayError
    from sluiceway.feed import Feed, FeedWorker, Item

    caplog.set_level(logging.INFO, logger="sluiceway")
    dsn = f"sqlite:///{small_fs / 'feed.db'}"
    feed = Feed(dsn, prefix="full_")
    processed: list[int] = []

    def process(item: Item) -> dict[str, object]:
        processed.append(item.id)
        time.sleep(0.005)
        return {"done": True}

    worker = FeedWorker(
        dsn, process, prefix="full_", batch_size=5, poll_interval=0.05, backoff=0.1, max_backoff=0.5
    )
    added = 0
    try:
        for n in range(30):
            feed.add(f"p{n}", [b"x" * 200 for _ in range(4)])
            added += 4
        worker.start()
        wait_until(lambda: len(processed) >= 20, timeout=30, message="the worker to get going")
        fill(small_fs, leave=0)
        refused = 0
        for n in range(30, 40):
            try:
                feed.add(f"p{n}", [b"y" * 4000 for _ in range(4)])
                added += 4
            except SluicewayError as exc:  # the project's error, naming the cause
                refused += 1
                assert "full" in str(exc).lower() or os.strerror(28).lower() in str(exc).lower(), exc
        time.sleep(2)
        assert worker.running, "the worker died of a full disk"
        (small_fs / "ballast").unlink()
        wait_until(
            lambda: (
                feed.db.fetchone(f"SELECT count(*) FROM {feed.store.items_table} WHERE status = 'complete'")
                == (added,)
            ),
            timeout=60,
            message="every item to complete once space is back",
        )
        assert worker.running
    finally:
        worker.stop()
        feed.close()
    assert refused > 0, "the disk never filled: nothing was tested"
    # At-least-once: a claimed batch whose completion could not be written may run again.
    assert len(processed) - len(set(processed)) <= 5
    assert len(set(processed)) == added
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    print(f"\n{added} items, {refused} adds refused while full; warnings: {warnings}")
    assert len(warnings) <= 2, warnings


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("full", ["sink", "checkpoint", "spill"])
def test_a_pipeline_whose_sink_checkpoint_or_spill_fills_up_stops_in_one_line_and_resumes_exactly(
    tmp_path: Path, small_fs: Path, full: str
) -> None:
    """A journal → Parquet pipeline (``--once``, as a user runs it) whose sink directory or whose
    checkpoint is on the small file system, or a journal → journal one whose Spark local directory
    (shuffle and spill files) is, filled up after a batch or two: the run stops with a non-zero
    exit and one line naming the place and the cause (no JVM trace), and once space is back the
    next run writes every record exactly once."""
    import pyarrow.dataset as ds

    records = 3000
    with Journal.open(tmp_path / "journal", fsync=False) as j, j.append() as tx:
        for i in range(records):
            value = json.dumps({"n": i, "pad": os.urandom(150).hex()}).encode()
            tx.write(f"k{i % 50}", value, namespace="orders")
    out = (small_fs if full == "sink" else tmp_path) / "out"
    checkpoints = (small_fs if full == "checkpoint" else tmp_path) / "checkpoints"
    sink = f"{{name: out, type: parquet, path: {out}, retry: {{outage: 2s, backoff: 0.2s}}}}"
    spark = ""
    if full == "spill":
        sink = f"{{name: out, type: journal, path: {out}}}"
        spark = f"\n  spark: {{spark.local.dir: {small_fs}}}"
    (tmp_path / "orders.yaml").write_text(
        f"""pipeline:
  name: orders
  source: {{type: journal, path: {tmp_path / "journal"}, max_records_per_batch: 500}}
  sinks: [{sink}]
  checkpoint: {checkpoints}{spark}
"""
    )
    # Room for the first batch or two: a batch's file is ~170 kB, its checkpoint files a few kB.
    fill(small_fs, leave={"sink": 400_000, "checkpoint": 40_000, "spill": 20_000}[full])

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sluiceway.cli.main", "pipeline", "run", "orders.yaml", "--once",
             "--master", "local[1]"],
            cwd=tmp_path, capture_output=True, text=True, timeout=240,
        )  # fmt: skip

    first = run()
    assert first.returncode != 0, first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "\tat " not in first.stderr, first.stderr[-5000:]
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and os.strerror(28) in last and str(small_fs) in last, first.stderr
    problems = [line for line in first.stderr.splitlines() if " sluiceway." in line and "INFO" not in line]
    assert len(problems) <= 2, problems  # the outage's one warning (a sink waits for it), the stop

    (small_fs / "ballast").unlink()
    second = run()
    assert second.returncode == 0, second.stderr[-5000:]
    if full == "spill":
        with Journal.open(out, read_only=True) as copy:
            values = [r.value for r in copy.read()]
    else:
        values = (
            ds.dataset(str(out), format="parquet").to_table(columns=["value"]).column("value").to_pylist()
        )
    print(f"\n{full} full: {last}")
    assert sorted(json.loads(v)["n"] for v in values) == list(range(records)), "every record exactly once"
