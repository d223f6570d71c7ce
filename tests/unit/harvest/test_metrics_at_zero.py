"""A fresh process's series exist at zero (a dashboard shows 0, not "no data"): the harvester's
outcomes, latency and parked keys, and the capture's counters, latency and leadership."""

from __future__ import annotations

from prometheus_client import generate_latest

from sluiceway.capture.metrics import CaptureMeter
from sluiceway.harvest.metrics import OUTCOMES, HarvestMetrics


def samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_the_harvesters_series_are_there_before_anything_happens() -> None:
    metrics = HarvestMetrics("h")
    got = samples(generate_latest(metrics.registry).decode())
    for outcome in OUTCOMES:
        assert got[f'sluice_harvest_records_total{{harvest="h",outcome="{outcome}"}}'] == 0
    assert got['sluice_harvest_latency_seconds_count{harvest="h"}'] == 0
    assert got['sluice_harvest_keys_parked_total{harvest="h"}'] == 0
    assert got['sluice_harvest_leader{harvest="h"}'] == 0


def test_the_captures_series_are_there_before_anything_happens() -> None:
    meter = CaptureMeter("c1", "kafka")
    meter.leader(True)  # leadership before the endpoint: it says so once served
    host, port = meter.serve("127.0.0.1:0")
    try:
        import urllib.request

        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            got = samples(response.read().decode())
    finally:
        meter.close()
    for name in ("changes", "bytes", "skipped", "dead_letters"):
        assert got[f'sluice_capture_{name}_total{{capture="c1"}}'] == 0
    assert got['sluice_capture_publish_latency_seconds_count{capture="c1"}'] == 0
    assert got['sluice_capture_leader{capture="c1"}'] == 1
