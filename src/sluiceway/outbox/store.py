"""The SQL adapter of the harvester's OutboxStore port: mark, purge, reset, bury — per dialect."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sluiceway.db import Database, Dialect
from sluiceway.outbox.record import MAX_ERROR_LENGTH, MarkedRecord
from sluiceway.outbox.table import OutboxLayout, decode_rows, discover, queries


class SqlOutboxStore:
    """MP/R verbs over one connection. Not thread-safe: the harvester opens one per thread."""

    def __init__(self, dsn: str, table: str = "outbox", *, layout: OutboxLayout | None = None) -> None:
        self.db = Database(dsn)
        self.layout = layout or discover(self.db, table)
        self.q = queries(self.db.dialect, self.layout)

    def mark(self, leader_id: str, limit: int) -> list[MarkedRecord]:
        if self.db.dialect is Dialect.MYSQL:
            # No UPDATE … RETURNING: lock the rows (skipping any a writer holds), then mark them.
            with self.db.transaction():
                rows = self.db.fetchall(self.q["mark"], {"leader_id": leader_id, "limit": limit}, what="mark")
                if rows:
                    ids = tuple(int(r[0]) for r in rows)
                    self.db.execute(self.q["mark_update"], {"leader_id": leader_id, "ids": ids}, what="mark")
            rows = [(*r[:7], leader_id, *r[8:]) for r in rows]
        else:
            rows = self.db.fetchall(self.q["mark"], {"leader_id": leader_id, "limit": limit}, what="mark")
        records = decode_rows(rows, self.layout, leader_id)
        records.sort(key=lambda r: r.id)
        return records

    def purge(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        if self.db.dialect is Dialect.POSTGRES:
            params: dict[str, object] = {"ids": list(ids)}
        elif self.db.dialect is Dialect.SQLITE:
            params = {"ids": json.dumps(list(ids))}
        else:
            params = {"ids": tuple(ids)}
        self.db.execute(self.q["purge"], params, what="purge")

    def reset(self, record_id: int, leader_id: str) -> None:
        self.db.execute(self.q["reset"], {"id": record_id, "leader_id": leader_id}, what="reset")

    def bury(self, record: MarkedRecord, error: str, attempts: int) -> None:
        # One transaction: the dead-letter row appears exactly when the outbox row disappears.
        with self.db.transaction():
            self.db.execute(
                self.q["bury"],
                {"id": record.id, "error": error[:MAX_ERROR_LENGTH], "attempts": attempts},
                what="dead-letter",
            )
            self.db.execute(self.q["purge_one"], {"id": record.id}, what="dead-letter")

    def close(self) -> None:
        self.db.close()
