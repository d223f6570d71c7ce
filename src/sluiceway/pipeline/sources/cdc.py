"""``sluice-postgres-cdc``: a batch copy of PostgreSQL tables as a Spark source (Arrow batches).

>>> (spark.read.format("sluice-postgres-cdc")                              # doctest: +SKIP
...    .option("dsn", "host=db dbname=shop user=cdc").option("tables", "public.orders,public.customers")
...    .load())

Each table is read as it is now, one task per table, in primary-key chunks (each chunk in its own
snapshot), without a slot. For a consistent copy followed by the changes, use a pipeline with a
``postgres-cdc`` source: its capture streams the slot into a journal that the sinks read
(:mod:`sluiceway.cdc.service`).

Options: ``dsn`` (required); ``tables`` (comma-separated ``schema.table``) or ``tablesPattern``
(a regular expression); ``chunkSize`` (10,000).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluiceway.cdc.postgres import CdcSession, ChunkRead
from sluiceway.pipeline.errors import SourceOptionError
from sluiceway.pipeline.record import RECORD_SCHEMA
from sluiceway.pipeline.sources.common import (
    RecordSource,
    int_option,
    option,
    required,
)

from pyspark.sql.datasource import DataSourceReader, InputPartition  # isort: skip

NAME = "sluice-postgres-cdc"


@dataclass(frozen=True)
class CopyOptions:
    dsn: str
    tables: tuple[str, ...] | str
    chunk_size: int


def copy_options(options: dict[str, Any]) -> CopyOptions:
    pattern = option(options, "tablesPattern")
    listed = [t.strip() for t in (option(options, "tables") or "").split(",") if t.strip()]
    if bool(pattern) == bool(listed):
        raise SourceOptionError(
            "tables",
            f"{NAME}: give either 'tables' (comma-separated) or 'tablesPattern' (a regular expression)",
        )
    return CopyOptions(
        dsn=required(options, "dsn", NAME),
        tables=pattern if pattern else tuple(listed),
        chunk_size=int_option(options, "chunkSize", 10_000, minimum=1),
    )


@dataclass(frozen=True)
class CopyPartition(InputPartition):
    table: str


class PostgresCdcDataSource(RecordSource):
    """Copies PostgreSQL tables as they are now (a batch read). See the module docstring."""

    NAME = NAME

    def reader(self, schema: Any) -> CdcBatchReader:
        return CdcBatchReader(copy_options(dict(self.options)))


class CdcBatchReader(DataSourceReader):
    def __init__(self, options: CopyOptions) -> None:
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


__all__ = ["NAME", "PostgresCdcDataSource", "copy_options"]
