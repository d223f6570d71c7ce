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

Positions are file and offset on one server. Beside them the capture keeps a GTID checkpoint
(``binlog.json`` in the state directory, :mod:`~sluiceway.cdc.mysql.gtid`): the server's id and the
GTID state at a durable position, written as the target confirms (at most every
:data:`CHECKPOINT_EVERY` seconds while changes stream, every :data:`CHECKPOINT_QUIET` once the
stream is quiet, and when the capture closes). On another server — a replica promoted in a
failover, behind the same DSN or a new one — the capture resumes from that GTID state, where
file and offset would mean nothing.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluiceway.cdc.copier import CopySession
from sluiceway.cdc.errors import CdcError, LostChangesError, StreamInterrupted
from sluiceway.cdc.lifecycle import CaptureLife
from sluiceway.cdc.mysql.assemble import Unit, assemble, position, split_position
from sluiceway.cdc.mysql.gtid import (
    Checkpoint,
    Resume,
    advance,
    covers,
    epoch_of,
    format_state,
    missing,
    parse_state,
    plan_resume,
)
from sluiceway.cdc.mysql.reader import BinlogReader, ReaderOptions
from sluiceway.cdc.mysql.server import WATERMARKS, BinlogSession, BinlogTable
from sluiceway.cdc.state import SourceState
from sluiceway.cdc.target import CaptureTarget
from sluiceway.cdc.watermark import Watermark
from sluiceway.files import write_json
from sluiceway.journal.arrow import empty_batch

log = logging.getLogger("sluiceway.cdc")

#: Seconds between GTID checkpoints while changes stream, and once the stream is quiet (nothing
#: for a moment); each is an fsynced file (see the module's docstring).
CHECKPOINT_EVERY = 1.0
CHECKPOINT_QUIET = 0.2


class CheckpointFile:
    """The GTID checkpoint on disk: ``<state dir>/binlog.json``."""

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / "binlog.json"

    def load(self) -> Checkpoint | None:
        import json

        try:
            return Checkpoint.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CdcError(
                f"{self.path} is not a GTID checkpoint ({exc}): it says which server the capture's "
                "positions are from; delete it only if the capture still reads the server it read before"
            ) from None

    def save(self, checkpoint: Checkpoint) -> None:
        write_json(self.path, checkpoint.to_json(), durable=True)


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
    """A position as ``binlog.000042:1234`` (or ``#42:1234`` without the file names), after a move
    to another server with its epoch (``binlog.000003:1234 (epoch 1)``)."""
    number, pos = split_position(value)
    name = (files or {}).get(number, f"#{number}")
    epoch = epoch_of(value)
    return f"{name}:{pos}" + (f" (epoch {epoch})" if epoch else "")


_PLACE = re.compile(r"(?:[^:\s]*\.|#)?(\d+):(\d+)(?:\s*\(epoch (\d+)\))?")


def parse_position(text: str) -> int:
    """A position as :func:`describe_position` writes it (``binlog.000042:1234``, ``#42:1234``,
    ``binlog.000003:1234 (epoch 1)``); :class:`ValueError` for anything else.

    >>> parse_position("binlog.000003:1234 (epoch 1)") == position(3, 1234, 1)
    True
    """
    found = _PLACE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a binlog position: {text!r}")
    number, pos, epoch = found.groups()
    return position(int(number), int(pos), int(epoch or 0))


def copy_due(options: BinlogOptions, tables: list[BinlogTable]) -> bool:
    """A table is still to be copied (``snapshot: initial`` and the state directory says so)."""
    if options.snapshot != "initial":
        return False
    return not SourceState(options.state_dir).load().all_copied(t.namespace for t in tables)


def check_writable(session: BinlogSession, options: BinlogOptions, tables: list[BinlogTable]) -> bool:
    """Whether the server is read-only (a replica: the capture then writes nothing there); a
    copy still to do is refused on one, in one line. Reads only."""
    if not session.read_only():
        return False
    if copy_due(options, tables):
        raise CdcError(
            f"server id {session.server_id()} is read-only (read_only=ON, a replica): the copy marks its "
            f"chunks in the binlog by writing to {session.database}.{WATERMARKS}, which must not happen "
            "there; copy from the primary, or set snapshot: never to stream changes only"
        )
    return True


