"""``sluice-postgres-cdc``: change data capture from PostgreSQL as a Spark source (Arrow batches).

>>> (spark.readStream.format("sluice-postgres-cdc")                        # doctest: +SKIP
...    .option("dsn", "host=db dbname=shop user=cdc").option("tables", "public.orders,public.customers")
...    .option("slot", "shop_orders").option("publication", "shop_orders")
...    .option("stateDir", "./data/checkpoints/_cdc").load())

A thin shell around :class:`~sluiceway.cdc.CdcReader` (the design is in ``sluiceway.cdc``):
offsets are stream positions, ``{"lsn": n}``; ``latestOffset`` plans and spills a batch; tasks
read the spilled records (or decode the slot again); ``commit`` lets the slot move once every
sink has committed.

Options: ``dsn``, ``slot``, ``publication``, ``stateDir`` (required); ``tables`` (comma-separated
``schema.table``) or ``tablesPattern`` (a regular expression); ``snapshot`` (``initial`` |
``never``); ``chunkSize`` (10,000); ``numPartitions`` (1); ``maxRecordsPerBatch`` (100,000);
``consumer`` (this query's sink) and ``consumers`` (every sink reading the slot, comma-separated:
the slot waits for all); ``owner`` (the pipeline run; other runs may not use the slot) and
``ownerTimeout`` (seconds to wait for another run to go, 30).

A batch read (``spark.read``) copies each table as it is now, one task per table, without a
slot: each chunk is read in its own snapshot (use the stream for a consistent copy and changes).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluiceway.cdc import CdcOptions, CdcReader
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.postgres import CdcSession, ChunkRead
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import (
    RecordSource,
    float_option,
    int_option,
    max_records,
    option,
    required,
)

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition  # isort: skip
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # isort: skip

NAME = "sluice-postgres-cdc"


def cdc_options(options: dict[str, Any]) -> CdcOptions:
    pattern = option(options, "tablesPattern")
    listed = [t.strip() for t in (option(options, "tables") or "").split(",") if t.strip()]
    if bool(pattern) == bool(listed):
        raise ValueError(
            f"{NAME}: give either 'tables' (comma-separated) or 'tablesPattern' (a regular expression)"
        )
    consumer = option(options, "consumer", "default") or "default"
    consumers = tuple(c for c in (option(options, "consumers") or "").split(",") if c)
    return CdcOptions(
        dsn=required(options, "dsn", NAME),
        tables=pattern if pattern else tuple(listed),
        slot=required(options, "slot", NAME),
        publication=required(options, "publication", NAME),
        state_dir=required(options, "stateDir", NAME),
        snapshot=option(options, "snapshot", "initial") or "initial",
        chunk_size=int_option(options, "chunkSize", 10_000, minimum=1),
        consumer=consumer,
        consumers=consumers,
        # A query on its own (no pipeline naming a run) is a run of its own.
        owner=option(options, "owner") or uuid.uuid4().hex,
        owner_timeout=float_option(options, "ownerTimeout", 30.0),
        max_records=max_records(options),
        partitions=int_option(options, "numPartitions", 1, minimum=1),
    )


@dataclass(frozen=True)
class CdcPartition(InputPartition):
    start: int
    end: int
    part: int


@dataclass(frozen=True)
class CopyPartition(InputPartition):
    table: str


class PostgresCdcDataSource(RecordSource):
    """Copies PostgreSQL tables, then streams their changes. See the module docstring."""

    NAME = NAME

    def reader(self, schema: Any) -> CdcBatchReader:
        return CdcBatchReader(cdc_options(dict(self.options)))

    def streamReader(self, schema: Any) -> CdcStreamReader:
        return CdcStreamReader(cdc_options(dict(self.options)))


class CdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Built in the query's planning process and pickled to tasks: CdcReader leaves its
    # connections behind when pickled, and opens them where it is used.
    def __init__(self, options: CdcOptions) -> None:
        self.cdc = CdcReader(options)

    def initialOffset(self) -> dict[str, int]:
        return {"lsn": self.cdc.initial_offset()}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.cdc.options.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.cdc.prepare_available_now()

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        rows = int(limit.max_rows) if isinstance(limit, ReadMaxRows) else None
        return {"lsn": self.cdc.latest_offset(int(start["lsn"]), rows)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"lsn": self.cdc.flush_position()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[CdcPartition]:
        lo, hi = int(start["lsn"]), int(end["lsn"])
        if hi <= lo:
            return []
        return [CdcPartition(lo, hi, part) for part in range(self.cdc.options.partitions)]

    def read(self, partition: CdcPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        try:
            batch = self.cdc.read(partition.start, partition.end, partition.part)
        finally:
            self.cdc.close()
        if batch.num_rows:
            yield batch

    def commit(self, end: dict[str, int]) -> None:
        self.cdc.commit(int(end["lsn"]))

    def stop(self) -> None:
        self.cdc.close()


class CdcBatchReader(DataSourceReader):
    def __init__(self, options: CdcOptions) -> None:
        self.options = options

    def partitions(self) -> list[CopyPartition]:
        session = CdcSession(self.options.dsn)
        try:
            return [CopyPartition(t.namespace) for t in session.resolve_tables(self.options.tables)]
        finally:
            session.close()

    def read(self, partition: CopyPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        session = CdcSession(self.options.dsn)
        try:
            table = session.describe(partition.table)
            after: list[str] | None = None
            while True:
                chunk = session.read_chunk(table, after, self.options.chunk_size)
                if len(chunk.keys):
                    yield copy_batch(table.namespace, chunk)
                if chunk.done:
                    return
                after = chunk.last
        finally:
            session.close()


def copy_batch(namespace: str, chunk: ChunkRead) -> pa.RecordBatch:
    """A chunk read by a batch query as records (offset 0: a batch read has no stream position)."""
    n = len(chunk.keys)
    headers = pa.array(
        [[{"key": "sluice.mode", "value": "copy"}, {"key": "pg.snapshot", "value": str(chunk.snapshot)}]] * n,
        RECORD_SCHEMA.field("headers").type,
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([0] * n, pa.int64()),
            pa.array([namespace] * n, pa.string()),
            pa.array(["insert"] * n, pa.string()),
            chunk.keys.cast(pa.string()),
            chunk.values.cast(pa.binary()),
            headers,
            pa.array([chunk.read_time] * n, RECORD_SCHEMA.field("timestamp").type),
        ],
        schema=RECORD_SCHEMA,
    )


__all__ = ["NAME", "CdcReader", "PostgresCdcDataSource", "cdc_options", "format_lsn"]
