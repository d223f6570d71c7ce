"""The feed's database port: named verbs over :class:`sluiceway.db.Database`, one SQL file per
dialect. This module is the only place that knows how each dialect wants its parameters
(arrays for PostgreSQL, JSON for SQLite, tuples for PyMySQL) and what its rows look like.

A store (like a ``Database``) belongs to one thread.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluiceway.db import Database, Dialect, QuerySet, check_identifier, quote_identifier
from sluiceway.db.identifiers import derived_name
from sluiceway.db.queries import pg_bigint_array
from sluiceway.errors import ConfigError, DeadlockError, InvariantViolation
from sluiceway.feed.balance import Census, FreePartition
from sluiceway.feed.core import Claimed, Decision, GateSummary, Outcome, OutcomeKind
from sluiceway.feed.model import (
    FeedStatus,
    ItemRecord,
    NotBefore,
    Page,
    Partition,
    ScheduledWork,
    Status,
    WorkerLeases,
)
from sluiceway.feed.rate import Grant, RateKey, RateLimit, grant, refill

_PREFIX = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z0-9_]{0,40}$")
_MIGRATION_LOCK = "sluiceway.feed.migrate"

#: A free partition's lease_until (an indexing device: "free since forever").
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Items per INSERT statement when adding: bounded so one huge add never builds one huge statement.
INSERT_CHUNK = 5000


def table_names(prefix: str) -> tuple[str, str]:
    """The partitions and items tables for ``prefix`` (validated: letters, digits, underscores,
    optionally ``schema.`` in front)."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ConfigError(
            f"{prefix!r} is not a valid feed table prefix: use letters, digits and underscores, "
            "optionally after 'schema.'",
            path="prefix",
        )
    partitions, items = f"{prefix}partitions", f"{prefix}items"
    check_identifier(partitions, what="feed partitions table")
    check_identifier(items, what="feed items table")
    return partitions, items


def wake_channel(prefix: str) -> str:
    """The LISTEN/NOTIFY channel of the feed whose tables are named from ``prefix``.

    ``<prefix>wakeup`` while that fits PostgreSQL's 63 bytes, else a name derived from a hash of
    the prefix. Channels are per database; two feeds in different schemas with the same unqualified
    prefix share one, which costs only a spurious wake-up (a worker finds nothing and sleeps again).

    >>> wake_channel("feed_"), wake_channel("ops.q_")
    ('feed_wakeup', 'ops.q_wakeup')
    """
    table_names(prefix)  # validated: letters, digits, underscores and at most one dot
    return derived_name(f"{prefix}wakeup", fallback="sluiceway_feed_")


@dataclass(frozen=True, slots=True)
class Held:
    """A partition a worker holds: what processors need to know about it."""

    id: int
    name: str
    attributes: Mapping[str, Any]
    gate: int


