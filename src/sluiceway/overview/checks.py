"""Whether something is stuck: the workspace's thresholds applied to a status report.

Pure functions over the report's entries (no I/O), so every rule is tested on hand-made figures.
An entry is ``unavailable`` when it could not be read, ``stuck`` when a threshold is crossed, a
pipeline sink has failed or a capture has no slot or no leader, else ``ok``; ``problems`` says
why, one line each.
"""

from __future__ import annotations

from typing import Any

from sluiceway.overview.workspace import SINGULAR, Checks
from sluiceway.pipeline.state import SinkHealth


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def outbox_problems(entry: dict[str, Any], checks: Checks) -> list[str]:
    problems = []
    age = entry.get("oldest_age_seconds")
    if checks.outbox_oldest_age is not None and age is not None and age > checks.outbox_oldest_age:
        problems.append(f"oldest row is {_seconds(age)} old (threshold {_seconds(checks.outbox_oldest_age)})")
    dead = entry.get("dead_letters")
    if checks.dead_letters is not None and dead is not None and dead > checks.dead_letters:
        problems.append(f"{dead} dead letters (threshold {checks.dead_letters})")
    return problems


def journal_problems(entry: dict[str, Any], checks: Checks) -> list[str]:
    if checks.journal_consumer_lag is None:
        return []
    return [
        f"consumer {c['name']} is {c['lag']} records behind (threshold {checks.journal_consumer_lag})"
        for c in entry.get("consumers") or []
        if c["lag"] > checks.journal_consumer_lag
    ]


def pipeline_problems(entry: dict[str, Any], checks: Checks) -> list[str]:
    # A sink's lag is records of its source (for CDC: of the capture's journal); the WAL a CDC slot
    # retains — the capture behind, or the pipeline stopped — has its own threshold.
    problems = []
    unit, limit = "records", checks.pipeline_lag
    slot = (entry.get("cdc") or {}).get("slot") or {}
    retained = slot.get("wal_retained_bytes")
    if checks.cdc_lag_bytes is not None and retained is not None and retained > checks.cdc_lag_bytes:
        problems.append(
            f"slot {slot.get('slot')} retains {retained} bytes of WAL (threshold {checks.cdc_lag_bytes}): "
            "is the pipeline's capture running?"
        )
    for sink in entry.get("sinks") or []:
        if sink["state"] == SinkHealth.FAILED:
            error = sink.get("error") or {}
            at = f" at offset {error['offset']}" if error.get("offset") is not None else ""
            message = str(error.get("message", "")).splitlines()[0] if error.get("message") else ""
            problems.append(f"sink {sink['name']} stopped{at}: {message}"[:300])
        lag = sink.get("lag")
        if limit is not None and lag is not None and lag > limit:
            problems.append(f"sink {sink['name']} is {lag} {unit} behind (threshold {limit})")
    return problems


def feed_problems(entry: dict[str, Any], checks: Checks) -> list[str]:
    expired = entry.get("expired_leases")
    if checks.expired_leases is not None and expired is not None and expired > checks.expired_leases:
        owners = [w["owner"] for w in entry.get("workers") or [] if w["expired_leases"]]
        return [f"{expired} expired leases (threshold {checks.expired_leases}) held by {', '.join(owners)}"]
    return []


def capture_problems(entry: dict[str, Any], checks: Checks) -> list[str]:
    # A capture that never ran has no slot; one that stopped leaves its slot holding WAL and its
    # lease to run out (a stop releases it at once). Either says the daemon is not doing its job.
    problems = []
    slot = entry.get("slot")
    if slot is None:
        problems.append(f"slot {entry.get('slot_name')} does not exist: has the capture run?")
    else:
        retained = slot.get("wal_retained_bytes")
        if checks.cdc_lag_bytes is not None and retained is not None and retained > checks.cdc_lag_bytes:
            problems.append(
                f"slot {slot.get('slot')} retains {retained} bytes of WAL "
                f"(threshold {checks.cdc_lag_bytes}): is sluice capture keeping up?"
            )
    stuck = (entry.get("refusals") or {}).get("stuck")
    if stuck:
        problems.append(
            f"stopped on a change its destination refuses: {stuck['table']} key {stuck['key']!r} at "
            f"{stuck['lsn']} ({stuck['refusal']}): sluice capture inspect -f {entry.get('file')}"
        )
    election = entry.get("election") or {}
    leader = entry.get("leader")
    # The database clock decides expiry: a holder whose lease ran out holds nothing.
    if election.get("kind") == "database" and (leader is None or leader["expires_in_seconds"] <= 0):
        problems.append("no process holds the lease: is sluice capture running?")
    return problems


_RULES = {
    "outboxes": outbox_problems,
    "journals": journal_problems,
    "pipelines": pipeline_problems,
    "feeds": feed_problems,
    "captures": capture_problems,
}


def evaluate(report: dict[str, Any], checks: Checks) -> None:
    """Set every entry's ``problems`` and ``health`` in place."""
    for kind, rule in _RULES.items():
        for entry in report.get(kind, []):
            if entry.get("error"):
                entry["problems"] = [f"cannot be read: {entry['error']}"]
                entry["health"] = "unavailable"
                continue
            entry["problems"] = rule(entry, checks)
            entry["health"] = "stuck" if entry["problems"] else "ok"


def unhealthy(report: dict[str, Any]) -> list[str]:
    """``kind name: problem`` for every problem in the report (empty: all is well)."""
    return [
        f"{SINGULAR[kind]} {entry['name']}: {problem}"
        for kind in _RULES
        for entry in report.get(kind, [])
        for problem in entry.get("problems", [])
    ]
