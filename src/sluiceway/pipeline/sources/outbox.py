"""``sluice-outbox``: a Spark-native MP/R source over an outbox table (PostgreSQL, SQLite, MariaDB).

>>> (spark.readStream.format("sluice-outbox")                              # doctest: +SKIP
...    .option("dsn", "postgresql://app@db/app").option("table", "outbox").load())

How a micro-batch stays replayable until Spark commits it (the whole design is here):

* Offsets are batch numbers, ``{"batch": n}``. ``latestOffset(start)`` first looks for a batch
  already *claimed* after ``start`` (left by a run that crashed before or after Spark logged
  it) and returns the oldest one unchanged. Only when there is none does it *claim* new rows:
  one statement inserts the ids of the oldest unclaimed outbox rows into ``<table>_spark_claims``
  under a fresh batch number, above every batch number in use.
* A batch's rows are exactly the claims with ``start < batch <= end``: nothing else is ever
  added to those numbers, and nothing removes them until Spark commits ``end``, so a replay —
  in this process or after a driver restart — reads the same rows (less any the application
  deleted itself).
* ``commit(end)`` deletes the outbox rows claimed by batches ``<= end``, their claims, and moves
  the cursor (``<table>_spark_cursor``), in one transaction. A fresh checkpoint starts at the
  cursor and so replays any claims an earlier run left behind: nothing is lost, rows may be
  delivered twice (at-least-once).
* Per-key order: rows are claimed oldest id first; each claim stores a bucket (hash of the key)
  and each task reads one bucket in id order, so every key's rows of a batch are in one task,
  in order; batches run one after another.
* One active query per outbox: claiming needs the database lease ``sluice-outbox:<table>``
  (:class:`~sluiceway.election.lease.DatabaseLease`), and the claim statement itself checks the
  lease holder and epoch, so a deposed leader cannot claim; the claims' primary key (row id)
  means a row is never in two batches.

Options: ``dsn`` (required), ``table`` (default ``outbox``), ``maxRecordsPerBatch`` (100,000),
``numPartitions`` (tasks per batch, default 1), ``leaseTtl`` (seconds, 10), ``leaseTimeout``
(seconds to wait for the lease, 30), ``leaseTable`` (``sluiceway_leases``).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from sluiceway.db import Database, Dialect, QuerySet
from sluiceway.db.identifiers import bare_name, check_identifier
from sluiceway.errors import DatabaseUnavailableError, LeadershipError
from sluiceway.outage import OUTAGE_REMINDER, WarningThrottle, ride_out
from sluiceway.outbox.table import OutboxLayout, decode_rows, discover
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import (
    RecordSource,
    float_option,
    int_option,
    limit_rows,
    max_records,
    option,
    required,
)

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition  # isort: skip
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # isort: skip

log = logging.getLogger("sluiceway.pipeline.outbox")

NAME = "sluice-outbox"
#: Seconds a database outage (a restart, a failover) is waited out before the query stops.
OUTAGE = 60.0
_ALL = 2**31 - 1
_ROWS_PER_BATCH = 10_000
T = TypeVar("T")


def lease_name(table: str) -> str:
    return f"sluice-outbox:{table}"


def _bucket(key: str | None, buckets: int) -> int:
    return zlib.crc32((key or "").encode()) % max(1, int(buckets))


class OutboxState:
    """The claims bookkeeping of one outbox table: the adapter the source's logic talks to."""

    def __init__(self, dsn: str, table: str = "outbox", *, lease_table: str = "sluiceway_leases") -> None:
        check_identifier(table)
        check_identifier(lease_table)
        self.dsn = dsn
        self.table = table
        self.db = Database(dsn)
        self.layout: OutboxLayout = discover(self.db, table)
        claims, cursor = f"{table}_spark_claims", f"{table}_spark_cursor"
        self.q = QuerySet(
            "sluiceway.pipeline",
            self.db.dialect,
            outbox=table,
            claims=claims,
            cursor=cursor,
            leases=lease_table,
            raw_columns=", ".join(f"o.{c}" for c in self.layout.columns),
            raw_claims_index=f"{bare_name(claims)}_batch_idx",
        )
        self.lease_table = lease_table

    def init(self) -> None:
        """Create the bookkeeping tables (idempotent), and the lease table the claim checks."""
        from sluiceway.election.lease import init_leases

        init_leases(self.db, self.lease_table)
        for name in ("create_claims", "create_claims_index", "create_cursor", "ensure_cursor"):
            self.db.execute(self.q[name], what=f"outbox source: {name}")

    def _scalar(self, name: str, params: dict[str, Any] | None = None) -> int | None:
        row = self.db.fetchone(self.q[name], params, what=f"outbox source: {name}")
        return None if row is None or row[0] is None else int(row[0])

    def cursor(self) -> int:
        return self._scalar("read_cursor") or 0

    def next_claimed(self, start: int) -> int | None:
        return self._scalar("next_claimed", {"start": start})

    def max_claimed(self) -> int:
        return self._scalar("max_claimed") or 0

    def max_id(self) -> int:
        return self._scalar("max_id") or 0

    def claim(
        self, batch: int, limit: int, *, max_id: int, holder: str, epoch: int, lease: str, buckets: int
    ) -> int:
        """Claim up to ``limit`` of the oldest unclaimed rows (id ≤ ``max_id``) as ``batch``."""
        params = {
            "batch": batch,
            "limit": limit,
            "max_id": max_id,
            "holder": holder,
            "epoch": epoch,
            "lease": lease,
            "buckets": max(1, buckets),
        }
        if self.db.dialect is Dialect.MYSQL:
            with self.db.transaction():
                rows = self.db.fetchall(self.q["claim_select"], params, what="outbox source: claim")
                if rows:
                    self.db.executemany(
                        self.q["claim"],
                        [(int(r[0]), batch, int(r[1])) for r in rows],
                        what="outbox source: claim",
                    )
            return len(rows)
        if self.db.dialect is Dialect.SQLITE:
            self.db.raw.create_function("sluice_bucket", 2, _bucket, deterministic=True)
        with self.db.transaction():
            return self.db.execute(self.q["claim"], params, what="outbox source: claim")

    def rows(self, lo: int, hi: int, bucket: int) -> list[tuple[Any, ...]]:
        return self.db.fetchall(
            self.q["batch_rows"], {"lo": lo, "hi": hi, "bucket": bucket}, what="outbox source: read batch"
        )

    def commit(self, end: int) -> None:
        """Purge the rows of every batch ≤ ``end`` with their claims, and advance the cursor."""
        with self.db.transaction():
            self.db.execute(self.q["purge"], {"end": end}, what="outbox source: purge")
            self.db.execute(self.q["drop_claims"], {"end": end}, what="outbox source: drop claims")
            self.db.execute(self.q["advance_cursor"], {"end": end}, what="outbox source: cursor")

    def backlog(self) -> tuple[int, int]:
        """(rows in the outbox, of which claimed by an uncommitted batch)."""
        row = self.db.fetchone(self.q["backlog"], what="outbox source: backlog")
        return (0, 0) if row is None else (int(row[0]), int(row[1] or 0))

    def peek(self, lo: int, hi: int, limit: int) -> pa.Table:
        rows = self.db.fetchall(self.q["peek"], {"lo": lo, "hi": hi, "limit": limit}, what="outbox: peek")
        return pa.Table.from_batches([rows_to_arrow(rows, self.layout)], schema=RECORD_SCHEMA)

    def close(self) -> None:
        self.db.close()


