"""The journal adapter of the Publisher port: outbox records appended to a local journal.

Each record's namespace is its outbox topic. The leader's epoch (from the database lease) is
kept in a journal register: every append expects the register to still hold this term's epoch,
so a fenced, stale leader's appends are rejected by the journal itself.

Records are appended in the order they were sent, one append at a time, so a key's records
(several may be in flight with ``perKeyInFlight`` > 1) land in order. It is gapless per key: once
an append fails, the records of its keys that were sent under the same leader id and are still
queued fail too, without being appended — a failed record is never followed in the journal by
a later record of its key. Records marked under a later leader id (the re-send) go through.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sluiceway.errors import LeadershipError
from sluiceway.harvest.ports import ColumnsDone, Delivery
from sluiceway.journal import ExpectationFailed, Journal, JournalError, JournalLockedError
from sluiceway.outbox.record import MarkedRecord, RecordColumns

log = logging.getLogger("sluiceway.harvest.journal")

_Item = tuple[MarkedRecord, Callable[[Delivery], None]]
#: ``send_columns``'s records: appended whole, in one append of their own.
_Columns = tuple[RecordColumns, ColumnsDone]


class JournalPublisher:
    """Group-commits queued records into journal appends (up to ``max_batch`` per append)."""

    #: ``send`` only queues the record for the appender thread: the engine calls it inline.
    inline = True

    def __init__(
        self,
        path: str,
        *,
        epoch: int,
        register: str = "sluiceway.harvest.epoch",
        segment_bytes: int = 64 << 20,
        fsync: bool = True,
        open_timeout: float = 10.0,
        max_batch: int = 1000,
    ) -> None:
        self.path = path
        self.epoch = epoch
        self.register = register
        self.max_batch = max_batch
        self.journal = self._open(path, segment_bytes, fsync, open_timeout)
        try:
            self._claim_epoch()
        except BaseException:
            self.journal.close()
            raise
        self._queue: queue.Queue[_Item | _Columns | None] = queue.Queue()
        #: key -> leader id of its record whose append failed (journal thread only).
        self._failed: dict[str, str | None] = {}
        self._busy = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sluice-journal-publisher", daemon=True)
        self._thread.start()

    @staticmethod
    def _open(path: str, segment_bytes: int, fsync: bool, timeout: float) -> Journal:
        # The previous leader may still be closing the journal (one writer process at a time).
        deadline = time.monotonic() + timeout
        while True:
            try:
                return Journal.open(path, segment_bytes=segment_bytes, fsync=fsync)
            except JournalLockedError as exc:
                if time.monotonic() >= deadline:
                    raise LeadershipError(f"journal {path} is still held by another writer") from exc
                time.sleep(0.05)

    def _claim_epoch(self) -> None:
        current = self.journal.registers().get(self.register)
        if current is not None and int(current) > self.epoch:
            raise LeadershipError(
                f"journal {self.path} belongs to a newer leader (epoch {current} > {self.epoch})"
            )
        if current != str(self.epoch):
            try:
                with self.journal.append(
                    expect_registers={self.register: current}, set_registers={self.register: str(self.epoch)}
                ):
                    pass
            except ExpectationFailed as exc:
                raise LeadershipError(f"another leader claimed journal {self.path} first") from exc

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        with self._idle:
            self._busy += 1
        self._queue.put((record, on_done))

    def send_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        """All of ``columns`` in one append of their own, after what was sent before."""
        with self._idle:
            self._busy += 1
        self._queue.put((columns, done))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch: list[_Item] = []
            columns: _Columns | None = None
            stop = False
            item: _Item | _Columns | None = first
            while item is not None:
                if isinstance(item[0], RecordColumns):
                    columns = item
                    break
                batch.append(item)
                if len(batch) >= self.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                stop = item is None
            if batch:
                self._append(batch)
            if columns is not None:
                self._append_columns(*columns)
            with self._idle:
                self._busy -= len(batch) + (columns is not None)
                self._idle.notify_all()
            if stop:
                return

    def _append_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        if self._failed:  # behind a failed append nothing more is appended (gapless)
            for i in range(len(columns)):
                done.failed(i, Delivery(columns.record(i), error="not appended: an earlier append failed"))
            return
        try:
            with self.journal.append(expect_registers={self.register: str(self.epoch)}) as tx:
                for i in range(len(columns)):
                    tx.write(
                        columns.keys[i],
                        columns.values[i],
                        headers=columns.headers[i],
                        namespace=columns.topics[i],
                        timestamp=columns.create_times[i],
                    )
        except (ExpectationFailed, JournalError, OSError) as exc:
            error = (
                f"fenced: journal epoch register moved past {self.epoch}"
                if isinstance(exc, ExpectationFailed)
                else f"{type(exc).__name__}: {exc}"
            )
            for i in range(len(columns)):
                self._failed[columns.keys[i]] = columns.leader_id
                done.failed(i, Delivery(columns.record(i), error=error))
            return
        done.acked(len(columns))

    def _append(self, batch: list[_Item]) -> None:
        if self._failed:
            batch = self._withhold(batch)
            if not batch:
                return
        try:
            with self.journal.append(expect_registers={self.register: str(self.epoch)}) as tx:
                for record, _ in batch:
                    tx.write(
                        record.key,
                        record.value,
                        headers=list(record.headers),
                        namespace=record.topic,
                        timestamp=record.create_time,
                    )
            offsets = tx.offsets
        except ExpectationFailed:
            error = f"fenced: journal epoch register moved past {self.epoch}"
            log.warning("journal append rejected: %s", error)
            self._fail(batch, error)
            return
        except (JournalError, OSError) as exc:
            self._fail(batch, f"{type(exc).__name__}: {exc}")
            return
        for (record, done), offset in zip(batch, offsets, strict=True):
            done(Delivery(record, offset=offset))

    def _fail(self, batch: list[_Item], error: str) -> None:
        for record, done in batch:
            self._failed[record.key] = record.leader_id
            done(Delivery(record, error=error))

    def _withhold(self, batch: list[_Item]) -> list[_Item]:
        """Fail, unappended, the records queued behind a failed record of their key (same leader
        id); a record marked under another leader id is a re-send and clears its key."""
        keep: list[_Item] = []
        for record, done in batch:
            if record.key in self._failed:
                if self._failed[record.key] == record.leader_id:
                    done(Delivery(record, error="not appended: an earlier record of its key failed"))
                    continue
                del self._failed[record.key]
            keep.append((record, done))
        return keep

    def flush(self, timeout: float) -> int:
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout)
            return self._busy

    def close(self) -> None:
        self.flush(5.0)
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.journal.close()


def check_journal_path(path: str) -> None:
    """The start-up check of a journal destination, creating nothing: ``path`` is a directory
    this user may write, or one it may create (its nearest existing parent is a writable
    directory). Raises ``NotADirectoryError`` or ``PermissionError``: permanent, both (see
    :func:`sluiceway.db.classify`)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{os.strerror(errno.ENOTDIR)} (journal {path})", str(probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{os.strerror(errno.EACCES)} (journal {path})", str(probe))
