"""The capture from MariaDB/MySQL: read the binlog once as a replica, append every change of the
captured tables to a target, in commit order, with the copy's chunks in place.

The same commit log as PostgreSQL's (:mod:`sluiceway.cdc.capture`): the target (a journal, or a
broker through ``sluice capture``) keeps the records and the binlog position they end at
together, and a restart resumes from that position — nothing lost, nothing twice in the target.
Two threads: the reader (:mod:`~sluiceway.cdc.mysql.reader`) cuts the binlog into units; the
appender (:meth:`BinlogCapture.run`) assembles complete ones
(:func:`~sluiceway.cdc.mysql.assemble.assemble`) and appends them as one group commit. While a
copy runs, the copier (:mod:`sluiceway.cdc.copier`) takes chunks between watermarks.

Unlike a PostgreSQL slot, the server keeps no WAL for us: binlogs are purged by age
(``binlog_expire_logs_seconds``). A capture whose position was purged stops with one line (the
changes in between are gone) rather than skip them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sluiceway.cdc.copier import CopySession
from sluiceway.cdc.errors import CdcError, LostChangesError, StreamInterrupted
from sluiceway.cdc.lifecycle import CaptureLife
from sluiceway.cdc.mysql.assemble import Unit, assemble, split_position
from sluiceway.cdc.mysql.reader import BinlogReader, ReaderOptions
from sluiceway.cdc.mysql.server import BinlogSession, BinlogTable
from sluiceway.cdc.state import SourceState, TableCopy
from sluiceway.cdc.target import CaptureTarget
from sluiceway.cdc.watermark import Watermark
from sluiceway.journal.arrow import empty_batch

log = logging.getLogger("sluiceway.cdc")


@dataclass(frozen=True)
class BinlogOptions:
    dsn: str
    #: Table names (``db.table``, or a bare name in the DSN's database), or one regular expression.
    tables: tuple[str, ...] | str
    #: This reader's server id among the server's replicas (each capture needs its own).
    server_id: int
    state_dir: str
    snapshot: str = "initial"
    chunk_size: int = 10_000
    max_append: int = 50_000
    linger: float = 0.005
    read_ahead: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.server_id < 2**32:
            raise CdcError(f"serverId must be between 1 and 4294967295, got {self.server_id}")
        if self.snapshot not in ("initial", "never"):
            raise CdcError(f"snapshot must be 'initial' or 'never', got {self.snapshot!r}")
        if self.chunk_size < 1 or self.max_append < 1:
            raise CdcError("chunk_size and max_append must be at least 1")

    @property
    def slot(self) -> str:
        """The capture's name where a slot's would be (watermarks, status)."""
        return f"server{self.server_id}"


def describe_position(value: int, files: dict[int, str] | None = None) -> str:
    """A position as ``binlog.000042:1234`` (or ``#42:1234`` without the file names)."""
    number, pos = split_position(value)
    name = (files or {}).get(number, f"#{number}")
    return f"{name}:{pos}"


@dataclass
class BinlogCapture(CaptureLife):
    """Streams the binlog into ``target``. ``prepare()``, ``start()``, then ``run()`` or ``catch_up()``."""

    options: BinlogOptions
    target: CaptureTarget
    position: int = 0
    durable: int = 0
    appended: int = 0
    _session: BinlogSession | None = field(default=None, repr=False)
    _tables: list[BinlogTable] = field(default_factory=list, repr=False)
    _reader: BinlogReader | None = field(default=None, repr=False)
    _copier: threading.Thread | None = field(default=None, repr=False)
    _copy_error: BaseException | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _moved: threading.Condition = field(default_factory=threading.Condition, repr=False)
    copy_done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def prefix(self) -> str:
        return f"sluice-cdc:{self.options.slot}"

    @property
    def store(self) -> SourceState:
        return SourceState(self.options.state_dir)

    @property
    def session(self) -> BinlogSession:
        if self._session is None:
            self._session = BinlogSession(self.options.dsn)
        return self._session

    @property
    def tables(self) -> list[BinlogTable]:
        return self._tables

    # -- set-up ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Every check that can refuse, creating nothing: the server's binlog settings and our
        grants, the tables (each with a primary key), and that the binlog still holds the
        position the target resumes from."""
        session = self.session
        session.check_server()
        self._tables = session.resolve_tables(self.options.tables)
        held = self.target.position()
        if held is None:
            return
        files = session.binary_logs()
        number, _pos = split_position(held)
        if number not in files:
            first = min(files, default=None)
            since = "" if first is None else f" (the oldest the server has is {files[first]})"
            raise LostChangesError(
                f"the capture's log holds changes up to {describe_position(held)} but the server no longer "
                f"has that binary log{since}: the changes since were purged. Start from a fresh log and "
                "checkpoint to copy the tables again (and keep binlogs longer: binlog_expire_logs_seconds)."
            )

    def prepare(self) -> None:
        self.check()
        session = self.session
        session.ensure_watermarks(self.prefix)
        held = self.target.position()
        if held is None:
            held = session.current()
            self.target.append(empty_batch(), held)
        self.position = self.durable = held

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> None:
        session = self.session
        options = ReaderOptions(
            settings=session.settings,
            server_id=self.options.server_id,
            database=session.database,
            tables={t.namespace: t for t in self._tables},
            prefix=self.prefix,
            files=session.binary_logs(),
        )
        self._reader = BinlogReader(options, self.position)
        self._reader.start()
        self._start_copy()

    def close(self) -> None:
        self.stop()
        if self._copier is not None:
            self._copier.join(30)
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        if self._session is not None:
            self._session.close()
            self._session = None

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """The appender loop, until :meth:`stop` or ``until()`` holds; raises what stopped the stream."""
        reader = self._reader
        assert reader is not None, "start() first"
        units: list[Unit] = []
        waiting = False  # the units left need a watermark still to come
        first_at = 0.0
        while not self._stop.is_set():
            if self._copy_error is not None:
                raise self._copy_error
            if units and not waiting:
                left = first_at + self.options.linger - time.monotonic()
                got = reader.take(max(left, 0.0005))
            else:
                got = reader.take(0.05)
            if got is None:
                raise reader.error or StreamInterrupted("the binlog stream ended")
            if got and not units:
                first_at = time.monotonic()
            units.extend(got)
            # Append when the hand-over ran dry, enough gathered, or the linger passed; a window
            # still open waits for more units to arrive.
            due = (
                not got
                or len(units) >= self.options.max_append
                or time.monotonic() - first_at >= self.options.linger
            )
            if units and ((waiting and got) or (not waiting and due)):
                done = assemble(units, self.store.load_chunk, limit=self.options.max_append)
                if done.units:
                    self._hold(done.batch, done.end)
                    self.appended += done.batch.num_rows
                    del units[: done.units]
                    first_at = time.monotonic()
                waiting = bool(units) and not done.units
            if until is not None and not units and until():
                return

    @property
    def wal_end(self) -> int:
        return self.position

    def sync_point(self) -> int:
        return self.session.emit(self.prefix, Watermark.heartbeat().encode())

    # -- the copy ----------------------------------------------------------------------------------
    def copying(self) -> bool:
        if self.options.snapshot != "initial":
            return False
        state = self.store.load()
        return not all(state.tables.get(t.namespace, TableCopy()).done for t in self._tables)

    def _copy_session(self) -> CopySession:
        return BinlogSession(self.options.dsn)
