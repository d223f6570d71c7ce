"""The capture: stream a logical slot once, append every change to a target, confirm what it holds.

A commit log with an offset per writer: the reader appends each message to the log and each
writer keeps its own offset in it. Here the slot is read once over the replication protocol
(:mod:`~sluiceway.cdc.stream`), each change decoded once by the server and parsed once by us,
and appended in commit order to a :class:`~sluiceway.cdc.target.CaptureTarget` (a journal);
the server is told to release WAL only up to what the target holds durably. The pipeline's
sinks read the journal, each at its own offset: a stopped sink holds journal segments, never
WAL on the database.

Three threads, one job each:

* the **receiver** (in :class:`~sluiceway.cdc.stream.ReplicationStream`) reads messages and
  hands them over in lists;
* the **appender** (:meth:`SlotCapture.run`, on the caller's thread) cuts them into *units* — a
  committed transaction, or one of our watermarks — and, whenever the hand-over queue runs dry
  or enough has gathered, assembles the complete units (:func:`~sluiceway.cdc.assemble.assemble`,
  the same pure code the copy's watermark method lives in) and appends them as one append: a
  group commit whose size follows the load;
* the **copier** (while a copy runs) takes chunks with the DBLog watermark method: ``L``, the
  chunk's rows under a fresh snapshot, saved, ``H``. The watermarks come back through the
  stream, where the appender puts the chunk's rows in place. At most two chunks are read
  ahead of what the appender has appended (``read_ahead``), so chunk files stay few.

Restart after a crash: the target's position (a journal register committed with the records)
says where to resume; the server resends from the slot's confirmed position, which is never
ahead of it, and whatever the target already holds is passed over — no loss, no second copy.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluiceway.cdc.assemble import assemble
from sluiceway.cdc.copier import CopySession
from sluiceway.cdc.errors import CdcError, LostChangesError, SlotInUseError, StreamInterrupted
from sluiceway.cdc.lifecycle import CaptureLife
from sluiceway.cdc.model import Row, TableInfo
from sluiceway.cdc.pgoutput import BEGIN, COMMIT, MESSAGE, RELATION, Commit, Message, decode, format_lsn
from sluiceway.cdc.postgres import (
    CdcSession,
    SlotInfo,
    TableSpec,
    check_publication_name,
    check_slot_name,
)
from sluiceway.cdc.state import CopyState, SourceState
from sluiceway.cdc.stream import ReplicationStream, StreamOptions, local_socket_dsn
from sluiceway.cdc.target import CaptureTarget
from sluiceway.cdc.watermark import Watermark
from sluiceway.cdc.watermark import prefix as watermark_prefix
from sluiceway.journal.arrow import empty_batch

log = logging.getLogger("sluiceway.cdc")

_RELID = struct.Struct(">I")


@dataclass(frozen=True)
class CaptureOptions:
    dsn: str
    #: Table names, or one regular expression over ``schema.table``.
    tables: tuple[str, ...] | str
    slot: str
    publication: str
    #: Where the copy's progress and chunk files live.
    state_dir: str
    snapshot: str = "initial"
    chunk_size: int = 10_000
    #: Records per append at most (an append never splits a transaction).
    max_append: int = 50_000
    #: Group commit: a small append waits up to this long for more to arrive (each append is an
    #: fsync), unless ``linger_rows`` have gathered. Commit → journal latency pays at most this.
    linger: float = 0.005
    linger_rows: int = 20_000
    #: The copy: chunks read ahead of what the journal holds (each a file until appended).
    read_ahead: int = 2
    #: With nothing of ours in the stream for this many WAL bytes, write a heartbeat watermark so
    #: the slot can move on (pgoutput sends nothing for transactions on other tables).
    heartbeat_bytes: int = 16 << 20
    #: Stream over the server's Unix socket when it is on this host. Off by default: measured here
    #: (bench/cdc.py), the capture is faster over loopback TCP, where the kernel coalesces the
    #: walsender's one-message writes while the capture is busy; over the socket each message is
    #: a read of its own. (A receive-only client is the other way round.)
    unix_socket: bool = False
    #: Seconds to wait for another reader of the slot to go (a capture that just stopped).
    busy_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_slot_name(self.slot)
        check_publication_name(self.publication)
        if self.snapshot not in ("initial", "never"):
            raise CdcError(f"snapshot must be 'initial' or 'never', got {self.snapshot!r}")
        if self.chunk_size < 1 or self.max_append < 1:
            raise CdcError("chunk_size and max_append must be at least 1")


@dataclass
class _Unit:
    """A committed transaction's messages, or one watermark; ``position``: where it ends."""

    position: int
    rows: list[Row]


