"""Feed sink: every record becomes a feed partition holding the record's value as its one item.

The partition name comes from a template (default ``{namespace}/{key}/{offset}``, unique per
record), and partitions are added with ``if_exists="skip"``, so a replayed batch adds nothing
twice. ``if_exists="append"`` with a template such as ``{namespace}/{key}`` gathers a key's
records as items of one partition instead.
"""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa

from sluiceway.errors import DatabaseRefusedError, DatabaseUnavailableError
from sluiceway.pipeline.errors import DestinationUnreachable, one_line


class FeedSink:
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
        self._feed: Any = None

    def write(self, table: pa.Table, token: str) -> None:
        from sluiceway.feed import Feed, NewPartition

        if self._feed is None:
            try:
                self._feed = Feed(self.dsn, prefix=self.prefix)
            except (DatabaseUnavailableError, DatabaseRefusedError) as exc:
                raise _unreachable(exc) from None
        groups: dict[str, list[bytes]] = {}
        for row in table.select(["offset", "namespace", "key", "value"]).to_pylist():
            name = self.template.format(namespace=row["namespace"], key=row["key"], offset=row["offset"])
            groups.setdefault(name, []).append(row["value"] if row["value"] is not None else b"")
        try:
            self._feed.add_many(
                [NewPartition(name, items, self.gate, None) for name, items in groups.items()],
                if_exists=self.if_exists,
            )
        except (DatabaseUnavailableError, DatabaseRefusedError) as exc:
            self.close()
            raise _unreachable(exc) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None


def _unreachable(exc: DatabaseUnavailableError | DatabaseRefusedError) -> DestinationUnreachable:
    """Not the records' fault: the sink waits for the database (a refusal stops it at once)."""
    return DestinationUnreachable(one_line(exc), permanent=isinstance(exc, DatabaseRefusedError))
