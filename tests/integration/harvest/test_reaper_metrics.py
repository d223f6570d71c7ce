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
from tests.support.prometheus import prometheus

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
        assert samples['sluice_harvest_backlog_age_seconds{harvest="metered"}'] == 0, "drained: no backlog"

        # A real Prometheus scrapes the same series and evaluates the shipped rules over them.
        with prometheus([f"127.0.0.1:{port}"], tmp_path / "prometheus") as prom:
            published = 'sluice_harvest_records_total{harvest="metered",outcome="published"}'
            wait_until(lambda: bool(prom.query(published)), timeout=30, message="Prometheus to scrape")
            assert float(prom.query(published)[0]["value"][1]) >= 1234
            wait_until(
                lambda: (
                    len(prom.rules()) == 8
                    and all(r.get("lastEvaluation", "").startswith("20") for r in prom.rules())
                ),
                timeout=30,
                message="every rule evaluated",
            )
            assert [r["name"] for r in prom.rules() if r["health"] != "ok"] == []
            assert prom.firing("SluiceHarvestNoLeader") == [] and prom.firing("SluiceHarvestBacklogOld") == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_the_backlog_age_is_the_wait_of_the_row_at_the_head_read_at_each_scrape(
    any_dsn: str, tmp_path: Path
) -> None:
    from prometheus_client import generate_latest

    from sluiceway.harvest.metrics import HarvestMetrics

    def age(metrics: HarvestMetrics) -> float | None:
        for line in generate_latest(metrics.registry).decode().splitlines():
            if line.startswith("sluice_harvest_backlog_age_seconds{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    fill_outbox(any_dsn)
    metrics = HarvestMetrics("h", destination="journal", outbox=(any_dsn, "outbox"))
    try:
        first = age(metrics)
        assert first is not None and first >= 0
        wait_until(lambda: (age(metrics) or 0) >= first + 1, timeout=10, message="the head row to age")
    finally:
        metrics.close()

    # The database away: the scrape still answers, without the sample (and no connection is kept).
    away = HarvestMetrics("h", outbox=(f"sqlite:///{tmp_path / 'gone.db'}", "outbox"))
    try:
        assert age(away) is None and away._backlog is not None and away._backlog._db is None
    finally:
        away.close()
    assert not (tmp_path / "gone.db").exists(), "read-only: the scrape creates nothing"
