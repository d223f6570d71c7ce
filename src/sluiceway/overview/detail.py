"""The drill-down reads behind ``sluice ui``'s pages: a journal's records from X to Y, where each
pipeline sink stands and the record it stopped on, a feed's partitions and failed items.

Reads only, bounded (every listing has a limit), no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluiceway.feed import Feed, Partition, Status
from sluiceway.journal import Journal
from sluiceway.overview.values import iso, preview

#: Most records one journal page shows.
MAX_RECORDS = 500


def journal_records(path: str, start: int, end: int, limit: int = 100) -> list[dict[str, Any]]:
    """Committed records with ``start <= offset < end`` (at most ``limit``), values previewed."""
    limit = max(1, min(limit, MAX_RECORDS))
    with Journal.open(path, read_only=True) as journal:
        records = journal.read(start, min(end, start + limit))
        return [
            {
                "offset": r.offset,
                "namespace": r.namespace,
                "key": r.key,
                "value": preview(r.value, 300),
                "headers": [list(h) for h in r.headers],
                "timestamp": r.timestamp.isoformat(),
            }
            for r in records
        ]


def stopped_record(spec_path: str, offset: int) -> dict[str, Any] | None:
    """The source's record at ``offset`` (the one a failed sink stopped on), read without Spark."""
    from sluiceway.pipeline import PipelineSpec
    from sluiceway.pipeline.operator import inspect

    rows = inspect(PipelineSpec.from_yaml(spec_path), offset, offset + 1, limit=1).to_pylist()
    if not rows:
        return None
    row = rows[0]
    return {
        "offset": row["offset"],
        "namespace": row["namespace"],
        "key": row["key"],
        "value": preview(row["value"], 2000),
        "timestamp": iso(row["timestamp"]),
    }


@dataclass(frozen=True, slots=True)
class FeedPage:
    partitions: list[Partition]
    next_after: int | None
    failed: list[tuple[Partition, list[dict[str, Any]]]]


def feed_page(feed: Feed, after: int = 0, limit: int = 50) -> FeedPage:
    """One page of partitions, and the failed partitions with their failed items (first page)."""
    page = feed.partitions(after=after, limit=limit)
    failed = []
    for partition in feed.partitions(Status.FAILED, limit=20).rows:
        items = [
            {
                "id": i.id,
                "gate": i.gate,
                "attempts": i.attempts,
                "error": i.last_error,
                "data": preview(i.data),
            }
            for i in feed.items(partition.name, limit=200).rows
            if i.status is Status.FAILED
        ]
        failed.append((partition, items))
    return FeedPage(page.rows, page.next_after, failed)
