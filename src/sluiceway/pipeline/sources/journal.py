"""``sluice-journal``: the journal as a Spark batch and streaming source (Arrow batches) and sink.

>>> spark.readStream.format("sluice-journal").option("path", "./data/journal").load()  # doctest: +SKIP

Reader options: ``path`` (required); ``startingOffset`` (``earliest`` | ``latest`` | a number);
``endingOffset`` (batch reads); ``maxRecordsPerBatch`` (default 100,000); ``partitionRecords``
(records per task, default 1,000,000) and ``minPartitions`` (default 2); ``consumer`` (a named
journal consumer whose offset is committed with each micro-batch, so compaction keeps what the
query has not processed); ``strict`` (``true``: fail, rather than skip, when the query's next
offset is below the journal's first retained record). Offsets are ``{"offset": next}``. Records
whose first header is ``sluice.op`` get that ``op`` with ``headerOps`` (``true``: a CDC
capture's journal; off by default, so other journals pay nothing for it).

Writer options: ``path``; ``name`` (the register that makes appends idempotent per batch id,
default ``sluice-sink``). Tasks stage their rows as Arrow files; the driver appends every
staged file of a micro-batch in one all-or-nothing journal transaction that also records the
batch id in a register, so a replayed batch is appended once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.journal import Journal, JournalLockedError, JournalNotFoundError
from sluiceway.pipeline.errors import SourceError, SourceOptionError
from sluiceway.pipeline.offsets import next_end, split_range
from sluiceway.pipeline.record import RECORD_SCHEMA, with_delete_ops, with_header_ops
from sluiceway.pipeline.sources.common import (
    RecordSource,
    flag_option,
    int_option,
    limit_rows,
    max_records,
    option,
    required,
)

try:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - pyspark is a dependency; this keeps pure imports cheap
    raise

NAME = "sluice-journal"
_READ_ROWS = 65_536


@dataclass(frozen=True)
class JournalPartition(InputPartition):
    path: str
    lo: int
    hi: int
    #: Restore each record's ``op`` from its ``sluice.op`` header (a CDC capture's journal).
    header_ops: bool = False


def journal_head(path: str) -> int:
    """The journal's next offset; a journal that does not exist yet is empty."""
    try:
        return Journal.head_offset(path)
    except JournalNotFoundError:
        return 0


def check_retained(path: str, start: int) -> None:
    """With ``strict``: refuse to read on from ``start`` when records after it were removed (a
    capture journal released below a sink that was not counted, say) — never skip them silently."""
    from sluiceway.journal.segment import list_segments

    try:
        bases = list_segments(path)
    except FileNotFoundError:
        return
    if bases and start < bases[0]:
        raise SourceError(
            f"journal {path}: this query is at offset {start} but the journal starts at {bases[0]} "
            "(the records in between were released); start this sink from a fresh checkpoint, "
            "or the pipeline afresh to copy the tables again"
        )


def read_range(
    path: str, lo: int, hi: int, rows: int = _READ_ROWS, *, header_ops: bool = False
) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the journal's records in ``[lo, hi)`` (the executor side)."""
    with Journal.open(path, read_only=True) as journal:
        for batch in journal.read_arrow(lo, hi, max_rows=rows):
            if batch.num_rows:
                batch = with_delete_ops(batch)
                yield with_header_ops(batch) if header_ops else batch