def rows_to_arrow(rows: list[tuple[Any, ...]], layout: OutboxLayout) -> pa.RecordBatch:
    records = decode_rows(rows, layout, "")
    # Headers column-wise (offsets, then every name and every value): a dict per header made
    # this function the most of a read's time.
    offsets = [0]
    names: list[str] = []
    texts: list[str] = []
    for r in records:
        for name, text in r.headers:
            names.append(name)
            texts.append(text)
        offsets.append(len(names))
    headers = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(names, pa.string()), pa.array(texts, pa.string())], fields=list(_HEADER.value_type)
        ),
        type=_HEADER,
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.id for r in records], pa.int64()),
            pa.array([r.topic for r in records], pa.string()),
            pa.array(["delete" if r.value is None else "insert" for r in records], pa.string()),
            pa.array([r.key for r in records], pa.string()),
            pa.array([r.value for r in records], pa.binary()),
            headers,
            pa.array([r.create_time for r in records], RECORD_SCHEMA.field("timestamp").type),
        ],
        schema=RECORD_SCHEMA,
    )


_HEADER = RECORD_SCHEMA.field("headers").type


def choose_new_batch(start: int, cursor: int, max_claimed: int) -> int:
    """A fresh batch number: above everything in use, so no replayed range ever grows."""
    return max(start, cursor, max_claimed) + 1


@dataclass(frozen=True)
class OutboxPartition(InputPartition):
    dsn: str
    table: str
    lease_table: str
    lo: int
    hi: int
    bucket: int


