"""Feed sink: every record becomes a feed partition holding the record's value as its one item.

The partition name comes from a template (default ``{namespace}/{key}/{offset}``, unique per
record), and partitions are added with ``if_exists="skip"``, so a replayed batch adds nothing
twice. ``if_exists="append"`` with a template such as ``{namespace}/{key}`` gathers a key's
records as items of one partition instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.pipeline.errors import DestinationUnreachable, one_line
from sluiceway.pipeline.sinks.base import ClientSink

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
        for row in table.select(["offset", "namespace", "key", "value"]).to_pylist():
            name = self.template.format(namespace=row["namespace"], key=row["key"], offset=row["offset"])
            groups.setdefault(name, []).append(row["value"] if row["value"] is not None else b"")
        feed.add_many(
            [NewPartition(name, items, self.gate, None) for name, items in groups.items()],
            if_exists=self.if_exists,
        )

    def _release(self, feed: Feed) -> None:
        feed.close()

    def _failure(self, exc: Exception) -> Exception | None:
        if isinstance(exc, DatabaseUnavailableError | DatabaseRefusedError):
            # Not the records' fault: the sink waits for the database (a refusal stops it at once).
            return DestinationUnreachable(one_line(exc), permanent=isinstance(exc, DatabaseRefusedError))
        return None
