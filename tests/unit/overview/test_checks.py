"""The checks that judge a status report: pure rules on hand-made figures."""

from __future__ import annotations

from typing import Any

from sluiceway.overview import Checks, evaluate, unhealthy


def report(**kinds: list[dict[str, Any]]) -> dict[str, Any]:
    base: dict[str, Any] = {"outboxes": [], "journals": [], "pipelines": [], "feeds": [], "captures": []}
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


def capture(**fields: Any) -> dict[str, Any]:
    """A capture entry that is healthy unless ``fields`` say otherwise."""
    entry: dict[str, Any] = {
        "slot_name": "shop",
        "election": {"kind": "database", "name": "capture.shop"},
        "slot": {"slot": "shop", "confirmed_lsn": "0/16B3748", "wal_retained_bytes": 4096},
        "leader": {"holder": "host-1", "expires_in_seconds": 4.2},
    }
    return {**entry, **fields}


def test_a_capture_is_stuck_without_its_slot_or_a_leader_or_past_the_wal_threshold() -> None:
    r = report(
        captures=[
            capture(),
            capture(slot=None),
            capture(slot={"slot": "shop", "wal_retained_bytes": (1 << 30) + 1}),
            capture(leader=None),
            capture(leader={"holder": "host-1", "expires_in_seconds": -0.5}),
            capture(election={"kind": "kafka", "name": "capture.shop"}, leader=None),
            capture(error="connection refused"),
        ]
    )
    evaluate(r, Checks())
    problems = [e["problems"] for e in r["captures"]]
    assert problems == [
        [],
        ["slot shop does not exist: has the capture run?"],
        ["slot shop retains 1073741825 bytes of WAL (threshold 1073741824): is sluice capture keeping up?"],
        ["no process holds the lease: is sluice capture running?"],
        ["no process holds the lease: is sluice capture running?"],  # the holder's lease ran out
        [],  # NELI (kafka) has no lease row to read: no leader is not a problem
        ["cannot be read: connection refused"],
    ]
    assert [e["health"] for e in r["captures"]] == ["ok", *["stuck"] * 4, "ok", "unavailable"]
    assert unhealthy(r)[0] == "capture captures-1: slot shop does not exist: has the capture run?"


def test_the_capture_wal_threshold_is_the_cdc_one_and_can_be_turned_off() -> None:
    big = {"slot": "shop", "wal_retained_bytes": 10**12}
    r = report(captures=[capture(slot=big)])
    evaluate(r, Checks(cdc_lag_bytes=None))
    assert r["captures"][0]["health"] == "ok"
    evaluate(r, Checks(cdc_lag_bytes=10**12 - 1))
    assert r["captures"][0]["problems"][0].startswith("slot shop retains 1000000000000 bytes of WAL")
