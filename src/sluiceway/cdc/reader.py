"""One sink's reader of a CDC source: plans micro-batches over the slot, takes the copy's chunks,
and moves the slot when every sink has committed. Spark-free: the Spark data source
(``sluiceway.pipeline.sources.cdc``) is a thin shell around it.

A pipeline runs one reader per sink (each sink is its own streaming query). They share the
slot, the copy and a state directory (:mod:`sluiceway.cdc.state`):

* **Offsets** are stream positions (LSNs). ``latest_offset(start)`` is only ever asked once the
  sink has committed ``start``, so that is recorded as the sink's position; the slot is advanced
  to the minimum over *all* sinks of the pipeline (a sink that has not reported yet holds it).
* **Planning** decodes the slot from its confirmed position (:func:`~sluiceway.cdc.assemble.assemble`),
  cuts the batch at a transaction boundary after ``limit`` records and spills the batch's
  records to disk, so the tasks read them instead of decoding again.
* **Copying**: a reader that has consumed every chunk so far (it is at the copy's *frontier*)
  takes the next chunks itself, under the state lock: ``L``, the chunk's rows under a fresh
  snapshot, saved, then ``H``. The rows reach every sink through the stream, at ``H``. A chunk
  left open by a taker that died is closed with ``A`` (abandoned) by the next one, and its
  range is taken again.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluiceway.cdc.assemble import Assembly, assemble
from sluiceway.cdc.errors import CdcError, LostChangesError
from sluiceway.cdc.model import TableInfo, watermark_prefix
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.postgres import CdcSession, TableSpec, check_publication_name, check_slot_name
from sluiceway.cdc.state import CopyState, SourceState, TableCopy
from sluiceway.journal.record import ARROW_SCHEMA

log = logging.getLogger("sluiceway.cdc")


@dataclass(frozen=True)
class CdcOptions:
    dsn: str
    #: Table names, or one regular expression over ``schema.table``.
    tables: tuple[str, ...] | str
    slot: str
    publication: str
    state_dir: str
    snapshot: str = "initial"
    chunk_size: int = 10_000
    #: This reader's sink, and every sink of the pipeline (the slot waits for all of them).
    consumer: str = "default"
    consumers: tuple[str, ...] = ()
    #: The pipeline run this reader belongs to (its sessions share the slot; other runs may not).
    owner: str = ""
    owner_timeout: float = 30.0
    max_records: int = 100_000
    partitions: int = 1
    #: With nothing of ours in the stream for this many WAL bytes, write a heartbeat watermark so
    #: the slot can move on (pgoutput sends nothing for transactions on other tables).
    heartbeat_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        check_slot_name(self.slot)
        check_publication_name(self.publication)
        if self.snapshot not in ("initial", "never"):
            raise CdcError(f"snapshot must be 'initial' or 'never', got {self.snapshot!r}")
        if self.chunk_size < 1 or self.partitions < 1 or self.max_records < 1:
            raise CdcError("chunkSize, numPartitions and maxRecordsPerBatch must be at least 1")

    @property
    def sinks(self) -> tuple[str, ...]:
        return self.consumers or (self.consumer,)


@dataclass
class CdcReader:
    options: CdcOptions
    #: Trigger.AvailableNow: the position to stop at (the WAL's end when the trigger was prepared).
    target: int | None = None
    _session: CdcSession | None = field(default=None, repr=False)
    _tables: list[TableSpec] | None = field(default=None, repr=False)
    _prepared: bool = field(default=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to Spark's tasks: connections stay behind.
        return {
            "options": self.options,
            "target": self.target,
            "_session": None,
            "_tables": None,
            "_prepared": False,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- set-up ------------------------------------------------------------------------------------
    @property
    def session(self) -> CdcSession:
        if self._session is None:
            self._session = CdcSession(self.options.dsn)
        return self._session

    @property
    def state(self) -> SourceState:
        return SourceState(self.options.state_dir)

    @property
    def prefix(self) -> str:
        return watermark_prefix(self.options.slot)

    @property
    def tables(self) -> list[TableSpec]:
        if self._tables is None:
            self._tables = self.session.resolve_tables(self.options.tables)
        return self._tables

    def table_infos(self) -> dict[str, TableInfo]:
        return {t.namespace: TableInfo(t.key) for t in self.tables}

    def prepare(self) -> None:
        """Check the server, claim the slot for this run, create publication and slot if missing."""
        if self._prepared:
            return
        opts = self.options
        session = self.session
        session.check_server()
        session.claim_presence(opts.slot, opts.owner or opts.consumer, opts.owner_timeout)
        tables = self.tables
        session.ensure_publication(
            opts.publication, tables
        )  # before the slot: pgoutput looks it up by WAL time
        session.ensure_slot(opts.slot)
        self._prepared = True

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        self._prepared = False

    # -- offsets -----------------------------------------------------------------------------------
    def initial_offset(self) -> int:
        self.prepare()
        info = self.session.slot(self.options.slot)
        assert info is not None
        return info.confirmed

    def flush_position(self) -> int:
        return self.session.flush_position()

    def prepare_available_now(self) -> None:
        self.prepare()
        self.target = self.session.flush_position()

    def copying(self, state: CopyState | None = None) -> bool:
        if self.options.snapshot != "initial":
            return False
        state = state or self.state.load()
        return not all(state.tables.get(t.namespace, TableCopy()).done for t in self.tables)

    def _upto(self, state: CopyState) -> int | None:
        """Where this batch may read to: no limit while the copy runs (its chunks are still to
        come), else the AvailableNow target (at least where the copy completed)."""
        if self.target is None or self.copying(state):
            return None
        return max(self.target, state.done_at or 0)

    def latest_offset(self, start: int, limit: int | None) -> int:
        """Plan the batch after ``start`` (which this sink has committed); its end position."""
        self.prepare()
        self._committed(start)
        state = self.state.load()
        if self.copying(state) and start >= state.frontier:
            self._take_chunks(start, limit or self.options.max_records)
            state = self.state.load()
        upto = self._upto(state)
        asm = self._decode(start, upto, limit)
        if asm.pending is not None and asm.end == start and not asm.records:
            close = self._close_pending(asm.pending)
            if close is None:
                return start  # its taker is still at work: wait for the next trigger
            asm = self._decode(start, close, None)
        if asm.end == start:
            self._heartbeat(start)
            return start
        self._spill(start, asm)
        return asm.end

    def _decode(self, start: int, upto: int | None, limit: int | None) -> Assembly:
        opts = self.options
        session = self.session
        with session.slot_lock(opts.slot):
            info = session.slot(opts.slot)
            if info is None:
                raise CdcError(f"replication slot {opts.slot!r} is gone (dropped while the pipeline ran?)")
            if info.confirmed > start:
                raise LostChangesError(
                    f"sink {opts.consumer!r} is at {format_lsn(start)} but slot {opts.slot!r} has "
                    f"moved on to {format_lsn(info.confirmed)}: the changes in between are gone (was the "
                    "slot dropped and created again?). Start the pipeline from a fresh checkpoint to copy "
                    "the tables again."
                )
            # upto_nchanges counts every message (begin, relation, commit…) from the slot's confirmed
            # position — including what this sink already has when a slower sink holds the slot.
            # Ask for a little more than the batch, and for more again while that falls short (the
            # server decodes all it returns: asking for twice the batch doubled its work).
            wanted = None if limit is None else limit + limit // 8 + 64
            while True:
                rows = session.peek(opts.slot, opts.publication, upto, wanted)
                asm = assemble(
                    rows,
                    start=start,
                    upper=upto,
                    limit=limit,
                    prefix=self.prefix,
                    tables=self.table_infos(),
                    types=session.types,
                    chunks=self.state.load_chunk,
                )
                if wanted is None or limit is None or len(rows) < wanted:
                    return asm  # the slot had no more to give
                if asm.records >= limit or asm.pending is not None:
                    return asm
                wanted *= 4

    def _close_pending(self, chunk: int) -> int | None:
        """A window with no close in the decoded WAL: where it closes, closing it if its taker died."""
        with self.state.locked():
            state = self.state.load()
            close = state.closes.get(str(chunk))
            if close is not None:
                return close
            # Holding the lock means no one is taking a chunk: its taker died mid-way.
            position = self.session.emit(self.prefix, f"A {chunk}")
            state.closes[str(chunk)] = position
            if state.open == chunk:
                state.open = None
            state.frontier = max(state.frontier, position)
            self.state.save(state)
            log.warning("cdc: chunk %d was left open by a reader that stopped; abandoned it", chunk)
            return position

    def _heartbeat(self, start: int) -> None:
        flushed = self.session.flush_position()
        if flushed - start >= self.options.heartbeat_bytes:
            self.session.emit(self.prefix, "P")

    def _spill(self, start: int, asm: Assembly) -> None:
        parts = split_parts(asm.batch, self.options.partitions)
        for part, batch in enumerate(parts):
            path = self.state.spill_path(self.options.consumer, asm.end, part)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
                writer.write_batch(batch)
            tmp.replace(path)

    # -- reading (in Spark's tasks) ------------------------------------------------------------------
    def read(self, start: int, end: int, part: int) -> pa.RecordBatch:
        """The records of batch ``(start, end]`` in part ``part`` (spilled, or decoded again)."""
        path = self.state.spill_path(self.options.consumer, end, part)
        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
            return pa.RecordBatch.from_arrays(
                [table.column(i).combine_chunks() for i in range(table.num_columns)], schema=ARROW_SCHEMA
            )
        except (FileNotFoundError, pa.ArrowInvalid):
            pass  # never written, or torn by a crash: the WAL and the chunk files still define the batch
        asm = self._decode(start, end, None)
        if asm.end != end:
            raise CdcError(
                f"decoding {format_lsn(start)}..{format_lsn(end)} again ended at {format_lsn(asm.end)}: "
                "the slot no longer holds this batch"
            )
        return split_parts(asm.batch, self.options.partitions)[part]

    def peek(self, start: int, end: int, limit: int) -> pa.RecordBatch:
        """Records with ``start <= offset < end`` still in the slot (for an operator; moves nothing)."""
        info = self.session.slot(self.options.slot)
        if info is None:
            raise CdcError(f"replication slot {self.options.slot!r} does not exist")
        low = max(start - 1, info.confirmed)
        return self._decode(low, max(low, end - 1), limit).batch

    # -- committing --------------------------------------------------------------------------------
    def commit(self, end: int) -> None:
        self._committed(end)

    def _committed(self, position: int) -> None:
        """Record this sink's committed position; advance the slot to the slowest sink's."""
        opts = self.options
        positions = self.state.record_position(opts.consumer, position)
        self.state.forget_spills(opts.consumer, position)
        if not all(sink in positions for sink in opts.sinks):
            return
        lowest = min(positions[sink] for sink in opts.sinks)
        session = self.session
        with session.slot_lock(opts.slot):
            info = session.slot(opts.slot)
            if info is not None and lowest > info.confirmed:
                session.advance(opts.slot, lowest)
        self.state.forget_chunks(lowest)

    # -- the copy ----------------------------------------------------------------------------------
    def _take_chunks(self, start: int, budget: int) -> None:
        """Take chunks until ``budget`` rows were copied (or every table is), as the frontier reader."""
        session, store = self.session, self.state
        with store.locked():
            state = store.load()
            if state.frontier > start:
                return  # another sink took chunks since: consume those first
            if state.open is not None:
                position = session.emit(self.prefix, f"A {state.open}")
                log.warning("cdc: chunk %d was left open by a reader that stopped; abandoned it", state.open)
                state.closes[str(state.open)] = position
                state.open, state.frontier = None, position
                store.save(state)
            copied = 0
            for table in self.tables:
                progress = state.tables.setdefault(table.namespace, TableCopy())
                while not progress.done and copied < budget:
                    copied += self._take_chunk(table, state, progress)
                if copied >= budget:
                    break
            if not self.copying(state) and state.done_at is None:
                state.done_at = state.frontier
                store.save(state)
                log.info("cdc: the copy of every table is complete")

    def _take_chunk(self, table: TableSpec, state: CopyState, progress: TableCopy) -> int:
        session, store = self.session, self.state
        chunk = state.next_chunk
        state.next_chunk += 1
        state.open = chunk
        store.save(state)
        try:
            session.emit(self.prefix, f"L {chunk} {table.namespace}")
            read = session.read_chunk(table, progress.last, self.options.chunk_size)
            store.write_chunk(chunk, table.namespace, read.snapshot, read.read_time, read.keys, read.values)
            close = session.emit(self.prefix, f"H {chunk}")
        except BaseException:
            try:
                state.closes[str(chunk)] = session.emit(self.prefix, f"A {chunk}")
                state.open = None
                store.save(state)
            except Exception as exc:  # the next taker abandons it instead
                log.warning("cdc: could not abandon chunk %d: %s", chunk, exc)
            raise
        state.closes[str(chunk)] = close
        state.open, state.frontier = None, close
        progress.last = read.last
        progress.rows += len(read.keys)
        progress.chunks += 1
        if read.done:
            progress.done = True
            progress.completed_at = state.frontier = session.emit(self.prefix, f"T {table.namespace}")
            log.info("cdc: copied %s (%d rows in %d chunks)", table.namespace, progress.rows, progress.chunks)
        store.save(state)
        return len(read.keys)


def split_parts(batch: pa.RecordBatch, parts: int) -> list[pa.RecordBatch]:
    """The records as ``parts`` batches, split by key so each key's records stay in one, in order."""
    if parts == 1:
        return [batch]
    buckets: list[list[int]] = [[] for _ in range(parts)]
    for i, key in enumerate(batch.column("key").to_pylist()):
        buckets[zlib.crc32((key or "").encode()) % parts].append(i)
    return [batch.take(pa.array(idx, pa.int64())) for idx in buckets]


def describe(options: CdcOptions) -> dict[str, Any]:
    """Per table: copy phase and progress; the slot's position and the WAL it retains (for status)."""
    reader = CdcReader(options)
    try:
        state = reader.state.load()
        tables = []
        for table in reader.tables:
            progress = state.tables.get(table.namespace, TableCopy())
            phase = "sync" if options.snapshot != "initial" or progress.done else "copy"
            tables.append(
                {
                    "table": table.namespace,
                    "phase": phase,
                    "rows_copied": progress.rows,
                    "chunks": progress.chunks,
                    "complete_at": None
                    if progress.completed_at is None
                    else format_lsn(progress.completed_at),
                }
            )
        info = reader.session.slot(options.slot)
        slot = (
            None
            if info is None
            else {
                "slot": options.slot,
                "confirmed_lsn": format_lsn(info.confirmed),
                "restart_lsn": format_lsn(info.restart),
                "wal_retained_bytes": info.retained,
                "active_pid": info.active_pid,
            }
        )
        return {
            "tables": tables,
            "slot": slot,
            "positions": {k: format_lsn(v) for k, v in reader.state.positions().items()},
        }
    finally:
        reader.close()
