"""kill -9 of a running pipeline, then a restart: every record reaches every sink, in per-key order.

The pipeline runs as ``sluice pipeline run`` in its own process group (Python driver and its
JVM), which the test kills outright in the middle of its work.
"""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import pytest

from sluiceway.db import Database
from sluiceway.journal import Journal
from sluiceway.testing import wait_until
from tests.support.order import check_per_key_order
from tests.support.outbox import Writers, prepare_outbox
from tests.support.pipeline import kill9, write_spec
from tests.support.pipeline import start_pipeline as start

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def journal_seqs(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    try:
        with Journal.open(path, read_only=True) as j:
            return [(r.key, json.loads(r.value)["seq"]) for r in j.read() if r.value is not None]
    except Exception:
        return []


def file_seqs(path: Path) -> list[tuple[str, int]]:
    out = []
    for f in sorted(path.glob("part-*.jsonl")):  # names sort in batch, then position order
        out.extend(
            (r["key"], json.loads(r["value"])["seq"]) for r in map(json.loads, f.read_text().splitlines())
        )
    return out


def write_sequences(source: Path, keys: int, total: int, per_append: int = 1000) -> dict[str, int]:
    """A journal of ``total`` records over ``keys`` keys, each carrying its key's sequence number."""
    expected = {f"key-{k}": total // keys for k in range(keys)}
    seq = dict.fromkeys(expected, 0)
    with Journal.open(source, fsync=False) as j:
        for start_i in range(0, total, per_append):
            with j.append() as tx:
                for i in range(start_i, min(total, start_i + per_append)):
                    key = f"key-{i % keys}"
                    seq[key] += 1
                    tx.write(key, json.dumps({"seq": seq[key]}).encode(), namespace="orders")
    return expected


def test_kill_9_then_restart_delivers_everything_in_order_to_every_sink(tmp_path: Path) -> None:
    source = tmp_path / "source"
    total = 20_000
    expected = write_sequences(source, keys=40, total=total)
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "chaos",
            "source": {"type": "journal", "path": str(source), "max_records_per_batch": 700},
            "sinks": [
                {"name": "copy", "type": "journal", "path": str(tmp_path / "copy")},
                {"name": "files", "type": "json", "path": str(tmp_path / "files")},
            ],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "50ms"},
        },
    )
    proc = start(spec, log=tmp_path / "run1.log")
    try:
        wait_until(
            lambda: len(journal_seqs(tmp_path / "copy")) >= 4000,
            timeout=120,
            message="the pipeline to get going",
        )
    finally:
        kill9(proc)
    partial = len(journal_seqs(tmp_path / "copy"))
    assert partial < total, "killed too late to test anything"

    again = start(spec, "--once", log=tmp_path / "run2.log")
    assert again.wait(180) == 0, (tmp_path / "run2.log").read_text()[-3000:]
    copy_dups = check_per_key_order(journal_seqs(tmp_path / "copy"), expected)
    file_dups = check_per_key_order(file_seqs(tmp_path / "files"), expected)
    # at-least-once, and the replay of an interrupted batch resumes rather than starting over
    assert sum(copy_dups.values()) <= 700 and sum(file_dups.values()) <= 700


def test_outbox_pipeline_survives_kill_9_with_nothing_lost(postgres_dsn: str, tmp_path: Path) -> None:
    prepare_outbox(postgres_dsn)
    with Database(postgres_dsn) as db:
        for t in ("outbox_spark_claims", "outbox_spark_cursor"):
            with contextlib.suppress(Exception):  # not created yet
                db.execute(f"DELETE FROM {t}")
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "obx",
            "source": {
                "type": "outbox",
                "dsn": postgres_dsn,
                "max_records_per_batch": 300,
                "partitions": 2,
                "lease_ttl": "2s",
            },
            "sinks": [{"name": "copy", "type": "journal", "path": str(tmp_path / "copy")}],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "100ms"},
        },
    )
    writers = Writers(postgres_dsn, total=6000, keys=30, threads=3, batch=20, pause=0.005).start()
    proc = start(spec, log=tmp_path / "run1.log")
    try:
        wait_until(
            lambda: len(journal_seqs(tmp_path / "copy")) >= 1000,
            timeout=120,
            message="the outbox pipeline to get going",
        )
    finally:
        kill9(proc)
    writers.join(120)

    again = start(spec, "--once", log=tmp_path / "run2.log")
    assert again.wait(180) == 0, (tmp_path / "run2.log").read_text()[-3000:]
    dups = check_per_key_order(journal_seqs(tmp_path / "copy"), writers.expected)
    assert sum(dups.values()) <= 300
    with Database(postgres_dsn) as db:
        left = db.fetchone("SELECT count(*) FROM outbox")
    assert left is not None and left[0] <= 300  # at most the last batch, purged by the next commit


def test_sigterm_stops_cleanly_within_30_seconds(tmp_path: Path) -> None:
    import time

    source = tmp_path / "source"
    expected = write_sequences(source, keys=10, total=6000)
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "term",
            "source": {"type": "journal", "path": str(source), "max_records_per_batch": 200},
            "sinks": [{"name": "copy", "type": "journal", "path": str(tmp_path / "copy")}],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "50ms"},
        },
    )
    proc = start(spec, log=tmp_path / "run.log")
    try:
        wait_until(lambda: len(journal_seqs(tmp_path / "copy")) >= 1000, timeout=120, message="progress")
        proc.send_signal(signal.SIGTERM)  # to the driver only, as an orchestrator would
        sent = time.monotonic()
        code = proc.wait(40)
        assert time.monotonic() - sent <= 30, "SIGTERM must stop the pipeline within 30 s"
        assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill9(proc)
    # What was written is in order, and a restart completes the rest without loss.
    again = start(spec, "--once", log=tmp_path / "run2.log")
    assert again.wait(180) == 0, (tmp_path / "run2.log").read_text()[-3000:]
    check_per_key_order(journal_seqs(tmp_path / "copy"), expected)
