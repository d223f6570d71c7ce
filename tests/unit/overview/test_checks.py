"""The checks that judge a status report: pure rules on hand-made figures."""

from __future__ import annotations

from typing import Any

from sluiceway.overview import Checks, evaluate, unhealthy


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
