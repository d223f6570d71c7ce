"""The SQL adapter of the harvester's OutboxStore port: mark, purge, reset, bury — per dialect."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from sluiceway.db import Database, Dialect
from sluiceway.db.listen import Listener
from sluiceway.db.queries import pg_bigint_array
from sluiceway.errors import DatabaseError
from sluiceway.outbox.record import MAX_ERROR_LENGTH, MarkedRecord
from sluiceway.outbox.table import OutboxLayout, decode_rows, discover, queries

log = logging.getLogger("sluiceway.outbox")


class SqlOutboxStore:
    """MP/R verbs over one connection. Not thread-safe: the harvester opens one per thread.

    Dead letters park their keys when the dead-letter table has the ``parked`` column (``sluice
    outbox init`` adds it); with an older table, or none, marking takes every key as before.
    """

    def __init__(self, dsn: str, table: str = "outbox", *, layout: OutboxLayout | None = None) -> None:
        self.db = Database(dsn)
        self.layout = layout or discover(self.db, table)
        self.q = queries(self.db.dialect, self.layout)
        self._mark_sql = self.q["mark" if self.layout.can_park else "mark_all_keys"]

    def mark(self, leader_id: str, limit: int) -> list[MarkedRecord]:
        params = {"leader_id": leader_id, "limit": limit}
        if self.db.dialect is Dialect.MYSQL:
            # No UPDATE … RETURNING: lock the rows (skipping any a writer holds), then mark them.
            with self.db.transaction():
                rows = self.db.fetchall(self._mark_sql, params, what="mark")
                if rows:
                    ids = tuple(int(r[0]) for r in rows)
                    self.db.execute(self.q["mark_update"], {"leader_id": leader_id, "ids": ids}, what="mark")
            rows = [(*r[:7], leader_id, *r[8:]) for r in rows]
        else:
            rows = self.db.fetchall(self._mark_sql, params, what="mark")
        records = decode_rows(rows, self.layout, leader_id)
        records.sort(key=lambda r: r.id)
        return records

    def purge(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        if self.db.dialect is Dialect.POSTGRES:
            params: dict[str, object] = {"ids": pg_bigint_array(ids)}
        elif self.db.dialect is Dialect.SQLITE:
            params = {"ids": json.dumps(list(ids))}
        else:
            params = {"ids": tuple(ids)}
        self.db.execute(self.q["purge"], params, what="purge")

    def reset(self, record_id: int, leader_id: str) -> None:
        self.db.execute(self.q["reset"], {"id": record_id, "leader_id": leader_id}, what="reset")

    def bury(self, record: MarkedRecord, error: str, attempts: int, parked: bool = False) -> None:
        # One transaction: the dead-letter row (and with it the key's parking, which every leader's
        # mark query sees) appears exactly when the outbox row disappears.
        params: dict[str, object] = {"id": record.id, "error": error[:MAX_ERROR_LENGTH], "attempts": attempts}
        if self.layout.can_park:
            params["parked"] = parked
        elif parked:
            log.warning(
                "%s has no parked column (run `sluice outbox init` to add it): dead letter %d "
                "does not park key %r",
                self.layout.dead_table,
                record.id,
                record.key,
            )
        with self.db.transaction():
            self.db.execute(
                self.q["bury" if self.layout.can_park else "bury_unparked"], params, what="dead-letter"
            )
            self.db.execute(self.q["purge_one"], {"id": record.id}, what="dead-letter")

    def parked_keys(self) -> int:
        if not self.layout.can_park:
            return 0
        row = self.db.fetchone(self.q["parked_keys"], what="count parked keys")
        return int(row[0]) if row else 0

    def wakeups(self) -> OutboxWakeups | None:
        if not self.layout.notify:
            return None
        wakeups = OutboxWakeups(
            Listener(self.db.source, [self.q["listen_rows"]], application_name="sluiceway harvester")
        )
        wakeups.wait(0)  # connect and LISTEN now, before the marks it is to follow
        return wakeups

    def close(self) -> None:
        self.db.close()


class OutboxWakeups:
    """The harvester's :class:`~sluiceway.harvest.ports.Wakeups` on the outbox's notify trigger.

    Notifications are hints: every lost connection (and the first connection) answers True at
    once, so the marker marks — the catch-up for whatever was notified while nobody listened.
    """

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def wait(self, timeout: float) -> bool:
        if not self.listener.listening:
            try:
                self.listener.listen()
            except DatabaseError as exc:  # the mark that follows meets the same trouble and says so
                log.debug("listening for outbox rows: %s", exc)
            return True
        try:
            return self.listener.wait(timeout) > 0
        except DatabaseError as exc:
            log.debug("listening for outbox rows: %s; listening again", exc)
            return True

    def close(self) -> None:
        self.listener.close()
