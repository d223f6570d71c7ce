"""Offset arithmetic for the streaming sources: pure functions, tested without Spark.

Spark gives a source ``latestOffset(start, limit)`` and later ``partitions(start, end)``; these
functions decide *how far* a micro-batch goes (admission control, Trigger.AvailableNow targets)
and *how it splits* into tasks.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluiceway.pipeline.errors import SourceOptionError

#: Default ``maxRecordsPerBatch`` of every sluiceway source.
DEFAULT_MAX_RECORDS = 100_000


def parse_max_records(value: str | None, default: int = DEFAULT_MAX_RECORDS) -> int:
    if value is None or value == "":
        return default
    problem = f"maxRecordsPerBatch must be a positive integer, got {value!r}"
    try:
        n = int(value)
    except ValueError:
        raise SourceOptionError("maxRecordsPerBatch", problem) from None
    if n < 1:
        raise SourceOptionError("maxRecordsPerBatch", problem)
    return n


def next_end(start: int, head: int, max_rows: int | None, target: int | None = None) -> int:
    """End (exclusive) of the next batch of a single ordered log.

    ``head``: the log's next offset; ``max_rows``: the read limit (``None`` = all available);
    ``target``: the Trigger.AvailableNow ceiling. Never goes backwards: a head below ``start``
    (a journal truncated by hand) yields ``start``, i.e. no new data.
    """
    end = head if target is None else min(head, target)
    if max_rows is not None:
        end = min(end, start + max_rows)
    return max(start, end)


def split_range(lo: int, hi: int, parts: int, min_size: int = 1) -> list[tuple[int, int]]:
    """Split ``[lo, hi)`` into at most ``parts`` contiguous, near-equal ranges of ≥ ``min_size``."""
    total = hi - lo
    if total <= 0:
        return []
    parts = max(1, min(parts, total // max(min_size, 1) or 1))
    step, extra = divmod(total, parts)
    out = []
    at = lo
    for i in range(parts):
        size = step + (1 if i < extra else 0)
        out.append((at, at + size))
        at += size
    return out


def distribute_limit(
    start: Mapping[str, int], latest: Mapping[str, int], max_rows: int | None
) -> dict[str, int]:
    """Per-partition end offsets for a multi-partition log (Kafka) under a total row limit.

    Each partition may advance from ``start`` (default 0 for a new partition) towards
    ``latest``. With a limit, the budget is shared in proportion to each partition's backlog
    (largest remainders get the leftovers, ties by partition name), so one busy partition cannot
    starve the others, and the total never exceeds ``max_rows``.
    """
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    ends = {p: max(start.get(p, 0), latest[p]) if backlog[p] else start.get(p, 0) for p in latest}
    for p, s in start.items():
        ends.setdefault(p, s)  # a partition that vanished keeps its position
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return ends
    shares = {p: backlog[p] * max_rows // total for p in backlog}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda p: (-(backlog[p] * max_rows % total), p))
    for p in by_remainder:
        if left <= 0:
            break
        if shares[p] < backlog[p]:
            shares[p] += 1
            left -= 1
    return {**ends, **{p: start.get(p, 0) + shares[p] for p in backlog}}


def cap_to_target(ends: Mapping[str, int], target: Mapping[str, int] | None) -> dict[str, int]:
    """Clamp per-partition ends to a Trigger.AvailableNow target (partitions not in it stay put)."""
    if target is None:
        return dict(ends)
    return {p: min(e, target[p]) if p in target else e for p, e in ends.items()}


def take_one(start: Mapping[str, int], latest: Mapping[str, int]) -> dict[str, int]:
    """Advance the first partition (by name) that has data by exactly one offset (``step``)."""
    ends = {p: start.get(p, 0) for p in set(start) | set(latest)}
    for p in sorted(latest):
        if latest[p] > ends[p]:
            ends[p] += 1
            break
    return ends
