"""The workspace file and the checks that judge a status report: pure rules on hand-made figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluiceway.config import validate
from sluiceway.errors import ConfigError
from sluiceway.overview import Checks, Workspace, evaluate, unhealthy


def report(**kinds: list[dict[str, Any]]) -> dict[str, Any]:
    base: dict[str, Any] = {"outboxes": [], "journals": [], "pipelines": [], "feeds": []}
    for kind, entries in kinds.items():
        base[kind] = [{"name": f"{kind}-{i}", "error": None, **e} for i, e in enumerate(entries)]
    return base


def test_thresholds_make_an_entry_stuck_and_say_why() -> None:
    r = report(
        outboxes=[
            {"oldest_age_seconds": 301.0, "dead_letters": 0},
            {"oldest_age_seconds": 299.0, "dead_letters": 9},
        ],
        journals=[{"consumers": [{"name": "c", "offset": 0, "lag": 10**6}]}],
        pipelines=[
            {"source": "journal", "sinks": [{"name": "s", "state": "ok", "lag": 10_001, "error": None}]},
            {
                "source": "postgres-cdc",
                "sinks": [{"name": "s", "state": "ok", "lag": 9_999, "error": None}],
                "cdc": {"slot": {"slot": "shop", "wal_retained_bytes": (1 << 30) + 1}},
            },
        ],
        feeds=[{"expired_leases": 1, "workers": [{"owner": "w1", "expired_leases": 1}]}],
    )
    evaluate(r, Checks())
    assert [e["health"] for e in r["outboxes"]] == ["stuck", "ok"], "dead letters are off by default"
    assert r["outboxes"][0]["problems"] == ["oldest row is 5m old (threshold 5m)"]
    assert r["journals"][0]["health"] == "ok", "consumer lag is off by default"
    assert r["pipelines"][0]["problems"] == ["sink s is 10001 records behind (threshold 10000)"]
    assert r["pipelines"][1]["problems"] == [
        "slot shop retains 1073741825 bytes of WAL (threshold 1073741824): is the pipeline's capture running?"
    ], "a CDC sink's lag is records; the WAL the slot holds has its own threshold"
    assert r["feeds"][0]["problems"] == ["1 expired leases (threshold 0) held by w1"]
    assert unhealthy(r)[0] == "outbox outboxes-0: oldest row is 5m old (threshold 5m)"


def test_checks_can_be_turned_off_or_on() -> None:
    r = report(
        outboxes=[{"oldest_age_seconds": 10**6, "dead_letters": 3}],
        journals=[{"consumers": [{"name": "c", "offset": 0, "lag": 11}]}],
        feeds=[{"expired_leases": 4, "workers": []}],
    )
    evaluate(r, Checks(outbox_oldest_age=None, dead_letters=2, journal_consumer_lag=10, expired_leases=None))
    assert r["outboxes"][0]["problems"] == ["3 dead letters (threshold 2)"]
    assert r["journals"][0]["problems"] == ["consumer c is 11 records behind (threshold 10)"]
    assert r["feeds"][0]["health"] == "ok"


def test_a_failed_sink_is_always_stuck_and_an_unreadable_entry_unavailable() -> None:
    failed = {"name": "db", "state": "failed", "lag": 0, "error": {"offset": 7, "message": "boom\ntrace"}}
    r = report(pipelines=[{"source": "kafka", "sinks": [failed]}], feeds=[{"error": "no such table"}])
    evaluate(r, Checks(pipeline_lag=None))
    assert r["pipelines"][0]["problems"] == ["sink db stopped at offset 7: boom"]
    assert (r["feeds"][0]["health"], r["feeds"][0]["problems"]) == (
        "unavailable",
        ["cannot be read: no such table"],
    )


def test_the_workspace_file_is_validated_at_the_edge() -> None:
    ws = validate(
        Workspace,
        {"outboxes": [{"name": "shop", "dsn": "sqlite:///app.db"}], "checks": {"outbox_oldest_age": "90s"}},
    )
    (shop,) = ws.outboxes
    assert (shop.table, shop.election, shop.lease_table) == ("outbox", "sluiceway", "sluiceway_leases")
    assert ws.checks.outbox_oldest_age == 90.0 and ws.checks.pipeline_lag == 10_000
    for bad, where in (
        ({"outboxes": [{"name": "shop", "dsn": "oracle://x"}]}, "outboxes.0.dsn"),
        ({"outboxes": [{"name": "a/b", "dsn": "sqlite:///a.db"}]}, "outboxes.0.name"),
        ({"journals": [{"name": "j", "path": "x"}, {"name": "j", "path": "y"}]}, "used twice"),
        ({"feeds": [{"name": "f", "dsn": "sqlite:///f.db", "extra": 1}]}, "feeds.0.extra"),
        ({"checks": {"pipeline_lag": -1}}, "checks.pipeline_lag"),
    ):
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            validate(Workspace, bad)


def test_the_demo_names_what_it_made_in_a_workspace_file(tmp_path: Path) -> None:
    from sluiceway.demo.run import write_workspace

    path = write_workspace(
        tmp_path, f"sqlite:///{tmp_path / 'shop.db'}", tmp_path / "journal", tmp_path / "p.yaml"
    )
    ws = Workspace.from_file(path)
    assert [o.election for o in ws.outboxes] == ["demo"] and ws.pipelines == [str(tmp_path / "p.yaml")]
    assert [j.path for j in ws.journals] == [str(tmp_path / "journal")] and ws.feeds[0].name == "fulfilment"
