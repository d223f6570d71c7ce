"""``sluice status`` on real databases, a journal, a pipeline's checkpoints and a feed: every figure
checked against what the test put there (tests/support/overview.py says what that is)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.feed import Feed
from tests.support.cli import sluice
from tests.support.overview import DEAD, HEAD, IN_FLIGHT, ROWS, build

pytestmark = pytest.mark.timeout(120)


def status_json(config: Path) -> dict[str, Any]:
    result = sluice("status", "--config", str(config), "--format", "json", cwd=config.parent)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_every_figure_is_what_the_test_put_there(
    dialect: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    dsn = str(request.getfixturevalue(f"{dialect}_dsn"))
    # The feed lives in the same database as the outbox: its status queries run on every dialect too.
    built = build(tmp_path / "ws", dsn, feed_dsn=dsn)
    with Feed(dsn) as feed_client:
        feed_client.set_rate(5, attribute="tenant", value="acme", burst=2)  # a full bucket: 2 tokens
    report = status_json(built.config)
    assert set(report) >= {"outboxes", "journals", "pipelines", "feeds"}

    (outbox,) = report["outboxes"]
    assert outbox["name"] == "shop" and outbox["error"] is None
    assert (
        (outbox["rows"], outbox["in_flight"], outbox["dead_letters"])
        == (ROWS, IN_FLIGHT, DEAD)
        == (1234, 10, 2)
    )
    assert 0 <= outbox["oldest_age_seconds"] < 120
    leader = outbox["leader"]
    assert (leader["election"], leader["holder"], leader["epoch"]) == ("sluiceway", "harvester-a", 1)
    assert 0 <= leader["term_seconds"] < 120 and 3000 < leader["expires_in_seconds"] <= 3600
    assert outbox["health"] == "ok" and outbox["problems"] == []

    (journal,) = report["journals"]
    assert (journal["name"], journal["head"], journal["start"], journal["segments"]) == ("bus", HEAD, 0, 1)
    assert journal["bytes"] > 0
    assert journal["consumers"] == [{"name": "orders.lake", "offset": 60, "lag": 40}]

    (pipeline,) = report["pipelines"]
    assert (pipeline["name"], pipeline["source"], pipeline["health"]) == ("orders", "journal", "stuck")
    lake, db = pipeline["sinks"]
    assert (lake["name"], lake["state"], lake["committed_offset"], lake["lag"], lake["records"]) == (
        "lake", "ok", 80, 20, 80
    )  # fmt: skip
    assert (db["name"], db["state"], db["committed_offset"], db["lag"]) == ("db", "failed", 40, 60)
    assert db["error"]["offset"] == 42 and db["error"]["message"].startswith("ValueError: refused")
    assert pipeline["problems"] == [
        "sink db stopped at offset 42: ValueError: refused (the row violates orders_total_check)"
    ]

    (feed,) = report["feeds"]
    assert feed["partitions"] == [
        {"status": "available", "gate": 0, "count": 2},
        {"status": "failed", "gate": 0, "count": 1},
    ]
    assert feed["items"] == [
        {"status": "available", "gate": 0, "count": 5},
        {"status": "available", "gate": 1, "count": 1},
        {"status": "failed", "gate": 0, "count": 1},
    ]
    assert feed["items_by_status"] == {"available": 6, "failed": 1, "complete": 0}
    assert (feed["live_leases"], feed["expired_leases"]) == (1, 1)
    workers = {w["owner"]: (w["partitions"], w["live_leases"], w["expired_leases"]) for w in feed["workers"]}
    assert workers == {"worker-live": (1, 1, 0), "worker-gone": (1, 0, 1)}
    assert feed["rate_limits"] == [
        {"attribute": "tenant", "value": "acme", "max_rate": 5.0, "burst": 2.0, "tokens": 2.0}
    ]
    assert feed["scheduled"] == {"partitions": 0, "items": 0, "next_due": None}
    assert feed["health"] == "stuck"


def test_table_check_and_thresholds(sqlite_dsn: str, tmp_path: Path) -> None:
    built = build(tmp_path / "ws", sqlite_dsn)
    table = sluice("status", "--config", str(built.config), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "1234" in table.stdout and "orders.lake (40)" in table.stdout and "harvester-a" in table.stdout

    checked = sluice("status", "--config", str(built.config), "--check", cwd=tmp_path)
    assert checked.returncode == 1
    stuck = " ".join(checked.stderr.split())
    assert "pipeline orders: sink db stopped at offset 42" in stuck
    assert "feed work: 1 expired leases (threshold 0) held by worker-gone" in stuck

    # Thresholds come from the workspace: an outbox row older than 0s and a lag over 10 count too;
    # the failed sink always does. Without the pipeline and with expired leases allowed, all is well.
    workspace = yaml.safe_load(built.config.read_text())
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump({**workspace, "checks": {"outbox_oldest_age": 0, "pipeline_lag": 10}}))
    problems = " ".join(sluice("status", "-c", str(strict), "--check", cwd=tmp_path).stderr.split())
    assert "outbox shop: oldest row is" in problems and "(threshold 0s)" in problems
    assert "sink lake is 20 records behind (threshold 10)" in problems
    relaxed = tmp_path / "relaxed.yaml"
    relaxed.write_text(yaml.safe_dump({**workspace, "pipelines": [], "checks": {"expired_leases": 1}}))
    assert sluice("status", "-c", str(relaxed), "--check", cwd=tmp_path).returncode == 0


def test_what_cannot_be_read_is_said_and_the_rest_still_shown(tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "outboxes": [{"name": "gone", "dsn": f"sqlite:///{tmp_path / 'missing.db'}"}],
                "journals": [{"name": "none", "path": str(tmp_path / "nowhere")}],
                "pipelines": [str(tmp_path / "missing.yaml")],
            }
        )
    )
    report = status_json(config)
    assert [e["health"] for kind in ("outboxes", "journals", "pipelines") for e in report[kind]] == [
        "unavailable"
    ] * 3
    assert "missing.db does not exist" in report["outboxes"][0]["error"]
    assert report["outboxes"][0]["rows"] is None and report["pipelines"][0]["name"] == "missing"
    assert not (tmp_path / "missing.db").exists(), "status creates nothing"
    assert sluice("status", "-c", str(config), "--check", cwd=tmp_path).returncode == 1


def test_a_bad_workspace_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(yaml.safe_dump({"outboxes": [{"name": "shop", "dsn": "oracle://x/y"}]}))
    result = sluice("status", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 1 and "outboxes.0.dsn" in result.stderr
    missing = sluice("status", cwd=tmp_path / "..")
    assert missing.returncode == 1 and "no workspace file" in missing.stderr


def test_the_console_refuses_an_address_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text("{}\n")
    result = sluice("ui", "-c", str(config), "--addr", "0.0.0.0:0", cwd=tmp_path)
    assert result.returncode == 1 and "not a loopback address: give a --token" in " ".join(
        result.stderr.split()
    )
