"""The drill-down reads behind ``sluice ui``'s pages: a journal's records from X to Y, where each
pipeline sink stands and the record it stopped on, a feed's partitions and failed items.

Reads only, bounded (every listing has a limit), no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluiceway.db import Database
from sluiceway.feed import Feed, Partition, Status
from sluiceway.journal import Journal
from sluiceway.overview.report import PipelineEntry
from sluiceway.overview.status import load_pipeline
from sluiceway.overview.values import iso, preview
from sluiceway.overview.workspace import FeedWatch
from sluiceway.pipeline.state import SinkHealth

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


def stopped_record(spec_path: str, offset: int, root: str | None = None) -> dict[str, Any] | None:
    """The source's record at ``offset`` (the one a failed sink stopped on), read without Spark;
    the spec's relative paths from ``root`` (the workspace's)."""
    from sluiceway.pipeline.operator import inspect

    rows = inspect(load_pipeline(spec_path, root), offset, offset + 1, limit=1).to_pylist()
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


def stopped_records(entry: PipelineEntry, root: str | None = None) -> dict[str, Any]:
    """Sink name → the record each failed sink of a pipeline's status ``entry`` stopped on (or
    why it cannot be read: the page still shows the sink's error without it)."""
    stopped: dict[str, Any] = {}
    for sink in entry.sinks or []:
        offset = (sink.error or {}).get("offset")
        if sink.state == SinkHealth.FAILED and isinstance(offset, int) and entry.spec is not None:
            try:
                stopped[sink.name] = stopped_record(entry.spec, offset, root)
            except Exception as exc:  # any source error: shown in place of the record
                stopped[sink.name] = {"error": f"cannot read the record: {exc}"}
    return stopped


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


def feed_listing(watch: FeedWatch, after: int = 0) -> FeedPage:
    """The console's feed page: :func:`feed_page` of the watched feed, read on a read-only
    connection."""
    with Database(watch.dsn, read_only=True) as db, Feed(db, prefix=watch.prefix, migrate=False) as feed:
        return feed_page(feed, after=after)
