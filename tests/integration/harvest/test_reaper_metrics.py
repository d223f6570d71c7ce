"""``sluice reap --metrics-addr`` on the embedded default (SQLite → journal, database lease): the
documented series are served and move as rows are published."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from sluiceway.testing import free_port, wait_until
from tests.support.metrics import scrape, sluice_process
from tests.support.outbox import outbox_count
from tests.support.overview import fill_outbox

pytestmark = pytest.mark.timeout(120)


def test_the_harvester_serves_its_series_and_they_move(sqlite_dsn: str, tmp_path: Path) -> None:
    fill_outbox(sqlite_dsn)  # 1,234 rows; its lease row is another election's ("sluiceway")
    config = tmp_path / "reaper.yaml"
    harvest = {
        "name": "metered",
        "dataSource": sqlite_dsn,
        "journal": {"path": str(tmp_path / "journal")},
        "limits": {"minMetricsInterval": "200ms"},
    }
    config.write_text(yaml.safe_dump({"harvest": harvest, "logging": {"level": "Warn"}}))
    port = free_port()
    with sluice_process(
        ["reap", "-f", str(config), "--metrics-addr", f":{port}"], tmp_path / "reap.log"
    ) as proc:
        wait_until(lambda: outbox_count(sqlite_dsn) == 0, timeout=60, message="the outbox to drain")

        def published() -> bool:
            samples = scrape(port)
            return (
                samples.get('sluice_harvest_records_total{harvest="metered",outcome="published"}', 0) >= 1234
            )

        wait_until(published, timeout=30, message="the published counter to reach 1234")
        samples = scrape(port)
        assert samples['sluice_harvest_leader{harvest="metered"}'] == 1
        assert samples['sluice_harvest_records_total{harvest="metered",outcome="purged"}'] >= 1234
        assert samples['sluice_harvest_latency_seconds_count{harvest="metered"}'] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