def plan(path: str, lo: int, hi: int, options: Any) -> list[JournalPartition]:
    per_task = int_option(options, "partitionRecords", 1_000_000, minimum=1)
    parts = max(int_option(options, "minPartitions", 2, minimum=1), -(-(hi - lo) // per_task))
    ops = flag_option(options, "headerOps")
    ranges = split_range(lo, hi, parts, min_size=min(per_task, 4096))
    return [JournalPartition(path, a, b, ops) for a, b in ranges]


def starting_offset(path: str, options: Any) -> int:
    raw = (option(options, "startingOffset", "earliest") or "earliest").lower()
    if raw == "earliest":
        return 0
    if raw == "latest":
        return journal_head(path)
    try:
        return max(0, int(raw))
    except ValueError:
        raise SourceOptionError(
            "startingOffset", f"startingOffset must be earliest, latest or a number, got {raw!r}"
        ) from None


class JournalDataSource(RecordSource):
    """Reads and writes a sluiceway journal. See the module docstring for options."""

    NAME = NAME

    def reader(self, schema: Any) -> JournalBatchReader:
        return JournalBatchReader(dict(self.options))

    def streamReader(self, schema: Any) -> JournalStreamReader:
        return JournalStreamReader(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> JournalStreamWriter:
        return JournalStreamWriter(dict(self.options))


class JournalBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, Any]) -> None:
        self.path = required(options, "path", NAME)
        self.options = options

    def partitions(self) -> list[JournalPartition]:
        lo = starting_offset(self.path, self.options)
        raw_end = option(self.options, "endingOffset", "latest") or "latest"
        head = journal_head(self.path)
        hi = head if raw_end.lower() == "latest" else min(head, int(raw_end))
        return plan(self.path, lo, hi, self.options) or [JournalPartition(self.path, lo, lo)]

    def read(self, partition: JournalPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if partition.hi <= partition.lo:
            return iter(())
        return read_range(partition.path, partition.lo, partition.hi, header_ops=partition.header_ops)


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, Any]) -> None:
        self.path = required(options, "path", NAME)
        self.options = options
        self.max_rows = max_records(options)
        self.consumer = option(options, "consumer")
        self.strict = flag_option(options, "strict")
        self.target: int | None = None

    def initialOffset(self) -> dict[str, int]:
        return {"offset": starting_offset(self.path, self.options)}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = journal_head(self.path)

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        if self.strict:
            check_retained(self.path, int(start["offset"]))
        end = next_end(int(start["offset"]), journal_head(self.path), limit_rows(limit), self.target)
        return {"offset": end}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"offset": journal_head(self.path)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[JournalPartition]:
        return plan(self.path, int(start["offset"]), int(end["offset"]), self.options)

    def read(self, partition: JournalPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(partition.path, partition.lo, partition.hi, header_ops=partition.header_ops)

    def commit(self, end: dict[str, int]) -> None:
        if self.consumer:
            # The journal's own per-consumer offset log (each writer's own offset): lets
            # compaction and `sluice journal` see how far this query has got.
            with Journal.open(self.path, read_only=True) as journal:
                journal.commit_offset(self.consumer, min(int(end["offset"]), journal.head))


# --- writing ----------------------------------------------------------------------------------
def register_name(sink: str) -> str:
    return f"sluice.sink.{sink}.batch"


def open_writer(path: str, timeout: float = 30.0) -> Journal:
    """Open the journal for appending, waiting while another process holds its writer lock."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return Journal.open(path)
        except JournalLockedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def append_table(journal: Journal, table: pa.Table | pa.RecordBatch, sink: str, token: str | None) -> int:
    """Append ``table``'s records in one transaction; with a ``token`` (batch id), at most once.

    The register ``sluice.sink.<sink>.batch`` holds the token of the last batch appended, set in
    the same all-or-nothing append as the records: Spark only ever replays the last, uncommitted
    batch, so finding its token there means the batch is already in. Returns records appended.
    """
    reg = register_name(sink)
    if token is not None and journal.registers().get(reg) == token:
        return 0
    # A record without a key is stored under "" (the journal's keys are strings).
    keys = table.column("key")
    if keys.null_count:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        table = table.set_column(table.schema.get_field_index("key"), "key", pc.fill_null(keys, ""))
    sets = {reg: token} if token is not None else {}
    with journal.append(set_registers=sets) as tx:
        tx.write_arrow(table)  # column-wise: no Python object per field
    return int(table.num_rows)


@dataclass(frozen=True)
class StagedFile(WriterCommitMessage):
    path: str | None
    rows: int


class JournalStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, Any]) -> None:
        self.path = required(options, "path", NAME)
        self.sink = option(options, "name", "sluice-sink") or "sluice-sink"
        self.staging = os.path.join(os.path.dirname(os.path.abspath(self.path)), ".sluice-staging")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        # Executors never open the journal for writing (one writer process at a time): they stage.
        os.makedirs(self.staging, exist_ok=True)
        target = os.path.join(self.staging, f"{uuid.uuid4().hex}.arrow")
        rows = 0
        writer: pa.ipc.RecordBatchFileWriter | None = None
        try:
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_file(target, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        return StagedFile(target if writer is not None else None, rows)

    def commit(self, messages: list[StagedFile | None], batchId: int) -> None:  # type: ignore[override]
        files = [m.path for m in messages if m is not None and m.path]
        tables = [pa.ipc.open_file(f).read_all() for f in files]
        journal = open_writer(self.path)
        try:
            if tables:
                append_table(
                    journal, pa.concat_tables(tables, promote_options="default"), self.sink, str(batchId)
                )
        finally:
            journal.close()
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)

    def abort(self, messages: list[StagedFile | None], batchId: int) -> None:  # type: ignore[override]
        for m in messages:
            if m is not None and m.path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.path)


def remove_staging(path: str) -> None:
    shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(path)), ".sluice-staging"), ignore_errors=True)


__all__ = ["NAME", "RECORD_SCHEMA", "JournalDataSource"]
