"""Feed sink: every record becomes a feed partition holding the record's value as its one item.

The partition name comes from a template (default ``{namespace}/{key}/{offset}``, unique per
record), and partitions are added with ``if_exists="skip"``, so a replayed batch adds nothing
twice. ``if_exists="append"`` with a template such as ``{namespace}/{key}`` gathers a key's
records as items of one partition instead.

A record's trace (its ``traceparent`` and ``tracestate`` headers) becomes its partition's
attributes of those names, which a worker's span continues (the feed's items have no headers of
their own); a partition that gathers many records keeps the trace of the first that carried one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.pipeline.errors import DestinationUnreachable, one_line
from sluiceway.pipeline.sinks.base import ClientSink
from sluiceway.tracing import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from sluiceway.feed import Feed


class FeedSink(ClientSink["Feed"]):
    def __init__(
        self,
        dsn: str,
        template: str,
        *,
        gate: int = 0,
        prefix: str = "feed_",
        if_exists: Literal["skip", "append"] = "skip",
    ) -> None:
        self.dsn = dsn
        self.template = template
        self.gate = gate
        self.prefix = prefix
        self.if_exists = if_exists

    def _open(self) -> Feed:
        from sluiceway.feed import Feed

        return Feed(self.dsn, prefix=self.prefix)

    def _write(self, feed: Feed, table: pa.Table, token: str) -> None:
        from sluiceway.feed import NewPartition

        groups: dict[str, list[bytes]] = {}
        traces: dict[str, dict[str, str]] = {}
        rows = table.select(["offset", "namespace", "key", "value"]).to_pylist()
        for row, trace in zip(rows, _traces(table), strict=True):
            name = self.template.format(namespace=row["namespace"], key=row["key"], offset=row["offset"])
            groups.setdefault(name, []).append(row["value"] if row["value"] is not None else b"")
            if trace and name not in traces:
                traces[name] = trace
        feed.add_many(
            [NewPartition(name, items, self.gate, traces.get(name)) for name, items in groups.items()],
            if_exists=self.if_exists,
        )

    def _release(self, feed: Feed) -> None:
        feed.close()

    def _failure(self, exc: Exception) -> Exception | None:
        if isinstance(exc, DatabaseUnavailableError | DatabaseRefusedError):
            # Not the records' fault: the sink waits for the database (a refusal stops it at once).
            return DestinationUnreachable(one_line(exc), permanent=isinstance(exc, DatabaseRefusedError))
        return None


def _traces(table: pa.Table) -> list[dict[str, str]]:
    """Each record's trace context headers (``{}``: none), read row by row only when some record
    of the batch has one."""
    if "headers" not in table.column_names:
        return [{}] * table.num_rows
    column = table.column("headers")
    names = pc.list_flatten(column).combine_chunks().field("key") if column.num_chunks else pa.array([])
    if not pc.any(pc.equal(names, TRACEPARENT)).as_py():
        return [{}] * table.num_rows
    return [
        {k: v for k, v in ((h["key"], h["value"]) for h in headers or ()) if k in (TRACEPARENT, TRACESTATE)}
        for headers in column.to_pylist()
    ]
