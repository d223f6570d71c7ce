"""``sluice reap --metrics-addr`` on the embedded default (SQLite → journal, database lease): the
documented series are served and move as rows are published."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sluiceway import OutboxRecord, Stasher
from sluiceway.config import validate
from sluiceway.overview import Workspace
from sluiceway.overview.history import HistoryError, PrometheusHistory, open_history
from sluiceway.testing import free_port, wait_until
from sluiceway.ui import Console, create_app
from tests.support.metrics import scrape, sluice_process
from tests.support.outbox import outbox_count, user_connection
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

            # The console's history read from this Prometheus: the workspace names it.
            workspace = validate(
                Workspace,
                {
                    "outboxes": [{"name": "shop", "dsn": sqlite_dsn, "election": "metered"}],
                    "prometheus": {"url": prom.url},
                },
            )
            history, sampler = open_history(workspace)
            assert isinstance(history, PrometheusHistory) and sampler is None, "Prometheus keeps it"

            def charted() -> dict[str, list[float | None]]:
                assert history is not None
                return {s.name: s.values for s in history.read("outbox/shop", 300).series}

            # More rows while Prometheus scrapes: a rate to see.
            conn = user_connection(sqlite_dsn)
            stash = Stasher().prepare(conn)
            for i in range(300):
                stash.stash(OutboxRecord("orders.created", f"late-{i % 7}", "{}"))
            conn.commit()
            conn.close()
            wait_until(
                lambda: any(v for v in charted()["published_rate"]),
                timeout=30,
                message="a published rate in Prometheus's history",
            )
            lines = charted()
            assert list(lines) == [
                "published_rate",
                "backlog_age_seconds",
                "in_flight",
                "latency_p99_seconds",
                "dead_letter_rate",
            ]
            assert any(v is not None for v in lines["backlog_age_seconds"])
            answer = _history_api(Console(workspace, history=history), "outbox/shop")
            assert answer["source"] == "prometheus" and answer["part"] == "outbox/shop"
            assert answer["series"][0]["name"] == "published_rate"
            history.close()
            # Prometheus away: one line naming it.
            gone = PrometheusHistory(f"http://127.0.0.1:{free_port()}", workspace, timeout=2)
            with pytest.raises(HistoryError, match=r"prometheus at http://127\.0\.0\.1:\d+: "):
                gone.read("outbox/shop", 300)
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


def _history_api(console: Console, part: str) -> dict[str, Any]:
    async def get() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=create_app(console))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
            response = await web.get("/api/history", params={"part": part, "range": "5m"})
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

    return asyncio.run(get())
