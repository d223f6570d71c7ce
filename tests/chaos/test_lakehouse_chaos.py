"""kill -9 of a pipeline writing Delta and Iceberg tables, at the worst moments, then `--once`:
every record exactly once in the append tables, the mirror equal to the source.

The test watches the Delta table's log and kills the pipeline (driver, JVM and workers) the
moment a new table version appears: after the table's commit, before Spark records the batch
in its checkpoint. The restart then runs that batch again, and the markers must make it commit
nothing. The other sinks, as separate queries, are killed wherever they happen to be.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from sluiceway.journal import Journal
from tests.support.lake import delta_log, read_delta, read_iceberg
from tests.support.pipeline import kill9, write_spec
from tests.support.pipeline import start_pipeline as start

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def spark_batches(checkpoint: Path) -> int:
    """Batches Spark has recorded as committed for one sink's query (-1: none)."""
    done = [int(p.name) for p in checkpoint.rglob("commits/*") if p.name.isdigit()]
    return max(done, default=-1)


def test_kill_9_between_table_and_spark_commits_then_once_is_exact(tmp_path: Path) -> None:
    source = tmp_path / "source"
    total, keys = 1500, 60
    expected: dict[str, int] = {}
    with Journal.open(source, fsync=False) as j, j.append() as tx:
        for i in range(total):
            key = f"k{i % keys}"
            tx.write(key, json.dumps({"id": i % keys, "seq": i}).encode(), namespace="orders")
            expected[key] = i
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    spec = write_spec(
        tmp_path / "spec.yaml",
        {
            "name": "lakechaos",
            "source": {"type": "journal", "path": str(source), "max_records_per_batch": 150},
            "sinks": [
                {"name": "appended", "type": "delta", "path": str(tmp_path / "appended")},
                {
                    "name": "mirror",
                    "type": "delta",
                    "path": str(tmp_path / "mirror"),
                    "mode": "mirror",
                    "columns": "json",
                },
                {"name": "iceberg", "type": "iceberg", "catalog": catalog, "table": "lake.appended"},
            ],
            "checkpoint": str(tmp_path / "cp"),
            "trigger": {"interval": "50ms"},
        },
    )
    log_dir = tmp_path / "appended" / "_delta_log"
    ahead = 0  # kills that left the table a batch ahead of Spark's checkpoint
    for round_ in range(2):
        seen = len(list(log_dir.glob("*.json"))) if log_dir.exists() else 0
        proc = start(spec, log=tmp_path / f"run{round_}.log")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if log_dir.exists() and len(list(log_dir.glob("*.json"))) > seen:
                    break  # a new table version: kill now, before Spark's own commit of it
                time.sleep(0.002)
        finally:
            kill9(proc)
        _files, txns, _commits = delta_log(tmp_path / "appended")
        table_batch = max(txns.values(), default=-1)
        if table_batch > spark_batches(tmp_path / "cp" / "appended"):
            ahead += 1
    assert ahead >= 1, "no kill landed between the table's commit and Spark's; nothing was tested"

    again = start(spec, "--once", log=tmp_path / "final.log")
    assert again.wait(240) == 0, (tmp_path / "final.log").read_text()[-3000:]

    for rows in (read_delta(tmp_path / "appended"), read_iceberg(catalog, "lake.appended")):
        assert Counter(r["offset"] for r in rows) == Counter(range(total)), "not exactly once"
    mirror = {r["key"]: r["seq"] for r in read_delta(tmp_path / "mirror")}
    assert mirror == expected