class _Listener:
    def leader_acquired(self, epoch: int) -> None:
        log.info("outbox source: lease acquired (epoch %d)", epoch)

    def leader_revoked(self) -> None:
        log.info("outbox source: lease released")

    def leader_fenced(self) -> None:
        log.warning("outbox source: lease fenced")


class OutboxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Constructed in several processes (the planner pickles it to executors): connections and
    # the lease are opened lazily, on the driver side only.
    def __init__(self, options: dict[str, Any]) -> None:
        self.dsn = required(options, "dsn", NAME)
        self.table = check_identifier(option(options, "table", "outbox") or "outbox")
        self.lease_table = check_identifier(option(options, "leaseTable", "sluiceway_leases") or "")
        self.max_rows = max_records(options)
        self.buckets = int_option(options, "numPartitions", 1, minimum=1)
        self.lease_ttl = float_option(options, "leaseTtl", 10.0)
        self.lease_timeout = float_option(options, "leaseTimeout", 30.0)
        self.target: int | None = None
        self._state: OutboxState | None = None
        self._lease: Any = None

        self.outage = float_option(options, "outage", OUTAGE)
        self._throttle: WarningThrottle | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None
        state["_lease"] = None
        state["_throttle"] = None
        return state

    @property
    def state(self) -> OutboxState:
        if self._state is None:
            state = OutboxState(self.dsn, self.table, lease_table=self.lease_table)
            state.init()
            self._state = state
        return self._state

    def _riding(self, call: Callable[[], T]) -> T:
        """``call`` with a database outage waited out (a restart): every step of the source is
        safe to run again — a claim that committed unseen is found as a replay, a commit repeats."""
        if self._throttle is None:
            self._throttle = WarningThrottle(log, OUTAGE_REMINDER)
        return ride_out(
            call, what=NAME, errors=(DatabaseUnavailableError,), limit=self.outage, throttle=self._throttle
        )

    def _leader(self) -> Any:
        """The lease, once held; waits up to ``leaseTimeout`` for it."""
        from sluiceway.election.lease import DatabaseLease

        if self._lease is None:
            self._lease = DatabaseLease(
                self.dsn, lease_name(self.table), ttl=self.lease_ttl, table=self.lease_table
            )
            self._lease.start(_Listener())
        deadline = time.monotonic() + self.lease_timeout
        while not self._lease.is_leader():
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return self._lease

    def initialOffset(self) -> dict[str, int]:
        return self._riding(lambda: {"batch": self.state.cursor()})

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._riding(lambda: self.state.max_id())

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return self._riding(lambda: self._latest(start, limit))

    def _latest(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        begin = int(start["batch"])
        state = self.state
        replay = state.next_claimed(begin)
        if replay is not None:
            return {"batch": replay}
        lease = self._leader()
        if lease is None:
            if self.target is not None:
                raise LeadershipError(
                    f"{NAME}: another query holds the lease {lease_name(self.table)!r} "
                    f"(waited {self.lease_timeout:.0f}s): only one query may read an outbox"
                )
            return {"batch": begin}
        batch = choose_new_batch(begin, state.cursor(), state.max_claimed())
        rows = limit_rows(limit)
        claimed = state.claim(
            batch,
            rows if rows is not None else _ALL,
            max_id=self.target if self.target is not None else 2**62,
            holder=lease.holder,
            epoch=lease.epoch,
            lease=lease_name(self.table),
            buckets=self.buckets,
        )
        return {"batch": batch} if claimed else {"batch": begin}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[OutboxPartition]:
        lo, hi = int(start["batch"]), int(end["batch"])
        if hi <= lo:
            return []
        return [
            OutboxPartition(self.dsn, self.table, self.lease_table, lo, hi, b) for b in range(self.buckets)
        ]

    def read(self, partition: OutboxPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        def fetch() -> tuple[list[tuple[Any, ...]], OutboxLayout]:
            state = OutboxState(partition.dsn, partition.table, lease_table=partition.lease_table)
            try:
                return state.rows(partition.lo, partition.hi, partition.bucket), state.layout
            finally:
                state.close()

        rows, layout = self._riding(fetch)
        for i in range(0, len(rows), _ROWS_PER_BATCH):
            yield rows_to_arrow(rows[i : i + _ROWS_PER_BATCH], layout)

    def commit(self, end: dict[str, int]) -> None:
        self._riding(lambda: self.state.commit(int(end["batch"])))

    def stop(self) -> None:
        if self._lease is not None:
            self._lease.stop()
            self._lease = None
        if self._state is not None:
            self._state.close()
            self._state = None


class OutboxDataSource(RecordSource):
    """Streams an outbox table with MP/R semantics. See the module docstring."""

    NAME = NAME
    READER = OutboxStreamReader
