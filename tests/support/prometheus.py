"""A private Prometheus server (Debian's ``prometheus`` package) for the tests: it scrapes the
targets it is given every second and evaluates deploy/prometheus/alerts.yml every second, with
each rule's ``for:`` cut to one second (the expressions are the shipped ones; only the wait is
shortened, so a test need not sit through minutes)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sluiceway.testing import free_port, wait_until

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


@dataclass
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        alerts: list[dict[str, Any]] = body["data"]["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
        return [rule for group in body["data"]["groups"] for rule in group["rules"]]

    def firing(self, name: str) -> list[dict[str, str]]:
        """The labels of each firing alert ``name``."""
        return [
            a["labels"] for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]


@contextmanager
def prometheus(targets: list[str], root: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make test` (scripts/services.sh installs it)")
    root.mkdir(parents=True, exist_ok=True)
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    (root / "alerts.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [{"job_name": "sluice", "static_configs": [{"targets": targets}]}],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # stop waiting: it died (said below)

        wait_until(ready, timeout=30, message="Prometheus to be ready")
        assert proc.poll() is None, (root / "prometheus.log").read_text()[-2000:]
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
