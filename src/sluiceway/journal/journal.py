"""The journal: a durable local append-only log with transactional appends.

:class:`Journal` is a facade; each concern lives in its own module, split by reason to change:

* :mod:`~sluiceway.journal.append` — the append transaction: validating and encoding records
  (the per-record hot path);
* :mod:`~sluiceway.journal.writer` — the one writer: file lock, recovery on open, group
  commit, ``HEAD`` and segment rolls (its docstring is the concurrency model);
* :mod:`~sluiceway.journal.reader` — committed records and Arrow batches from an offset, and
  following the tail; :mod:`~sluiceway.journal.index` is the sparse index they share with
  the writer, :mod:`~sluiceway.journal.head` the ``HEAD`` file other processes read;
* :mod:`~sluiceway.journal.maintenance` — retention and compaction of closed segments;
* the bytes: :mod:`~sluiceway.journal.format`, :mod:`~sluiceway.journal.encode` and
  :mod:`~sluiceway.journal.parse`; files: :mod:`~sluiceway.journal.segment`; named consumers'
  offsets: :mod:`~sluiceway.journal.consumers`.

The facade only validates arguments, wires the parts (one writer, or none when read-only) and
orders their closing: readers stop first, then the writer drains its last group and publishes
its final ``HEAD``, then every descriptor (and the lock) is released.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Final, NoReturn, Self

import pyarrow as pa

from sluiceway.journal import head as head_file
from sluiceway.journal.append import (
    NO_EXPECTATIONS,
    AppendTransaction,
    Expectations,
    MicrosClock,
    system_clock,
)
from sluiceway.journal.compaction import CompactionResult
from sluiceway.journal.consumers import OffsetLog
from sluiceway.journal.errors import JournalClosedError, JournalReadOnlyError
from sluiceway.journal.format import segment_name
from sluiceway.journal.index import SparseIndex
from sluiceway.journal.maintenance import Maintenance
from sluiceway.journal.reader import END, Reader
from sluiceway.journal.record import Record
from sluiceway.journal.segment import list_segments
from sluiceway.journal.writer import Writer

DEFAULT_SEGMENT_BYTES: Final = 64 << 20
_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base: int
    path: str
    size: int


class Journal:
    """A durable, append-only record log in a local directory.

    >>> with Journal.open(path) as j:                                   # doctest: +SKIP
    ...     with j.append(set_registers={"epoch": "7"}) as tx:
    ...         tx.write("user-1", b'{"name": "Ada"}', namespace="users")
    ...     print(tx.offsets)                                           # range(0, 1)
    ...     for rec in j.read(from_offset=0):
    ...         print(rec.offset, rec.key, rec.value)

    Open with ``read_only=True`` from any number of other processes to read (and follow) while
    one writer appends. See ``docs/journal.md`` for the guarantees and the on-disk format.
    """

    def __init__(
        self,
        path: str,
        *,
        read_only: bool,
        fsync: bool,
        segment_bytes: int,
        retention_bytes: int | None,
        retention_age_us: int | None,
        clock: MicrosClock,
        use_inotify: bool,
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._closed = False
        self._close_lock = threading.Lock()  # concurrent close() calls: one closes, the rest return
        self._offset_log = OffsetLog(path, fsync=fsync)
        index = SparseIndex()
        self._writer: Writer | None = None
        self._maintenance: Maintenance | None = None
        if not read_only:
            self._writer = Writer(path, fsync=fsync, segment_bytes=segment_bytes, clock=clock, index=index)
            self._maintenance = Maintenance(
                path,
                self._writer,
                self._offset_log,
                retention_bytes=retention_bytes,
                retention_age_us=retention_age_us,
            )
            self._writer.on_roll = self._maintenance.after_roll
        self._reader = Reader(path, writer=self._writer, index=index, use_inotify=use_inotify)

    # --- opening ----------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = True,
        retention_bytes: int | None = None,
        retention_age: timedelta | float | None = None,
        read_only: bool = False,
        clock: MicrosClock | None = None,
        use_inotify: bool = True,
    ) -> Journal:
        """Open (a writer creates it if needed) the journal in directory ``path``.

        ``segment_bytes``: roll to a new segment file before a write would pass this size.
        ``fsync=False`` skips syncing (fast, not durable across power loss or OS crash).
        ``retention_bytes``/``retention_age`` (seconds or ``timedelta``): delete whole closed
        segments, oldest first, while the journal is bigger / the segment is older.
        ``read_only``: no lock, no writes; any number of readers beside the one writer.
        ``clock``: µs since epoch, injectable for tests. ``use_inotify=False`` forces polling.
        """
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if retention_bytes is not None and retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0")
        age_us: int | None = None
        if retention_age is not None:
            age_us = (
                retention_age // _US
                if isinstance(retention_age, timedelta)
                else int(retention_age * 1_000_000)
            )
            if age_us < 0:
                raise ValueError("retention_age must be >= 0")
        journal = cls(
            os.fspath(path),
            read_only=read_only,
            fsync=fsync,
            segment_bytes=segment_bytes,
            retention_bytes=retention_bytes,
            retention_age_us=age_us,
            clock=clock or system_clock,
            use_inotify=use_inotify,
        )
        try:
            if journal._writer is not None and journal._maintenance is not None:
                journal._writer.open()
                journal._maintenance.enforce_retention()
            else:
                journal._reader.open()
        except BaseException:
            journal._release()
            raise
        return journal

    @staticmethod
    def head_offset(path: str | os.PathLike[str]) -> int:
        """The next offset the journal at ``path`` will assign, without opening it or taking a lock."""
        return head_file.head_offset(os.fspath(path))

    # --- appending --------------------------------------------------------------------------
    def append(
        self,
        expect_offset: int | None = None,
        expect_registers: Mapping[str, str | None] | None = None,
        set_registers: Mapping[str, str] | None = None,
    ) -> AppendTransaction:
        """Start an all-or-nothing append (use as a context manager; it commits on exit).

        ``expect_offset``: the append fails with :class:`ExpectationFailed` unless it would get
        exactly this first offset. ``expect_registers``: likewise unless each named register has
        the given value (``None``: is unset). ``set_registers``: register values committed
        atomically with the records. Success is reported only once the append is durable.

        >>> with journal.append(expect_registers={"leader": "a"}) as tx:  # doctest: +SKIP
        ...     tx.write("k", b"v")
        """
        writer = self._writer
        if writer is None or self._closed:
            self._refuse_writes()
        if expect_offset is None and not expect_registers and not set_registers:
            return AppendTransaction(writer, NO_EXPECTATIONS)
        return AppendTransaction(writer, Expectations.checked(expect_offset, expect_registers, set_registers))

    def _refuse_writes(self) -> NoReturn:
        if self.read_only:
            raise JournalReadOnlyError(f"journal {self.path} is open read-only")
        raise JournalClosedError(f"journal {self.path} is closed")

    # --- reading ----------------------------------------------------------------------------
    @property
    def head(self) -> int:
        """The next offset to be assigned (committed records are ``[start, head)``)."""
        self._check_open()
        return self._reader.visible().head

    def read(
        self,
        from_offset: int = 0,
        to_offset: int | None = None,
        follow: bool = False,
        timeout: float | None = None,
    ) -> Iterator[Record]:
        """Committed records with ``from_offset <= offset < to_offset``, in offset order.

        ``follow=True`` keeps waiting for new records (blocking, no busy loop) instead of
        stopping at the head; ``timeout`` ends the iteration after that many seconds without a
        new record. Records below the first retained segment are skipped.
        """
        self._check_open()
        hi = END if to_offset is None else to_offset
        return self._reader.records(max(0, from_offset), hi, follow, timeout, owner=self)

    def read_arrow(
        self, from_offset: int = 0, to_offset: int | None = None, max_rows: int = 65536
    ) -> Iterator[pa.RecordBatch]:
        """Committed records in ``[from_offset, to_offset)`` as Arrow record batches of ≤ ``max_rows``.

        Schema: :data:`sluiceway.journal.ARROW_SCHEMA`. Decoding is vectorised over many
        commits at a time; checksums are verified exactly as for :meth:`read`.
        """
        self._check_open()
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        hi = END if to_offset is None else to_offset
        return self._reader.arrow(max(0, from_offset), hi, max_rows, owner=self)

    # --- registers and consumers --------------------------------------------------------------
    def registers(self) -> dict[str, str]:
        """The journal's registers as of the last committed append."""
        self._check_open()
        return self._reader.registers()

    def commit_offset(self, consumer: str, offset: int) -> None:
        """Durably record that ``consumer`` has processed everything below ``offset``.

        Works from readers too (the offset log has its own lock). Compaction never removes
        records at or above the lowest committed consumer offset.
        """
        self._check_open()
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("consumer must be a non-empty str")
        head = self.head
        if not isinstance(offset, int) or offset < 0 or offset > head:
            raise ValueError(f"offset must be between 0 and the head ({head}), got {offset!r}")
        self._offset_log.commit(consumer, offset)

    def offset(self, consumer: str) -> int | None:
        """The offset last committed for ``consumer`` (``None`` if it never committed one)."""
        self._check_open()
        return self._offset_log.offsets().get(consumer)

    def consumers(self) -> dict[str, int]:
        """Every named consumer and its committed offset."""
        self._check_open()
        return self._offset_log.offsets()

    def remove_consumer(self, consumer: str) -> None:
        """Forget ``consumer`` so it no longer holds back compaction."""
        self._check_open()
        self._offset_log.commit(consumer, -1)

    # --- maintenance ------------------------------------------------------------------------
    def segments(self) -> list[SegmentInfo]:
        """The segment files, oldest first (the last one is active)."""
        self._check_open()
        out = []
        for base in list_segments(self.path):
            path = os.path.join(self.path, segment_name(base))
            with contextlib.suppress(FileNotFoundError):
                out.append(SegmentInfo(base, path, os.path.getsize(path)))
        return out

    def release(self, below: int) -> int:
        """Remove the closed segments whose every record has an offset below ``below``; how many.

        For a log whose readers have all passed ``below`` (a capture's journal, released up to
        the slowest sink's committed offset). Offsets are never reused: the head stays.
        """
        maintenance = self._maintenance
        if maintenance is None or self._closed:
            self._refuse_writes()
        return maintenance.release_below(below)

    def first_offset(self) -> int:
        """The lowest offset still stored (records below it were released or expired)."""
        self._check_open()
        bases = list_segments(self.path)
        return bases[0] if bases else self.head

    def compact(self, *, horizon: int | None = None) -> CompactionResult:
        """Apply retention, then compact closed segments below the consumers' horizon.

        In a closed segment, a record below ``min(committed consumer offsets, horizon)`` is
        removed when a later record has the same ``(namespace, key)``. Kept records keep their
        offsets. With no named consumers, only an explicit ``horizon`` allows removal.
        """
        maintenance = self._maintenance
        if maintenance is None or self._closed:
            self._refuse_writes()
        return maintenance.compact(horizon)

    # --- closing ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(f"journal {self.path} is closed")

    def close(self) -> None:
        """Finish in-flight commits, fail queued ones, wake followers and release the lock."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True  # new appends are refused; the writer fails those already queued
        self._reader.stop()
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._offset_log.close()
        if self._writer is not None:
            self._writer.release()  # closing the LOCK descriptor releases the flock
        self._reader.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A journal dropped without close(): release the descriptors (and the writer lock) so
        # the process can open it again. No final HEAD sync: that is what close() is for.
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self._release()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writer"
        state = "closed" if self._closed else f"head={self._reader.visible().head}"
        return f"<Journal {self.path!r} {mode} {state}>"
