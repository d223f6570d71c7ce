"""A workspace with known figures in every part, for the tests of ``sluice status`` and ``sluice ui``.

What :func:`build` puts there, and so what the views must show:

* outbox ``shop``: 1,234 rows, the first 10 of them in flight (marked), 2 dead letters, the
  leader ``harvester-a`` holding the database lease ``sluiceway``;
* journal ``bus``: 100 records (offsets 0 to 99), consumer ``orders.lake`` at 60 (lag 40);
* pipeline ``orders`` (journal source ``bus``): sink ``lake`` committed up to offset 80 (lag 20,
  80 records); sink ``db`` stopped on offset 42 (``ValueError: refused``), committed up to 40;
* feed ``work``: partitions ``folder-1`` (3 items at gate 0, 1 at gate 1; leased by
  ``worker-live``), ``folder-2`` (2 items; its lease, ``worker-gone``'s, has expired) and
  ``folder-3`` (failed: 1 failed item).

Hand-made Spark checkpoints stand in for a pipeline run: status reads them without Spark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.election import SqlLeaseStore
from sluiceway.feed import Feed
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.outbox.store import SqlOutboxStore
from sluiceway.pipeline.state import SinkState, StateStore
from sluiceway.testing import wait_until
from tests.support.journal import make_journal
from tests.support.outbox import user_connection

ROWS = 1234
IN_FLIGHT = 10
DEAD = 2
HEAD = 100


@dataclass
class Built:
    config: Path
    outbox_dsn: str
    feed_dsn: str
    journal: Path
    spec: Path


def fill_outbox(dsn: str) -> None:
    """1,234 rows (10 in flight), 2 dead letters, and a leader."""
    with Database(dsn) as db:
        init_outbox(db)
    conn = user_connection(dsn)
    stash = Stasher().prepare(conn)
    for i in range(ROWS + DEAD):
        stash.stash(OutboxRecord("orders.created", f"customer-{i % 50}", json.dumps({"order": i})))
    conn.commit()
    conn.close()
    store = SqlOutboxStore(dsn)
    try:
        marked = store.mark("00000000-0000-4000-8000-000000000001", IN_FLIGHT + DEAD)
        for record in marked[:DEAD]:
            store.bury(record, "MessageSizeTooLarge: the broker refused it", attempts=3)
    finally:
        store.close()
    leases = SqlLeaseStore(dsn)
    try:
        assert leases.acquire("sluiceway", "harvester-a", ttl=3600) is not None
    finally:
        leases.close()


def _checkpoint(directory: Path, batches: int, offset: int) -> None:
    """What Spark leaves for a sink that committed ``batches`` micro-batches, the last at ``offset``."""
    (directory / "offsets").mkdir(parents=True, exist_ok=True)
    (directory / "commits").mkdir(parents=True, exist_ok=True)
    for batch in range(batches):
        at = offset * (batch + 1) // batches
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
        (directory / "offsets" / str(batch)).write_text(
            f"v1\n{json.dumps(meta)}\n{json.dumps({'offset': at})}"
        )
        (directory / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def fill_pipeline(root: Path, journal: Path) -> Path:
    spec = {
        "pipeline": {
            "name": "orders",
            "source": {"type": "journal", "path": str(journal)},
            "sinks": [{"name": "lake", "type": "console"}, {"name": "db", "type": "console"}],
            "checkpoint": str(root / "checkpoints"),
        }
    }
    path = root / "orders.yaml"
    path.write_text(yaml.safe_dump(spec))
    _checkpoint(root / "checkpoints" / "lake", 3, 80)
    StateStore(root / "checkpoints" / "lake").save(SinkState(batch=2, done=True, last_offset=79, records=80))
    _checkpoint(root / "checkpoints" / "db", 1, 40)
    failed = SinkState(batch=1, last_offset=41, records=42)
    failed.failed(42, "ValueError: refused (the row violates orders_total_check)", 1)
    StateStore(root / "checkpoints" / "db").save(failed)
    return path


def fill_feed(dsn: str) -> None:
    with Feed(dsn) as feed:
        feed.add("folder-1", [b"a.pdf", b"b.pdf", b"c.pdf"])
        feed.add_items("folder-1", [b"index"], gate=1)
        feed.add("folder-2", [b"d.pdf", b"e.pdf"])
        feed.add("folder-3", [b"broken.pdf"])
        store = feed.store
        by_name = {p.name: p for p in feed.partitions().rows}
        # folder-3 failed: its one item used up its attempts (as a worker would leave it).
        feed.db.execute(
            f"UPDATE {store.items_table} SET status = 'failed', last_error = 'OCR timed out', attempts = 5 "
            f"WHERE partition_id = {by_name['folder-3'].id}"
        )
        feed.db.execute(
            f"UPDATE {store.partitions_table} SET status = 'failed' WHERE id = {by_name['folder-3'].id}"
        )
        one, two = by_name["folder-1"], by_name["folder-2"]
        assert store.acquire("worker-live", [(one.id, one.version)], lease=3600)
        assert store.acquire("worker-gone", [(two.id, two.version)], lease=0.2)

        def lapsed() -> bool:
            return any(w.owner == "worker-gone" and w.expired == 1 for w in feed.status().workers)

        wait_until(lapsed, timeout=10, message="worker-gone's lease to lapse")


def build(root: Path, outbox_dsn: str, feed_dsn: str | None = None) -> Built:
    """Every part filled as the module docstring says, and ``sluice.yaml`` naming them."""
    root.mkdir(parents=True, exist_ok=True)
    feed_dsn = feed_dsn or f"sqlite:///{root / 'work.db'}"
    fill_outbox(outbox_dsn)
    journal = root / "journal"
    make_journal(
        journal, [("orders.created", f"customer-{i % 7}", f"order {i}".encode()) for i in range(HEAD)]
    )
    with Journal.open(journal) as j:
        j.commit_offset("orders.lake", 60)
    spec = fill_pipeline(root, journal)
    fill_feed(feed_dsn)
    workspace: dict[str, Any] = {
        "outboxes": [{"name": "shop", "dsn": outbox_dsn, "table": "outbox"}],
        "journals": [{"name": "bus", "path": str(journal)}],
        "pipelines": [str(spec)],
        "feeds": [{"name": "work", "dsn": feed_dsn}],
    }
    config = root / "sluice.yaml"
    config.write_text(yaml.safe_dump(workspace, sort_keys=False))
    return Built(config, outbox_dsn, feed_dsn, journal, spec)