@dataclass
class SlotCapture(CaptureLife):
    """Streams ``options.slot`` into ``target``. ``run()`` until stopped, or ``catch_up()``.

    >>> capture = SlotCapture(options, JournalTarget("./data/cdc"))      # doctest: +SKIP
    >>> capture.prepare(); capture.catch_up()                           # doctest: +SKIP
    """

    options: CaptureOptions
    target: CaptureTarget
    #: Position up to which everything is appended to the target.
    position: int = 0
    #: Position up to which the target holds everything durably: what is confirmed to the server.
    #: The journal holds an append once it returns (``durable == position``); a pipelined target
    #: (``target.pipelined``, a broker's) reports it later, through :meth:`durable_at`.
    durable: int = 0
    appended: int = 0
    _session: CdcSession | None = field(default=None, repr=False)
    _tables: list[TableSpec] = field(default_factory=list, repr=False)
    #: What each captured table's record key is made of (set by prepare()).
    _infos: dict[str, TableInfo] = field(default_factory=dict, repr=False)
    _stream: ReplicationStream | None = field(default=None, repr=False)
    _copier: threading.Thread | None = field(default=None, repr=False)
    _copy_error: BaseException | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _moved: threading.Condition = field(default_factory=threading.Condition, repr=False)
    copy_done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def prefix(self) -> str:
        return watermark_prefix(self.options.slot)

    @property
    def store(self) -> SourceState:
        return SourceState(self.options.state_dir)  # a path holder: nothing read until asked

    @property
    def session(self) -> CdcSession:
        if self._session is None:
            self._session = CdcSession(self.options.dsn)
        return self._session

    # -- set-up ------------------------------------------------------------------------------------
    def check(self) -> SlotInfo | None:
        """Every check that can refuse, creating nothing: the server's settings, the tables, and
        the slot against what the target holds (in use by another process; behind the target; or
        gone — dropped — while the target holds changes: the changes in between are lost). The
        slot as it is now (``None``: still to be created)."""
        opts, session = self.options, self.session
        session.check_server()
        self._tables = session.resolve_tables(opts.tables)
        self._infos = {t.namespace: TableInfo(t.key) for t in self._tables}
        held = self.target.position()
        info = session.slot(opts.slot)
        if info is None:
            if held is not None:
                raise LostChangesError(
                    f"the capture's log holds changes up to {format_lsn(held)} but slot {opts.slot!r} "
                    "does not exist: the changes since are gone (was the slot dropped?). Start from a "
                    "fresh log and checkpoint to copy the tables again."
                )
            return None
        session.check_slot(opts.slot, info)
        deadline = time.monotonic() + opts.busy_timeout
        while info.active_pid is not None and time.monotonic() < deadline:
            # A capture that just stopped leaves its walsender for a moment; a running one stays.
            time.sleep(0.2)
            info = session.slot(opts.slot) or info
        if info.active_pid is not None:
            raise SlotInUseError(
                f"replication slot {opts.slot!r} is being read by another process (pid {info.active_pid}): "
                "stop it first, or give this capture a slot of its own"
            )
        if held is not None and info.confirmed > held:
            raise LostChangesError(
                f"the capture's log holds changes up to {format_lsn(held)} but slot {opts.slot!r} is at "
                f"{format_lsn(info.confirmed)}: the changes in between are gone (was the slot dropped "
                "and created again?). Start from a fresh log and checkpoint to copy the tables again."
            )
        return info

    def prepare(self) -> None:
        """:meth:`check`; then create what is missing (publication, slot) and find where to resume."""
        opts, session = self.options, self.session
        info = self.check()
        session.ensure_publication(opts.publication, self._tables)  # before the slot (pgoutput)
        if info is None:
            info, _ = session.ensure_slot(opts.slot)
        held = self.target.position()
        if held is None:
            # A new target: it starts where the slot is (created now, or kept from before).
            self.target.append(empty_batch(), info.confirmed)
            held = info.confirmed
        self.position = self.durable = held

    def _stream_options(self) -> StreamOptions:
        opts = self.options
        socket = None
        if opts.unix_socket:
            row = self.session.rows("local_socket")[0]
            socket = local_socket_dsn(opts.dsn, str(row[0]), int(row[1]))
        return StreamOptions(opts.dsn, opts.slot, opts.publication, unix_socket=socket)

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start streaming (and the copier, while a copy is due). ``prepare()`` first."""
        self._stream = ReplicationStream(self._stream_options())
        self._stream.start(self.position)
        self._start_copy()

    def close(self) -> None:
        self.stop()
        if self._copier is not None:
            self._copier.join(30)
        if self._stream is not None:
            self._stream.stop()
            self._stream = None
        if self._session is not None:
            self._session.close()
            self._session = None

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """The appender loop, until :meth:`stop` or ``until()`` holds; raises what stopped the stream."""
        stream = self._stream
        assert stream is not None, "start() first"
        units: deque[_Unit] = deque()
        relations: dict[int, Row] = {}  # the latest Relation message per relation id, as of ``units``
        txn: list[Row] | None = None
        gathered = 0
        waiting = False  # the units left need a watermark still to come
        idle_since = time.monotonic()
        first_at = 0.0  # when the oldest unit still to append arrived
        while not self._stop.is_set():
            if self._copy_error is not None:
                raise self._copy_error
            if waiting or not units:
                handover = stream.take(0.05)
            else:
                handover = stream.take_nowait()
                # (None is the end of the stream, an int a quiet position: neither is waited past.)
                if handover == [] and gathered < self.options.linger_rows:
                    left = first_at + self.options.linger - time.monotonic()
                    if left > 0:
                        handover = stream.take(left)
            if handover is None:
                raise _stream_error(stream)
            if isinstance(handover, int):  # a quiet position: every change before it was handed over
                if not units and txn is None and handover > self.position:
                    self._advance(handover)
                continue
            if handover and not units:
                first_at = time.monotonic()
            for row in handover:
                data = row[2]
                kind = data[0]
                if txn is not None:
                    txn.append(row)
                    if kind == COMMIT:
                        commit = decode(data)
                        assert isinstance(commit, Commit)
                        if commit.end_lsn > self.position:
                            units.append(_Unit(commit.end_lsn, txn))
                            gathered += len(txn)
                        else:  # resent after a restart: the target has it (its relations still count)
                            _track_relations(txn, relations)
                        txn = None
                elif kind == BEGIN:
                    txn = [row]
                elif kind == MESSAGE:  # between transactions: a non-transactional message
                    message = decode(data)
                    assert isinstance(message, Message)
                    if message.lsn > self.position:
                        units.append(_Unit(message.lsn, [row]))
                        gathered += 1
                elif kind == RELATION:  # outside a transaction (not sent so by pgoutput, but harmless)
                    relations[_RELID.unpack_from(data, 1)[0]] = row
            if units and (not handover or gathered >= self.options.max_append or waiting):
                # The queue ran dry (and the linger passed), the append is full, or a window waits.
                waiting = not self._append(units, relations)
                gathered = sum(len(u.rows) for u in units)
                idle_since = time.monotonic()
            elif not units and txn is None and time.monotonic() - idle_since > 1.0:
                self._heartbeat(stream)
                idle_since = time.monotonic()
            if until is not None and not units and until():
                return

    def _append(self, units: deque[_Unit], relations: dict[int, Row]) -> bool:
        """Append what of ``units`` is complete; whether any unit was consumed (a chunk window
        whose close has not arrived yet holds back the units from its ``L`` on)."""
        rows: list[Row] = list(relations.values())
        for unit in units:
            rows.extend(unit.rows)
        asm = assemble(
            rows,
            start=self.position,
            limit=self.options.max_append,
            prefix=self.prefix,
            tables=self._infos,
            types=self.session.types,
            chunks=self.store.load_chunk,
        )
        if asm.end > self.position:
            self._hold(asm.batch, asm.end)
            self.appended += asm.records
        consumed = False
        while units and units[0].position <= self.position:
            consumed = True
            _track_relations(units.popleft().rows, relations)
        return consumed

    def _advance(self, position: int) -> None:
        """Record that the log is complete up to ``position`` (a quiet position: nothing of ours
        lies before it that is not in the log)."""
        self._hold(empty_batch(), position)

    def _confirm(self, position: int) -> None:
        stream = self._stream  # close() may clear it meanwhile: a pipelined target reports from its threads
        if stream is not None:
            stream.confirm(position)

    @property
    def wal_end(self) -> int:
        """The server's WAL position as the stream last reported it (0 when not streaming)."""
        return self._stream.wal_end if self._stream is not None else 0

    def _heartbeat(self, stream: ReplicationStream) -> None:
        if stream.wal_end - self.position >= self.options.heartbeat_bytes:
            self.session.emit(self.prefix, Watermark.heartbeat().encode())

    def sync_point(self) -> int:
        """Write a heartbeat watermark now; its position (the capture has caught up once past it)."""
        return self.session.emit(self.prefix, Watermark.heartbeat().encode())

    # -- the copy ----------------------------------------------------------------------------------
    def copying(self, state: CopyState | None = None) -> bool:
        if self.options.snapshot != "initial":
            return False
        return not (state or self.store.load()).all_copied(t.namespace for t in self._tables)

    def _copy_session(self) -> CopySession:
        return CdcSession(self.options.dsn)


def _track_relations(rows: list[Row], relations: dict[int, Row]) -> None:
    """Keep the latest Relation message per relation id: later transactions refer to it."""
    for row in rows:
        if row[2][0] == RELATION:
            relations[_RELID.unpack_from(row[2], 1)[0]] = row


def _stream_error(stream: ReplicationStream) -> CdcError:
    """What ended the stream (see :mod:`sluiceway.cdc.stream`: a lost connection is transient)."""
    ended = f"the replication stream from slot {stream.options.slot!r} ended"
    return stream.error or StreamInterrupted(ended)