def _ts(value: object) -> datetime | None:
    """Timestamps as aware UTC datetimes, whatever the driver returned."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def _json(value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    if isinstance(value, bytes | bytearray):
        value = value.decode("utf-8")
    loaded = json.loads(str(value))
    return loaded if isinstance(loaded, dict) else {"value": loaded}


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):  # a BLOB column written as text by some other tool
        return value.encode("utf-8")
    raise InvariantViolation(f"item data came back as {type(value).__name__}, expected bytes")


class FeedStore:
    """Named feed queries for one database connection and one table prefix."""

    def __init__(self, db: Database, prefix: str = "feed_") -> None:
        self.db = db
        self.dialect = db.dialect
        self.partitions_table, self.items_table = table_names(prefix)
        self.rates_table = check_identifier(f"{prefix}rates", what="feed rates table")
        self._has_rates = False  # known to exist (asked once, then kept)
        bare = prefix.split(".")[-1]
        schema = prefix.split(".")[0] if "." in prefix else None
        #: The LISTEN/NOTIFY channel (PostgreSQL); producers notify on it whenever they make work
        #: available, in the same transaction.
        self.channel = wake_channel(prefix)
        #: Only PostgreSQL has LISTEN/NOTIFY: elsewhere no notification is sent and workers poll.
        self.notifies = self.dialect is Dialect.POSTGRES

        def raw(suffix: str) -> str:
            return quote_identifier(check_identifier(f"{bare}{suffix}", what="feed index"), self.dialect)

        def qualified(suffix: str) -> str:
            # DROP INDEX names the index in its table's schema (CREATE INDEX puts it there);
            # checked and quoted as a table name is, by the query set.
            return f"{bare}{suffix}" if schema is None else f"{schema}.{bare}{suffix}"

        self.q = QuerySet(
            "sluiceway.feed",
            self.dialect,
            partitions=self.partitions_table,
            items=self.items_table,
            rates=self.rates_table,
            raw_rates_check=raw("rates_check"),
            raw_partitions_name_key=raw("partitions_name_key"),
            raw_partitions_status_check=raw("partitions_status_check"),
            raw_partitions_free_idx=raw("partitions_free_idx"),
            raw_partitions_owner_idx=raw("partitions_owner_idx"),
            raw_partitions_status_idx=raw("partitions_status_idx"),
            raw_partitions_scheduled_idx=raw("partitions_scheduled_idx"),
            raw_partitions_ready_idx=raw("partitions_ready_idx"),
            raw_items_status_check=raw("items_status_check"),
            raw_items_open_idx=raw("items_open_idx"),
            old_items_open_idx=qualified("items_open_idx"),
            raw_items_claim_idx=raw("items_claim_idx"),
            raw_items_failed_idx=raw("items_failed_idx"),
            raw_items_partition_idx=raw("items_partition_idx"),
            raw_items_partition_fk=raw("items_partition_fk"),
            # The channel passed wake_channel's checks (letters, digits, underscores, a dot), so
            # double quotes make it one exact, case-preserving identifier.
            raw_wake_channel=f'"{self.channel}"',
        )

    # -- dialect parameter shapes -------------------------------------------------------------
    def _seconds(self, key: str, seconds: float) -> dict[str, Any]:
        """An interval parameter as this dialect's SQL expects it."""
        seconds = max(0.0, float(seconds))
        if self.dialect is Dialect.POSTGRES:
            return {key: seconds}
        if self.dialect is Dialect.SQLITE:
            return {f"{key}_mod": f"+{seconds:.3f} seconds"}
        return {f"{key}_us": round(seconds * 1_000_000)}

    def _ids(self, ids: Iterable[int]) -> Any:
        values = [int(i) for i in ids]
        if self.dialect is Dialect.POSTGRES:
            return values
        if self.dialect is Dialect.SQLITE:
            return json.dumps(values)
        return tuple(values)

    # -- schema -------------------------------------------------------------------------------
    MIGRATION = (
        "create_partitions",
        "create_items",
        # Added with priorities: the columns, for older tables (DEFAULT 0) — first, so that a
        # missing column's ALTER TABLE is the migration's first lock on its table.
        "add_partitions_priority",
        "add_items_priority",
        "index_partitions_free",
        "index_partitions_owner",
        "index_partitions_status",
        # Added with scheduled work: CREATE INDEX IF NOT EXISTS, so older tables get it too.
        "index_partitions_scheduled",
        # Added with priorities: the ready index for choosing partitions, and the claim index in
        # place of the open one (dropped).
        "index_partitions_ready",
        "index_items_open",
        "index_items_claim",
        "index_items_failed",
        "index_items_partition",
        # Added with rate limits: a table of its own, so older feeds get it without ALTER TABLE.
        "create_rates",
    )
    #: Columns added after the tables' first release: ``ALTER TABLE … ADD COLUMN`` blocks run only
    #: when the column is missing (even with IF NOT EXISTS, ALTER TABLE locks the table exclusively,
    #: and SQLite has no IF NOT EXISTS here at all).
    ADDED_COLUMNS = {
        "add_partitions_priority": ("partitions", "priority"),
        "add_items_priority": ("items", "priority"),
    }

    def migrate(self) -> None:
        """Create tables and indexes if missing (idempotent; safe when many workers start at once)."""
        lock = {"name": _MIGRATION_LOCK}
        if self.dialect is Dialect.MYSQL:
            # DDL commits implicitly on MySQL: serialise with a named lock instead.
            self.db.execute(self.q["migrate_lock"], lock, what="feed migrate lock")
            try:
                for name in self.MIGRATION:
                    self.db.execute(self.q[name], what=f"feed migrate {name}")
            finally:
                self.db.execute(self.q["migrate_unlock"], lock, what="feed migrate unlock")
            return
        with self.db.transaction():
            if self.dialect is Dialect.POSTGRES:
                self.db.execute(self.q["migrate_lock"], lock, what="feed migrate lock")
            for name in self.MIGRATION:
                if name in self.ADDED_COLUMNS and self._has_column(*self.ADDED_COLUMNS[name]):
                    continue
                self.db.execute(self.q[name], what=f"feed migrate {name}")

    def _has_column(self, table: str, column: str) -> bool:
        """Is ``column`` in the feed's ``table`` (``"partitions"``, ``"items"`` or ``"rates"``)?"""
        name = {"partitions": self.partitions_table, "items": self.items_table, "rates": self.rates_table}[
            table
        ]
        schema, _, bare = name.rpartition(".")
        row = self.db.fetchone(
            self.q["has_column"],
            {
                "table": bare,
                "schema": schema or None,
                "qualified": quote_identifier(name, self.dialect),
                "column": column,
            },
            what="feed migrate columns",
        )
        return bool(row and row[0])

    # -- producers (call inside a transaction) ------------------------------------------------
    def scheduled_at(self, not_before: NotBefore) -> object:
        """``not_before`` as one instant in the database's own terms (by its clock for a delay),
        to bind as a partition's lease_until and its items' available_at."""
        params: dict[str, Any]
        at = not_before.at
        delay = not_before.delay
        if self.dialect is Dialect.POSTGRES:
            params = {"at": at, "delay": delay}
        elif self.dialect is Dialect.SQLITE:
            # The columns hold ISO-8601 UTC text with milliseconds, compared as text.
            params = {
                "at": None if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3],
                "delay_mod": None if delay is None else f"+{delay:.3f} seconds",
            }
        else:
            params = {
                "at": None if at is None else at.astimezone(UTC).replace(tzinfo=None),
                "delay_us": None if delay is None else round(delay * 1_000_000),
            }
        row = self.db.fetchone(self.q["scheduled_at"], params, what="feed schedule")
        if row is None or row[0] is None:
            raise InvariantViolation(f"scheduled_at gave no instant for {not_before!r}")
        return row[0]

    def insert_partition(
        self,
        name: str,
        gate: int,
        attributes: Mapping[str, Any] | None,
        lease_until: object = None,
        priority: int = 0,
    ) -> int:
        """``lease_until``: an instant from :meth:`scheduled_at` (no lease before it), or None;
        ``priority``: the partition's (higher is leased first)."""
        row = self.db.fetchone(
            self.q["insert_partition"],
            {
                "name": name,
                "gate": gate,
                "attributes": json.dumps(dict(attributes or {})),
                "lease_until": lease_until,
                "priority": priority,
            },
            what="feed add partition",
        )
        if row is None:
            raise InvariantViolation("INSERT … RETURNING id returned no row")
        return int(row[0])

    def insert_items(
        self, rows: Sequence[tuple[int, int, bytes]], available_at: object = None, priority: int = 0
    ) -> None:
        """Insert ``(partition_id, gate, data)`` rows, in bounded chunks; ``available_at``: an
        instant from :meth:`scheduled_at` (not claimable before it), or None (at once);
        ``priority``: the items' (higher is claimed first within a gate)."""
        block = "insert_items" if available_at is None else "insert_items_at"
        at: dict[str, Any] = {"priority": priority}
        if available_at is not None:
            at["available_at"] = available_at
        for start in range(0, len(rows), INSERT_CHUNK):
            chunk = rows[start : start + INSERT_CHUNK]
            if self.dialect is Dialect.POSTGRES:
                self.db.execute(
                    self.q[block],
                    {
                        "partition_ids": [r[0] for r in chunk],
                        "gates": [r[1] for r in chunk],
                        "datas": [r[2] for r in chunk],
                        **at,
                    },
                    what="feed add items",
                )
            else:
                self.db.executemany(
                    self.q[block],
                    [{"partition_id": r[0], "gate": r[1], "data": r[2], **at} for r in chunk],
                    what="feed add items",
                )

    def lock_partition(self, name: str) -> tuple[int, Status, int, int] | None:
        """(id, status, gate, version) of a partition, locked for the current transaction."""
        row = self.db.fetchone(self.q["lock_partition"], {"name": name}, what="feed lock partition")
        if row is None:
            return None
        return int(row[0]), Status(row[1]), int(row[2]), int(row[3])

    def reopen_partition(self, partition_id: int, version: int) -> bool:
        n = self.db.execute(
            self.q["reopen_partition"], {"id": partition_id, "version": version}, what="feed reopen partition"
        )
        return n == 1

    def notify(self, event: str) -> None:
        """Wake the feed's listening workers when the current transaction commits (PostgreSQL;
        elsewhere nothing). Call it inside the transaction that makes the work visible."""
        if self.notifies:
            self.db.execute(self.q["notify"], {"channel": self.channel, "event": event}, what="feed notify")

    # -- reading ------------------------------------------------------------------------------
    @staticmethod
    def _partition(row: Sequence[Any]) -> Partition:
        lease_until = _ts(row[5])
        # Free with a lease_until past the epoch: it was added with a not_before (a release or a
        # close sets the epoch again).
        scheduled = row[4] is None and lease_until is not None and lease_until > EPOCH
        return Partition(
            id=int(row[0]),
            name=str(row[1]),
            status=Status(row[2]),
            gate=int(row[3]),
            owner=row[4],
            # A free partition's lease_until is the epoch (an indexing device): show no lease.
            lease_until=lease_until if row[4] is not None else None,
            version=int(row[6]),
            attributes=_json(row[7]),
            created_at=_ts(row[8]),
            updated_at=_ts(row[9]),
            not_before=lease_until if scheduled else None,
            priority=int(row[10]),
        )

    def partition(self, name: str) -> Partition | None:
        row = self.db.fetchone(self.q["partition_by_name"], {"name": name}, what="feed partition")
        return None if row is None else self._partition(row)

    def partitions_page(self, status: Status | None, after: int, limit: int) -> Page[Partition]:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if status is None:
            rows = self.db.fetchall(self.q["partitions_page"], params, what="feed list partitions")
        else:
            params["status"] = Status(status).value
            rows = self.db.fetchall(self.q["partitions_page_by_status"], params, what="feed list partitions")
        parts = [self._partition(r) for r in rows]
        return Page(parts, parts[-1].id if len(parts) == limit else None)

    def items_page(self, partition_id: int, after: int, limit: int) -> Page[ItemRecord]:
        rows = self.db.fetchall(
            self.q["items_page"],
            {"partition_id": partition_id, "after": after, "limit": limit},
            what="feed list items",
        )
        items = [
            ItemRecord(
                id=int(r[0]),
                partition_id=int(r[1]),
                gate=int(r[2]),
                status=Status(r[3]),
                attempts=int(r[4]),
                available_at=_ts(r[5]),
                data=_bytes(r[6]),
                result=r[7],
                last_error=r[8],
                version=int(r[9]),
                created_at=_ts(r[10]),
                updated_at=_ts(r[11]),
                priority=int(r[12]),
            )
            for r in rows
        ]
        return Page(items, items[-1].id if len(items) == limit else None)

    # -- leases -------------------------------------------------------------------------------
    def renew(self, owner: str, lease: float) -> set[int]:
        """Extend our leases; return the ids we still hold."""
        self.db.execute(self.q["renew"], {"owner": owner, **self._seconds("lease", lease)}, what="feed renew")
        return {int(r[0]) for r in self.db.fetchall(self.q["owned"], {"owner": owner}, what="feed owned")}

    def census(self) -> Census:
        """Live owners and available partitions, in one statement (the NULL owner's row is the
        count of available partitions)."""
        owners: dict[str, int] = {}
        available = 0
        for owner, count in self.db.fetchall(self.q["census"], what="feed census"):
            if owner is None:
                available = int(count)
            else:
                owners[str(owner)] = int(count)
        return Census(available=available, owners=owners)

    def free_partitions(self, limit: int) -> list[FreePartition]:
        """One page of free or expired partitions, highest priority first."""
        rows = self.db.fetchall(self.q["free_partitions"], {"limit": limit}, what="feed free partitions")
        return [FreePartition(int(r[0]), int(r[1]), int(r[2])) for r in rows]

    def acquire(
        self, owner: str, free: Sequence[FreePartition | tuple[int, int]], lease: float
    ) -> list[Held]:
        """Take free partitions read with their versions (from :meth:`free_partitions`, or
        ``(id, version)`` pairs); return the ones we got."""
        pairs = [(p.id, p.version) if isinstance(p, FreePartition) else (int(p[0]), int(p[1])) for p in free]
        if not pairs:
            return []
        params: dict[str, Any] = {"owner": owner, **self._seconds("lease", lease)}
        if self.dialect is Dialect.POSTGRES:
            params["ids"] = [p[0] for p in pairs]
            params["versions"] = [p[1] for p in pairs]
        elif self.dialect is Dialect.SQLITE:
            params["pairs"] = json.dumps([list(p) for p in pairs])
        else:
            # Lock what is still free (id order, SKIP LOCKED), then take exactly those rows.
            try:
                with self.db.transaction():
                    locked = self.db.fetchall(
                        self.q["acquire_lock"],
                        {"pairs": tuple((int(p[0]), int(p[1])) for p in pairs)},
                        what="feed acquire",
                    )
                    if not locked:
                        return []
                    params["ids"] = tuple(int(r[0]) for r in locked)
                    self.db.execute(self.q["acquire"], params, what="feed acquire")
            except DeadlockError:
                # InnoDB may still choose a take as a deadlock's victim (the update's secondary
                # index locks, beside another take's scan): it was rolled back whole, so nothing
                # is taken this time — as with a row another worker has locked.
                return []
            return self.held(owner, list(params["ids"]))
        if self.db.execute(self.q["acquire"], params, what="feed acquire") == 0:
            return []
        return self.held(owner, [p[0] for p in pairs])

    def held(self, owner: str, ids: Sequence[int]) -> list[Held]:
        """Those of ``ids`` that ``owner`` holds, with what processors need to know."""
        if not ids:
            return []
        rows = self.db.fetchall(self.q["taken"], {"ids": self._ids(ids), "owner": owner}, what="feed taken")
        return [Held(int(r[0]), str(r[1]), _json(r[2]), int(r[3])) for r in rows]

    def victim_partition(self, victim: str) -> tuple[int, int] | None:
        row = self.db.fetchone(self.q["victim_partition"], {"victim": victim}, what="feed victim")
        return None if row is None else (int(row[0]), int(row[1]))

    def steal(self, owner: str, partition_id: int, version: int, lease: float) -> list[Held]:
        params = {"owner": owner, "id": partition_id, "version": version, **self._seconds("lease", lease)}
        if self.db.execute(self.q["steal"], params, what="feed steal") != 1:
            return []
        return self.held(owner, [partition_id])

    def release(self, owner: str, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        params = {"ids": self._ids(ids), "owner": owner}
        if not self.notifies:
            return self.db.execute(self.q["release"], params, what="feed release")
        # A released partition is free at once: wake the others, in the release's own transaction
        # (releases are rare — over target, stopping — so the extra round trips do not matter).
        with self.db.transaction():
            released = self.db.execute(self.q["release"], params, what="feed release")
            if released:
                self.notify("release")
        return released

    # -- items: the hot path ------------------------------------------------------------------
    def claim(self, owner: str, limit: int, lease: float) -> list[Claimed]:
        """Claim up to ``limit`` items at the gates of partitions ``owner`` holds."""
        return self._claim("claim", {"owner": owner, "limit": limit}, lease)

    def _claim(self, query: str, params: dict[str, Any], lease: float) -> list[Claimed]:
        """``query`` (``claim`` or ``claim_in``) with ``params`` and the lease: one statement that
        claims and returns the rows, or on MySQL (no ``UPDATE … RETURNING``) a locking read and
        the update of exactly those rows in one transaction."""
        seconds = self._seconds("lease", lease)
        if self.dialect is not Dialect.MYSQL:
            return self._claimed(self.db.fetchall(self.q[query], {**params, **seconds}, what="feed claim"))
        with self.db.transaction():
            rows = self.db.fetchall(self.q[query], {**params, **seconds}, what="feed claim")
            if not rows:
                return []
            ids = tuple(int(r[0]) for r in rows)
            self.db.execute(self.q["claim_mark"], {"ids": ids, **seconds}, what="feed claim")
        # The rows were locked between read and update: the update wrote exactly these values.
        return [
            Claimed(int(r[0]), int(r[1]), int(r[2]), _bytes(r[3]), int(r[4]) + 1, int(r[5]) + 1) for r in rows
        ]

    def _claimed(self, rows: list[tuple[Any, ...]]) -> list[Claimed]:
        """A claim's rows (id, partition_id, gate, data, attempts, version) as :class:`Claimed`."""
        if self.dialect is Dialect.POSTGRES:
            # psycopg gives bigint and integer as int and bytea as bytes: the row is the tuple.
            return list(map(Claimed._make, rows))
        return [Claimed(int(r[0]), int(r[1]), int(r[2]), _bytes(r[3]), int(r[4]), int(r[5])) for r in rows]

    def complete(self, outcomes: Sequence[Outcome]) -> int:
        """Write a batch of outcomes; return how many still matched their claim's version."""
        if not outcomes:
            return 0
        # Finished-without-new-data is most of the traffic: it gets its own, narrower statement.
        done = [o for o in outcomes if o.kind is OutcomeKind.DONE and o.data is None]
        rest = [o for o in outcomes if not (o.kind is OutcomeKind.DONE and o.data is None)]
        if self.dialect is Dialect.POSTGRES:
            written = 0
            if done:
                written += self.db.execute(
                    self.q["complete_done"],
                    {
                        "ids": pg_bigint_array([o.id for o in done]),
                        "versions": pg_bigint_array([o.version for o in done]),
                    },
                    what="feed complete",
                )
            if rest:
                written += self.db.execute(
                    self.q["complete"],
                    {
                        "ids": [o.id for o in rest],
                        "versions": [o.version for o in rest],
                        "statuses": [o.status.value for o in rest],
                        "gates": [o.gate for o in rest],
                        "datas": [o.data for o in rest],
                        "attempts": [o.attempts for o in rest],
                        "delays": [float(o.delay) for o in rest],
                        "results": [o.result for o in rest],
                        "errors": [o.error for o in rest],
                    },
                    what="feed complete",
                )
            return written
        rows = [
            {
                "id": o.id,
                "version": o.version,
                "status": o.status.value,
                "gate": o.gate,
                "data": o.data,
                "attempts": o.attempts,
                "result": o.result,
                "error": o.error,
                **self._seconds("delay", o.delay),
            }
            for o in rest
        ]
        written = 0
        with self.db.transaction():
            if done:
                pairs = [{"id": o.id, "version": o.version} for o in done]
                written += self.db.executemany(self.q["complete_done"], pairs, what="feed complete")
            if rows:
                written += self.db.executemany(self.q["complete"], rows, what="feed complete")
        return written

    def claim_in(self, owner: str, partition_ids: Sequence[int], limit: int, lease: float) -> list[Claimed]:
        """:meth:`claim`, from some of the partitions ``owner`` holds (those under one set of rate
        limits), up to the ``limit`` tokens taken for them."""
        if not partition_ids:
            return []
        params = {"owner": owner, "limit": limit, "ids": self._ids(partition_ids)}
        return self._claim("claim_in", params, lease)

    # -- rate limits ----------------------------------------------------------------------------
    @staticmethod
    def _key(key: RateKey) -> dict[str, str]:
        return {"attribute": key.attribute, "value": key.value}

    def rate_limits(self) -> list[RateLimit]:
        """Every limit, with its bucket's level now (by the database clock). None while the rates
        table does not exist: a feed from before rate limits, read without migrating (``sluice
        feed status``, a worker with ``migrate=False``) has no limits."""
        if not self._has_rates:
            self._has_rates = self._has_column("rates", "max_rate")
            if not self._has_rates:
                return []
        rows = self.db.fetchall(self.q["rates_list"], what="feed rate limits")
        return [
            RateLimit(
                RateKey(str(r[0]), str(r[1])),
                float(r[2]),
                float(r[3]),
                refill(float(r[4]), float(r[3]), float(r[2]), float(r[6]) - float(r[5])),
            )
            for r in rows
        ]

    def take_tokens(self, key: RateKey, want: int) -> Grant | None:
        """Take up to ``want`` tokens from ``key``'s bucket, in one short transaction (the row is
        locked from the read to the write); None when that limit no longer exists."""
        with self.db.transaction():
            row = self.db.fetchone(self.q["rate_lock"], self._key(key), what="feed rate take")
            if row is None:
                return None
            tokens, burst, max_rate, refilled_at, now = (float(v) for v in row)
            given = grant(refill(tokens, burst, max_rate, now - refilled_at), want, max_rate)
            if given.taken:
                self.db.execute(
                    self.q["rate_write"],
                    {**self._key(key), "tokens": given.left, "at": now},
                    what="feed rate take",
                )
            # Nothing taken: nothing written. The level is the stored one refilled to now, and
            # computing it again later from the same row gives the same answer.
        return given

    def give_back_tokens(self, key: RateKey, tokens: int) -> None:
        """Return tokens a claim did not use to ``key``'s bucket (capped by its burst)."""
        if tokens > 0:
            self.db.execute(
                self.q["rate_give_back"], {**self._key(key), "tokens": tokens}, what="feed rate give back"
            )

    def set_rate(self, key: RateKey, max_rate: float, burst: float) -> None:
        """Create or change a limit: a new bucket starts full; a changed one keeps its level
        (refilled at the old rate up to now), capped by the new burst."""
        params = {**self._key(key), "max_rate": max_rate, "burst": burst}
        with self.db.transaction():
            row = self.db.fetchone(self.q["rate_lock"], self._key(key), what="feed set rate")
            if row is None:
                self.db.execute(self.q["rate_insert"], params, what="feed set rate")
                return
            tokens, old_burst, old_rate, refilled_at, now = (float(v) for v in row)
            level = min(burst, refill(tokens, old_burst, old_rate, now - refilled_at))
            self.db.execute(
                self.q["rate_update"], {**params, "tokens": level, "at": now}, what="feed set rate"
            )

    def clear_rate(self, key: RateKey) -> bool:
        """Remove a limit; False when there was none."""
        return self.db.execute(self.q["rate_delete"], self._key(key), what="feed clear rate") > 0

    def next_due(self, owner: str, since: float) -> float | None:
        """Seconds until the first open item at the gates of ``owner``'s partitions becomes
        claimable, or the first free scheduled partition comes due (or came due in the last
        ``since`` seconds) — by the database clock; <= 0: now — or None. PostgreSQL only: a worker
        sleeping on LISTEN uses it to wake for work nobody will notify about."""
        if not self.notifies:
            raise InvariantViolation("next_due is only asked of PostgreSQL stores (wake-ups)")
        row = self.db.fetchone(
            self.q["next_due"], {"owner": owner, "since": max(0.0, since)}, what="feed next due"
        )
        return None if row is None or row[0] is None else float(row[0])

    # -- gates --------------------------------------------------------------------------------
    @staticmethod
    def _summary(row: Sequence[Any]) -> GateSummary:
        return GateSummary(
            partition_id=int(row[0]),
            version=int(row[1]),
            gate=int(row[2]),
            open=bool(row[3]),
            failed=bool(row[4]),
            next_gate=None if row[5] is None else int(row[5]),
        )

    def summarize_owned(self, owner: str, ids: Sequence[int]) -> list[GateSummary]:
        if not ids:
            return []
        rows = self.db.fetchall(
            self.q["summarize_owned"], {"ids": self._ids(ids), "owner": owner}, what="feed gate summary"
        )
        return [self._summary(r) for r in rows]

    def summarize(self, partition_id: int) -> GateSummary | None:
        row = self.db.fetchone(self.q["summarize"], {"id": partition_id}, what="feed gate summary")
        return None if row is None else self._summary(row)

    def apply(
        self, decisions: Sequence[tuple[GateSummary, Decision]], *, notify: bool = True
    ) -> list[tuple[GateSummary, Decision, bool]]:
        """Apply gate decisions in one transaction, each conditional on its summary's version.

        Returns each non-WAIT decision with whether it took effect (False: the partition changed
        since it was summarised — a producer added items, an operator retried — so the decision
        is void and will be taken again from fresh facts).

        ``notify``: wake listening workers when a gate advanced (a checkpoint by hand). A worker
        applying its own decisions passes False: only the holder of a partition can claim its
        items, and the holder is the one advancing it, which goes on to claim without sleeping.
        """
        # In partition id order, as every multi-row write of partitions locks them.
        work = sorted(
            ((s, d) for s, d in decisions if d is not Decision.WAIT), key=lambda sd: sd[0].partition_id
        )
        if not work:
            return []
        applied: list[tuple[GateSummary, Decision, bool]] = []
        with self.db.transaction():
            for summary, decision in work:
                params: dict[str, Any] = {"id": summary.partition_id, "version": summary.version}
                if decision is Decision.ADVANCE:
                    params["gate"] = summary.next_gate
                    n = self.db.execute(self.q["advance_gate"], params, what="feed advance gate")
                else:
                    params["status"] = (
                        Status.COMPLETE if decision is Decision.COMPLETE else Status.FAILED
                    ).value
                    n = self.db.execute(self.q["close_partition"], params, what="feed close partition")
                applied.append((summary, decision, n == 1))
            if notify and any(ok and d is Decision.ADVANCE for _, d, ok in applied):
                self.notify("gate")
        return applied

    # -- operators ----------------------------------------------------------------------------
    def settle_failed(self, action: str, partition_id: int | None, item_id: int | None) -> int:
        """retry or resolve failed items (optionally of one partition / one item); return how many."""
        params = {"partition_id": partition_id, "item_id": item_id}
        block = {"retry": "retry_failed", "resolve": "resolve_failed"}[action]
        with self.db.transaction():
            # Partitions first, items second: the lock order add_items uses too.
            self.db.execute(self.q["reopen_failed"], params, what=f"feed {action}")
            settled = self.db.execute(self.q[block], params, what=f"feed {action}")
            if settled:
                # Retried items are claimable now; resolved ones may let a gate advance. Either
                # way the reopened partitions are free (closing released them): wake a worker.
                self.notify(action)
            return settled

    def status(self) -> FeedStatus:
        parts = [
            (str(r[0]), int(r[1]), int(r[2]))
            for r in self.db.fetchall(self.q["status_partitions"], what="feed status partitions")
        ]
        items_by_gate = [
            (str(r[0]), int(r[1]), int(r[2]))
            for r in self.db.fetchall(self.q["status_items"], what="feed status items")
        ]
        items: dict[str, int] = {}
        for status, _gate, n in items_by_gate:
            items[status] = items.get(status, 0) + n
        lag = self.db.fetchone(self.q["status_lag"], what="feed status lag")
        workers = [
            WorkerLeases(str(r[0]), int(r[1]), _ts(r[2]), _ts(r[3]), bool(r[4]), int(r[5] or 0))
            for r in self.db.fetchall(self.q["status_workers"], what="feed status workers")
        ]
        priorities = [
            (str(r[0]), int(r[1]), int(r[2]))
            for r in self.db.fetchall(self.q["status_priorities"], what="feed status priorities")
        ]
        ready = int(lag[0] or 0) if lag else 0
        age = None if not lag or lag[1] is None else float(lag[1])
        limits, scheduled = self.rate_limits(), self.scheduled()
        return FeedStatus(parts, items, ready, age, workers, items_by_gate, priorities, limits, scheduled)

    def scheduled(self) -> ScheduledWork:
        """Work held back to a time on purpose (``not_before``, ``retry_in``): counts, first due."""
        row = self.db.fetchone(self.q["status_scheduled"], what="feed status scheduled")
        if row is None:
            return ScheduledWork()
        dues = [due for due in (_ts(row[1]), _ts(row[3])) if due is not None]
        return ScheduledWork(int(row[0] or 0), int(row[2] or 0), min(dues) if dues else None)
