"""What the console's history costs: sampling a workspace of 20 parts every 5 s.

    .venv/bin/python bench/console.py              # about 90 s
    .venv/bin/python bench/console.py --watch 30   # a shorter whole-process watch

The workspace: 5 outboxes (SQLite, 10,000 rows each, 100 in flight, a leader), 5 journals (10,000
records, 2 consumers each), 5 pipelines (journal source, 2 sinks with state: one committed, one
stopped), 5 feeds (SQLite, 50 partitions of 10 items). SQLite puts the databases' own work in the
console's process too, so this is the dearest case for the console (a PostgreSQL outbox's query
runs on the server).

* per sample, in this process: CPU time (``time.process_time``) of ``collect`` alone (what one
  ``sluice status`` read costs: the baseline) and of one sample (``collect``, the figures, the
  write to the history file), each the median of ``--samples`` (20) back to back;
* the whole process: ``sluice ui`` on the workspace, sampling every 5 s with no browser open,
  its CPU time (utime + stime from /proc) over ``--watch`` seconds (60) after a warm-up.

``cpu_share`` in the JSON line is the whole process's CPU over the watch, as a share of one core
(the issue's bound: < 0.02).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _common import report
from sluiceway import OutboxRecord, Stasher
from sluiceway.db import Database
from sluiceway.election import SqlLeaseStore
from sluiceway.feed import Feed
from sluiceway.journal import Journal
from sluiceway.outbox import init_outbox
from sluiceway.outbox.store import SqlOutboxStore
from sluiceway.overview import Workspace, collect
from sluiceway.overview.history import Sampler, SqliteHistory
from sluiceway.pipeline.state import SinkState, StateStore

PARTS = 5


def build(root: Path) -> Path:
    outboxes, journals, pipelines, feeds = [], [], [], []
    for n in range(PARTS):
        dsn = f"sqlite:///{root / f'shop{n}.db'}"
        with Database(dsn) as db:
            init_outbox(db)
        conn = sqlite3.connect(root / f"shop{n}.db")
        stash = Stasher().prepare(conn)
        for i in range(10_000):
            stash.stash(OutboxRecord("orders", f"k{i % 100}", json.dumps({"i": i})))
        conn.commit()
        conn.close()
        store = SqlOutboxStore(dsn)
        store.mark("00000000-0000-4000-8000-000000000001", 100)
        store.close()
        leases = SqlLeaseStore(dsn)
        leases.acquire("sluiceway", f"harvester-{n}", ttl=86400)
        leases.close()
        outboxes.append({"name": f"shop{n}", "dsn": dsn})

        path = root / f"bus{n}"
        with Journal.open(path, fsync=False) as journal:
            for _ in range(100):
                with journal.append() as tx:
                    for i in range(100):
                        tx.write(f"k{i}", b'{"v": 1}', namespace="orders")
            journal.commit_offset("lake", 6_000)
            journal.commit_offset("audit", 9_000)
        journals.append({"name": f"bus{n}", "path": str(path)})

        checkpoints = root / f"checkpoints{n}"
        for sink, state in (
            ("lake", SinkState(batch=2, done=True, last_offset=7_999, records=8_000)),
            ("db", SinkState(batch=1, last_offset=4_000, records=4_001)),
        ):
            StateStore(checkpoints / sink).save(state)
        spec = root / f"orders{n}.yaml"
        spec.write_text(yaml.safe_dump({"pipeline": {
            "name": f"orders{n}", "source": {"type": "journal", "path": str(path)},
            "sinks": [{"name": "lake", "type": "console"}, {"name": "db", "type": "console"}],
            "checkpoint": str(checkpoints),
        }}))  # fmt: skip
        pipelines.append(str(spec))

        feed_dsn = f"sqlite:///{root / f'work{n}.db'}"
        with Feed(feed_dsn) as feed:
            for p in range(50):
                feed.add(f"folder-{p}", [f"{p}-{i}".encode() for i in range(10)])
        feeds.append({"name": f"work{n}", "dsn": feed_dsn})
    config = root / "sluice.yaml"
    config.write_text(yaml.safe_dump({
        "outboxes": outboxes, "journals": journals, "pipelines": pipelines, "feeds": feeds,
        "history": {"every": "5s"},
    }))  # fmt: skip
    return config


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--watch", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-console-bench-") as tmp:
        root = Path(tmp)
        config = build(root)
        workspace = Workspace.from_file(config)
        parts = sum(
            len(getattr(collect(workspace), k)) for k in ("outboxes", "journals", "pipelines", "feeds")
        )

        def cpu(run: object) -> float:
            times = []
            for _ in range(args.samples):
                started = time.process_time()
                run()  # type: ignore[operator]
                times.append(time.process_time() - started)
            return statistics.median(times)

        status_cpu = cpu(lambda: collect(workspace))
        with SqliteHistory(root / "bench.history.db") as history:
            sampler = Sampler(workspace, history, every=5)
            sample_cpu = cpu(sampler.sample)
            points = sampler.sample()

        port = 18000 + os.getpid() % 1000
        ui = subprocess.Popen(
            [sys.executable, "-m", "sluiceway.cli.main", "ui", "--config", str(config), "--addr",
             f"127.0.0.1:{port}", "--refresh", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert ui.stdout is not None
            ui.stdout.readline()
            time.sleep(10)  # start-up and the first samples
            before, t0 = cpu_of(ui.pid), time.monotonic()
            time.sleep(args.watch)
            used, elapsed = cpu_of(ui.pid) - before, time.monotonic() - t0
        finally:
            ui.terminate()
            ui.wait(15)
        history_file = Workspace.from_file(config).history.path
        size = Path(str(history_file)).stat().st_size if history_file else 0
    share = used / elapsed
    report(
        f"console history: {parts} parts, a sample every 5 s",
        [
            ("status read (collect), CPU per read", f"{status_cpu * 1000:.1f} ms"),
            ("one sample (collect + figures + write), CPU", f"{sample_cpu * 1000:.1f} ms"),
            ("history's own share of a sample", f"{(sample_cpu - status_cpu) * 1000:.1f} ms"),
            ("points per sample", f"{points}"),
            ("per-sample CPU / 5 s, as a share of one core", f"{sample_cpu / 5:.2%}"),
            (
                f"sluice ui, whole process, {elapsed:.0f} s watched",
                f"{used:.2f} s CPU = {share:.2%} of a core",
            ),
            ("history file after the watch", f"{size / 1024:.0f} KiB"),
        ],
        {
            "parts": parts,
            "status_cpu_ms": round(status_cpu * 1000, 2),
            "sample_cpu_ms": round(sample_cpu * 1000, 2),
            "points_per_sample": points,
            "cpu_share": round(share, 4),
            "target_share": 0.02,
        },
    )


if __name__ == "__main__":
    main()
