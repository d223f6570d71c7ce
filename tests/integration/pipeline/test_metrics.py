"""``sluice pipeline run --metrics-addr``: one small pipeline (journal → journal, and → PostgreSQL
through a table that refuses one record) scraped while it runs; per sink, the batches, records,
batch durations and lag move as records go through; the refusing sink stops, and a real
Prometheus scraping the run fires the shipped ``SluicePipelineSinkStopped`` alert for it alone."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from sluiceway.journal import Journal
from sluiceway.testing import free_port, wait_until
from tests.support.journal import make_journal
from tests.support.metrics import scrape
from tests.support.pipeline import kill9, start_pipeline, write_spec
from tests.support.prometheus import prometheus

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

SINK = '{pipeline="metered",sink="copy"}'


def test_a_running_pipeline_serves_per_sink_metrics(tmp_path: Path, postgres_dsn: str) -> None:
    source, target = tmp_path / "in", tmp_path / "out"
    make_journal(
        source,
        [("orders.created", "poison" if i == 150 else f"k{i % 10}", str(i).encode()) for i in range(200)],
    )
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS metered_view")
        conn.execute(
            'CREATE TABLE metered_view (key TEXT PRIMARY KEY, value BYTEA, "offset" BIGINT, op TEXT, '
            "CHECK (key <> 'poison'))"
        )
    spec = write_spec(
        tmp_path / "metered.yaml",
        {
            "name": "metered",
            "source": {"type": "journal", "path": str(source)},
            "sinks": [
                {"name": "copy", "type": "journal", "path": str(target)},
                {
                    "name": "db",
                    "type": "postgres",
                    "dsn": postgres_dsn,
                    "table": "metered_view",
                    "retry": {"attempts": 1, "backoff": "10ms", "record_attempts": 1},
                    "parallelism": 1,
                },
            ],
            "checkpoint": str(tmp_path / "checkpoints"),
            "trigger": {"interval": "500ms"},
        },
    )
    port = free_port()
    proc = start_pipeline(spec, "--metrics-addr", f"127.0.0.1:{port}", log=tmp_path / "run.log")
    try:

        def written(n: int) -> bool:
            samples = scrape(port)
            return (
                samples.get(f"sluice_pipeline_records_total{SINK}") == n
                and samples.get(f"sluice_pipeline_lag{SINK}") == 0
            )

        wait_until(lambda: written(200), timeout=180, message="200 records written and no lag")
        first = scrape(port)
        assert first[f"sluice_pipeline_batches_total{SINK}"] >= 1
        assert first[f"sluice_pipeline_batch_duration_seconds_count{SINK}"] >= 1
        assert first[f"sluice_pipeline_failures_total{SINK}"] == 0
        with Journal.open(source, fsync=False) as journal, journal.append() as tx:
            for i in range(50):
                tx.write(f"k{i % 10}", b"more", namespace="orders.created")
        wait_until(lambda: written(250), timeout=60, message="the next 50 records")
        assert (
            scrape(port)[f"sluice_pipeline_batches_total{SINK}"]
            > first[f"sluice_pipeline_batches_total{SINK}"]
        )
        # The db sink stopped on the record its table refuses; the run goes on and says so.
        stopped = 'sluice_pipeline_sink_stopped{pipeline="metered",sink="db"}'
        wait_until(lambda: scrape(port).get(stopped) == 1, timeout=60, message="the db sink to stop")
        assert scrape(port)[f"sluice_pipeline_sink_stopped{SINK}"] == 0
        with prometheus([f"127.0.0.1:{port}"], tmp_path / "prometheus") as prom:
            wait_until(
                lambda: bool(prom.firing("SluicePipelineSinkStopped")),
                timeout=60,
                message="SluicePipelineSinkStopped to fire",
            )
            (alert,) = prom.firing("SluicePipelineSinkStopped")
            assert (alert["pipeline"], alert["sink"], alert["severity"]) == ("metered", "db", "critical")
        proc.send_signal(signal.SIGTERM)
        # A run with a stopped sink ends with its one line, exit 1 (the copy sink finished).
        assert proc.wait(60) == 1, (tmp_path / "run.log").read_text()[-3000:]
        assert "error: sink 'db' stopped at offset 150: " in (tmp_path / "run.log").read_text()
    finally:
        if proc.poll() is None:
            kill9(proc)
