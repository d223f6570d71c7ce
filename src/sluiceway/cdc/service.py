"""A capture into a journal, run beside whatever reads it (the pipeline's driver, a test).

Where it runs, and why: on a thread of the process that starts it (the pipeline's Spark driver).
The driver's Python is idle while a streaming pipeline runs — Spark plans in the JVM and the
sinks write from the executors' Python workers — so the thread does not compete for much; one
process means one thing to stop, to signal, or to kill: a ``kill -9`` of the pipeline ends the
capture too, and no orphaned capture keeps the journal's writer lock or the slot. The receiver
inside it reads the socket on a thread of its own (libpq waits without the GIL).

Layout under the pipeline's checkpoint: ``_cdc/log`` (the journal the sinks read), ``_cdc/state``
(the copy's progress and chunk files).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluiceway.cdc.capture import CaptureOptions, SlotCapture
from sluiceway.cdc.errors import StreamInterrupted
from sluiceway.cdc.mysql.capture import BinlogCapture, BinlogOptions, describe_position
from sluiceway.cdc.pgoutput import format_lsn
from sluiceway.cdc.progress import CaptureJournal, CdcStatus, read_progress
from sluiceway.cdc.target import JournalTarget
from sluiceway.errors import DatabaseUnavailableError

log = logging.getLogger("sluiceway.cdc")


def log_path(root: str | Path) -> Path:
    return Path(root) / "log"


def state_path(root: str | Path) -> Path:
    return Path(root) / "state"


class CaptureService:
    """``prepare()`` (checks; one line per problem), then ``catch_up()`` or ``start()``…``close()``."""

    def __init__(
        self, options: CaptureOptions | BinlogOptions, log_dir: str | Path, *, consumers: tuple[str, ...] = ()
    ) -> None:
        self.options = options
        self.log_dir = Path(log_dir)
        #: The journal's readers (the pipeline's sinks): what all of them committed is released.
        self.consumers = consumers
        self.target: JournalTarget | None = None
        self.capture: SlotCapture | BinlogCapture | None = None
        self._thread: threading.Thread | None = None
        #: What ended the background capture, if it failed.
        self.error: BaseException | None = None
        self._closing = threading.Event()

    def _capture(self, target: Any) -> SlotCapture | BinlogCapture:
        """The capture of the options' source: a PostgreSQL slot, or a MariaDB/MySQL binlog."""
        if isinstance(self.options, BinlogOptions):
            return BinlogCapture(self.options, target)
        return SlotCapture(self.options, target)

    def position_text(self, position: int) -> str:
        return (
            describe_position(position) if isinstance(self.options, BinlogOptions) else format_lsn(position)
        )

    def prepare(self) -> SlotCapture | BinlogCapture:
        if not self.log_dir.exists():
            # Nothing is made (directory, journal, publication, slot) before every check that can
            # refuse has passed: with no log yet, the checks run first against an empty one.
            probe = self._capture(_NoLogYet())
            try:
                probe.check()
            finally:
                probe.close()
        self.log_dir.parent.mkdir(parents=True, exist_ok=True)
        self.target = JournalTarget(str(self.log_dir), consumers=self.consumers)
        self.capture = self._capture(self.target)
        try:
            self.capture.prepare()
        except BaseException:
            self.close()
            raise
        return self.capture

    def catch_up(self, timeout: float | None = None) -> None:
        """Copy what is still to copy and append every change committed before now; then stop."""
        capture = self.capture or self.prepare()
        capture.start()
        try:
            capture.catch_up(timeout)
        finally:
            self.close()

    def start(self) -> None:
        """Capture on a background thread until :meth:`close`; a failure is kept in :attr:`error`."""
        capture = self.capture or self.prepare()
        capture.start()
        self._thread = threading.Thread(target=self._run, name="sluice-cdc-capture", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Capture until closed. A lost connection or an unreachable server is waited out with
        backoff (one warning per outage); anything else ends the capture, kept in :attr:`error`."""
        delay, warned = 0.5, False
        while True:
            capture = self.capture
            if capture is None:
                return
            try:
                capture.run()
                return
            except (StreamInterrupted, DatabaseUnavailableError) as exc:
                if self._closing.is_set():
                    return
                if not warned:
                    log.warning("cdc: %s; reconnecting (with backoff) to resume from the journal", exc)
                    warned = True
            except BaseException as exc:
                self.error = exc
                log.error("cdc: the capture stopped: %s", exc)
                return
            # A fresh capture on the same journal: it resumes from what the journal holds.
            capture.close()
            while not self._closing.wait(delay):
                delay = min(delay * 2, 10.0)
                retry = self._capture(capture.target)
                try:
                    retry.prepare()
                    retry.start()
                except (StreamInterrupted, DatabaseUnavailableError):
                    retry.close()
                    continue
                except BaseException as exc:
                    retry.close()
                    self.error = exc
                    log.error("cdc: the capture stopped: %s", exc)
                    return
                log.info("cdc: reconnected; capturing from %s", self.position_text(retry.position))
                self.capture, delay, warned = retry, 0.5, False
                if self._closing.is_set():  # closed while this one started
                    retry.stop()
                break
            if self._closing.is_set():
                return

    def close(self) -> None:
        self._closing.set()
        if self.capture is not None:
            self.capture.stop()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self.capture is not None:
            self.capture.close()
            self.capture = None
        if self.target is not None:
            self.target.close()
            self.target = None


def describe(service: CaptureService) -> CdcStatus:
    """Per table: copy phase and progress; the slot (confirmed position, WAL it retains) or, for a
    binlog, the capture's place on the server; the capture's journal (records, and the stream
    position it holds). Reads only."""
    from sluiceway.cdc.mysql.progress import read_binlog_progress
    from sluiceway.cdc.mysql.server import BinlogSession
    from sluiceway.cdc.postgres import CdcSession
    from sluiceway.cdc.target import POSITION_REGISTER
    from sluiceway.journal import Journal, JournalNotFoundError

    options = service.options
    held: int | None = None
    records = 0
    consumers: dict[str, int] | None = None
    try:
        with Journal.open(service.log_dir, read_only=True) as log_journal:
            register = log_journal.registers().get(POSITION_REGISTER)
            held = None if register is None else int(register)
            records, consumers = log_journal.head, log_journal.consumers()
    except JournalNotFoundError:
        pass
    slot = binlog = replica = None
    where: Callable[[int], str] = service.position_text
    if isinstance(options, BinlogOptions):
        session = BinlogSession(options.dsn)
        try:
            tables, binlog, where = read_binlog_progress(
                session, options.state_dir, options.tables, snapshot=options.snapshot, held=held
            )
        finally:
            session.close()
        replica = f"server id {options.server_id}"
    else:
        pg = CdcSession(options.dsn)
        try:
            tables, slot = read_progress(
                pg, options.state_dir, options.tables, snapshot=options.snapshot, slot=options.slot
            )
        finally:
            pg.close()
    journal = None
    if consumers is not None:
        journal = CaptureJournal(
            path=str(service.log_dir),
            records=records,
            position=None if held is None else where(held),
            consumers=consumers,
        )
    return CdcStatus(tables, slot, journal, replica, binlog)


class _NoLogYet:
    """The capture's log before it exists: it holds nothing (for :meth:`SlotCapture.check`)."""

    def position(self) -> int | None:
        return None

    def append(self, batch: Any, end: int) -> None:
        raise AssertionError("a check appends nothing")

    def close(self) -> None:
        pass