def check_resume(
    session: BinlogSession, held: int, saved: Checkpoint | None, *, server_id: int, mariadb: bool
) -> Resume:
    """Where a capture holding ``held`` (its log's position) resumes on ``session``'s server, or
    the one-line refusal: another server with no GTID state to go on from (MySQL), one that lacks
    transactions the log holds, a binlog purged past the position. Reads only."""
    resume = plan_resume(held, server_id, saved, gtids=mariadb)
    if resume.gtid is not None:
        lacking = missing(resume.gtid, session.gtid_binlog_state())
        if lacking:
            raise LostChangesError(
                f"server id {server_id} has not written every transaction the capture's log holds "
                f"(it lacks {', '.join(lacking)}): it is behind the server the log was read from, or of "
                "another topology; point the capture at a server that has them, or start a fresh log "
                "and checkpoint to copy the tables again"
            )
        return resume
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
    return resume


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
    #: Where the reader starts (by file and offset, or by GTID state after a server switch).
    resume: Resume = field(default_factory=lambda: Resume(0), repr=False)
    _server_id: int = field(default=0, repr=False)
    _mariadb: bool = field(default=False, repr=False)
    #: The GTID state after the last unit appended, and per append not yet durable its end and
    #: the state there (MariaDB only).
    _gtids: dict[str, str] = field(default_factory=dict, repr=False)
    _held: collections.deque[tuple[int, str]] = field(default_factory=collections.deque, repr=False)
    #: The GTID checkpoint as check() found it, and the one due to be written.
    _saved: Checkpoint | None = field(default=None, repr=False)
    _due: Checkpoint | None = field(default=None, repr=False)
    _saved_at: float = field(default=0.0, repr=False)
    _saving: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The GTID state at the durable position (MariaDB).
    _durable_gtids: str = field(default="", repr=False)
    #: The server is read-only (a replica): nothing is written there, no watermark either.
    _read_only: bool = field(default=False, repr=False)

    @property
    def prefix(self) -> str:
        return f"sluice-cdc:{self.options.slot}"

    @property
    def checkpoints(self) -> CheckpointFile:
        return CheckpointFile(self.options.state_dir)

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
        grants, the tables (each with a primary key), that the server is the one the held
        position is from (else a GTID state to resume from there), and that its binlog still
        holds the position the target resumes from."""
        session = self.session
        session.check_server()
        self._tables = session.resolve_tables(self.options.tables)
        self._server_id, self._mariadb = session.server_id(), session.is_mariadb()
        self._read_only = check_writable(session, self.options, self._tables)
        held = self.target.position()
        if held is None:
            return
        self._saved = self.checkpoints.load()
        self.resume = check_resume(
            session, held, self._saved, server_id=self._server_id, mariadb=self._mariadb
        )

    def prepare(self) -> None:
        self.check()
        session = self.session
        if not self._read_only:
            session.ensure_watermarks(self.prefix)
        held = self.target.position()
        saved = self._saved  # (None for a new log: check() read none)
        if held is None:
            held = session.current()
            self.target.append(empty_batch(), held)
        resume = self.resume
        session.epoch = resume.epoch
        self.position = self.durable = held
        if not self._mariadb:
            state = ""  # MySQL: the checkpoint only says which server the positions are from
        elif resume.gtid is not None:
            self._rebase_copy(held, session.current())
            log.warning(
                "cdc: the binlog's positions are another server's (server id %s), this is server id %s: "
                "resuming from the GTID state %s (positions of epoch %d)%s",
                "?" if saved is None else saved.server_id, self._server_id, resume.gtid, resume.epoch,
                "; the GTID checkpoint is older than the capture's log: the changes since are sent again"
                if resume.behind else "",
            )  # fmt: skip
            state = resume.gtid
        elif saved is not None and saved.position == held:
            state = saved.gtid
        else:
            number, pos = split_position(held)
            state = session.gtid_at(session.binary_logs()[number], pos)
        self._gtids = parse_state(state)
        self._durable_gtids = state
        # Written at once: from here the held position counts as this server's (its epoch).
        self.checkpoints.save(Checkpoint(self._server_id, resume.epoch, held, state))
        self._saved_at = time.monotonic()

    def _rebase_copy(self, held: int, here: int) -> None:
        """After a move to another server: the copy's watermark positions past ``held`` were the
        old server's offsets; the new server has those watermarks (replicated) before ``here``, its
        end now, so they count as there — a chunk file is kept until the target passes it."""
        store = self.store
        with store.locked():
            state = store.load()
            state.closes = {cid: (here if close > held else close) for cid, close in state.closes.items()}
            if state.frontier > held:
                state.frontier = here
            if state.done_at is not None and state.done_at > held:
                state.done_at = here
            for progress in state.tables.values():
                if progress.completed_at is not None and progress.completed_at > held:
                    progress.completed_at = here
            store.save(state)

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
            epoch=self.resume.epoch,
        )
        self._reader = BinlogReader(options, self.position, self.resume.gtid)
        self._reader.start()
        self._start_copy()

    def close(self) -> None:
        self.stop()
        if self._copier is not None:
            self._copier.join(30)
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        self._save_checkpoint(every=0.0)
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
                # The transactions read whole before the stream ended are appended first.
                while units and self._append(units):
                    pass
                raise reader.error or StreamInterrupted("the binlog stream ended")
            if not got and not units and self._due is not None:
                self._save_checkpoint(every=CHECKPOINT_QUIET)  # quiet: the checkpoint catches up
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
                appended = self._append(units)
                if appended:
                    first_at = time.monotonic()
                waiting = bool(units) and not appended
            if until is not None and not units and until():
                return

    def _append(self, units: list[Unit]) -> bool:
        """Assemble the complete units at the head of ``units`` and append them (removed from
        ``units``); False when none is complete (a window still open)."""
        done = assemble(units, self.store.load_chunk, limit=self.options.max_append)
        if not done.units:
            return False
        if self._mariadb:
            for unit in units[: done.units]:
                if unit.gtid:
                    advance(self._gtids, unit.gtid)
            with self._saving:
                self._held.append((done.end, format_state(self._gtids)))
        self._hold(done.batch, done.end)
        self.appended += done.batch.num_rows
        del units[: done.units]
        return True

    @property
    def wal_end(self) -> int:
        return self.position

    def _confirm(self, position: int) -> None:
        """The target holds everything before ``position``: its GTID state is the checkpoint due."""
        if not self._mariadb:
            return
        with self._saving:
            found = None
            while self._held and self._held[0][0] <= position:
                found = self._held.popleft()
            if found is None:
                return
            self._due = Checkpoint(self._server_id, self.resume.epoch, found[0], found[1])
            self._durable_gtids = found[1]
        self._save_checkpoint()

    def _save_checkpoint(self, *, every: float = CHECKPOINT_EVERY) -> None:
        with self._saving:
            due = self._due
            if due is None or time.monotonic() - self._saved_at < every:
                return
            self.checkpoints.save(due)
            self._due, self._saved_at = None, time.monotonic()

    def sync_point(self) -> int | str:
        if not self._read_only:
            return self.session.emit(self.prefix, Watermark.heartbeat().encode())
        if self._mariadb:
            # No heartbeat can be written: the point is the server's GTIDs now, reached once the
            # target holds a transaction at or past each (a binlog's end may lie past the last
            # transaction, after a rotation, where no position the stream reports reaches it).
            return self.session.gtid_binlog_pos()
        return self.session.current()

    def reached(self, point: int | str) -> bool:
        if isinstance(point, str):
            with self._saving:
                return covers(self._durable_gtids, point)
        return super().reached(point)

    # -- the copy ----------------------------------------------------------------------------------
    def copying(self) -> bool:
        return copy_due(self.options, self._tables)

    def _copy_session(self) -> CopySession:
        return BinlogSession(self.options.dsn, self.resume.epoch)
