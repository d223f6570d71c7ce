"""The journal's readers: committed records from an offset, as records or Arrow, and following the tail.

Why it is shaped so:

* **Readers never read past the published view** (:class:`~sluiceway.journal.format.HeadState`):
  the writer's own view in the writing process, the ``HEAD`` file in any other. So they see
  durable, committed data only, and never need a lock.
* **One engine, two outputs.** :meth:`Reader._chunks` does everything that is about *where*
  data is — finding the segment (and, through the sparse index, the position) holding an
  offset, walking on across segment rolls and retention, verifying each batch's checksum,
  waiting for more when following — and yields verified batches by read buffer. The record
  iterator and the Arrow decoder only decode; both see exactly the same checks.
* **Each read holds its own descriptor** on the segment it reads (``SegmentReader``), so
  compaction replacing a file or retention deleting it does not disturb a read in progress.
* **Following does not poll in a hot loop**: in the writing process a follower waits on the
  writer's condition; in another process it watches ``HEAD`` (inotify, or polling with a
  bounded back-off where inotify is unavailable). Closing the journal wakes both, the latter
  through a pipe.
* **Registers** come from the writer's memory in the writing process; elsewhere they are
  derived from the active segment, cached by position, so asking again reads only new batches.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from sluiceway.journal.arrow import decode_arrow
from sluiceway.journal.errors import CorruptRecordError, JournalError, JournalNotFoundError
from sluiceway.journal.format import HeadState, segment_name
from sluiceway.journal.head import HEAD_FILE, read_head_fd, scan_view
from sluiceway.journal.index import SparseIndex
from sluiceway.journal.notify import Watcher, make_watcher
from sluiceway.journal.parse import Invalid, ParsedBatch, RecordProblem, iter_records, locate_damage
from sluiceway.journal.record import Record
from sluiceway.journal.segment import SegmentReader, list_segments
from sluiceway.journal.writer import Writer

END: int = (1 << 63) - 1  # "no upper bound" for a read's to_offset
_ITER_CHUNK = 1 << 20
_ARROW_CHUNK = 8 << 20


class Reader:
    """Reads one journal directory; with ``writer`` (the same process writes), from its view."""

    def __init__(self, path: str, *, writer: Writer | None, index: SparseIndex, use_inotify: bool) -> None:
        self.path = path
        self.closed = False
        self._writer = writer
        self._index = index
        self._use_inotify = use_inotify
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._head_fd = -1  # read-only: the HEAD file, opened once it exists
        # Read-only: registers are derived incrementally from the active segment.
        self._reg_cache: tuple[int, int, int, dict[str, str]] | None = None
        self._reg_lock = threading.Lock()

    def open(self) -> None:
        """Read-only: check the journal exists (``HEAD`` may be written only later)."""
        if not os.path.isdir(self.path) or not (
            os.path.exists(os.path.join(self.path, HEAD_FILE)) or list_segments(self.path)
        ):
            raise JournalNotFoundError(self.path)
        with contextlib.suppress(FileNotFoundError):
            self._head_fd = os.open(os.path.join(self.path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)

    def visible(self) -> HeadState:
        """How far readers may read: the writer's own view, or the published HEAD."""
        if self._writer is not None:
            return self._writer.view
        if self._head_fd < 0:
            with contextlib.suppress(FileNotFoundError):
                self._head_fd = os.open(os.path.join(self.path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
        view = read_head_fd(self._head_fd) if self._head_fd >= 0 else None
        return view if view is not None else scan_view(self.path)

    # --- records and Arrow ----------------------------------------------------------------------
    def records(
        self, lo: int, hi: int, follow: bool, timeout: float | None, owner: object
    ) -> Iterator[Record]:
        """Committed records with ``lo <= offset < hi``, in offset order (see ``Journal.read``).

        ``owner`` is unused but for being held: the iterator keeps the journal it came from
        open for as long as it runs, even when the caller dropped every other reference.
        """
        for buf, batches, path, file_pos in self._chunks(lo, hi, follow, timeout, _ITER_CHUNK, None):
            for batch in batches:
                try:
                    yield from iter_records(buf, batch, lo, hi)
                except RecordProblem as exc:
                    raise CorruptRecordError(path, file_pos + exc.position, exc.offset, exc.reason) from None

    def arrow(self, lo: int, hi: int, max_rows: int, owner: object) -> Iterator[pa.RecordBatch]:
        """Committed records in ``[lo, hi)`` as Arrow batches of ≤ ``max_rows`` (``owner``: as above)."""
        for buf, batches, path, file_pos in self._chunks(lo, hi, False, None, _ARROW_CHUNK, max_rows):
            try:
                rb = decode_arrow(buf, batches, lo, hi)
            except RecordProblem as exc:
                raise CorruptRecordError(path, file_pos + exc.position, exc.offset, exc.reason) from None
            if rb.num_rows <= max_rows:
                if rb.num_rows:
                    yield rb  # the usual case: whole, unsliced arrays (cheaper to ship over IPC)
                continue
            # Only a single append of more than max_rows records gets here.
            for start in range(0, rb.num_rows, max_rows):
                yield rb.slice(start, max_rows)

    def _chunks(
        self, lo: int, hi: int, follow: bool, timeout: float | None, chunk_size: int, max_records: int | None
    ) -> Iterator[tuple[bytes, list[ParsedBatch], str, int]]:
        """Verified batches holding the committed offsets in ``[lo, hi)``, grouped by read buffer."""
        next_off = lo
        reader: SegmentReader | None = None
        bases: list[int] = []  # segment listing, refreshed only when it is found stale
        watcher: Watcher | None = None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while next_off < hi and not self.closed:
                view = self.visible()
                if next_off >= view.head:
                    if not follow:
                        return
                    if self._writer is None and watcher is None:
                        # Arm the watch before looking again, so a commit in between is not missed.
                        watcher = make_watcher(
                            os.path.join(self.path, HEAD_FILE), self._wake_r, use_inotify=self._use_inotify
                        )
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return
                    self._wait(view.head, remaining, watcher)
                    continue
                if reader is None:
                    reader, bases = self._open_segment_at(next_off, bases)
                closed = reader.base < view.segment
                limit = reader.size() if closed else view.position
                chunk = reader.read(limit, chunk_size, max_records)
                if chunk.batches:
                    self._index.note_batches(reader.base, reader.ino, chunk.file_pos, chunk.batches)
                    batches = [b for b in chunk.batches if b.end > next_off and b.first < hi]
                    if batches:
                        for b in batches:
                            if not b.records_ok(chunk.buf):
                                pos, offset, reason = locate_damage(chunk.buf, b)
                                raise CorruptRecordError(reader.path, chunk.file_pos + pos, offset, reason)
                        yield chunk.buf, batches, reader.path, chunk.file_pos
                        if watcher is not None:
                            watcher.progressed()
                        if timeout is not None:
                            deadline = time.monotonic() + timeout
                    if chunk.batches[-1].first >= hi:
                        return  # past the requested range (compaction can leave gaps before it)
                    next_off = max(next_off, chunk.batches[-1].end)
                    continue
                if chunk.problem is None and closed:
                    # End of a closed segment: on to the next one (retention may have removed
                    # some meanwhile; opening by offset copes with that).
                    nxt = [b for b in bases if b > reader.base]
                    if not nxt:
                        bases = list_segments(self.path)  # listed before the segment rolled
                        nxt = [b for b in bases if b > reader.base]
                    reader.close()
                    reader = None
                    if nxt:
                        next_off = max(next_off, nxt[0])
                    continue
                if chunk.problem is None:
                    raise JournalError(
                        f"journal {self.path}: no data for offsets {next_off}..{view.head} "
                        f"in {reader.path} up to byte {limit}"
                    )
                if closed or isinstance(chunk.problem, Invalid):
                    reason = chunk.problem.reason if isinstance(chunk.problem, Invalid) else "truncated batch"
                    raise CorruptRecordError(reader.path, chunk.file_pos, None, reason)
                # The active segment is shorter than HEAD claims: HEAD outlived the data (power
                # loss with fsync=False); nothing more is readable until a writer recovers.
                if not follow:
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                if watcher is None and self._writer is None:
                    watcher = make_watcher(
                        os.path.join(self.path, HEAD_FILE), self._wake_r, use_inotify=self._use_inotify
                    )
                self._wait(view.head, remaining, watcher)
        finally:
            if reader is not None:
                reader.close()
            if watcher is not None:
                watcher.close()

    def _wait(self, seen_head: int, timeout: float | None, watcher: Watcher | None) -> None:
        if watcher is not None:
            watcher.wait(timeout)
            return
        assert self._writer is not None  # a read-only follower always waits on a watcher
        self._writer.wait_past(seen_head, timeout)

    def _open_segment_at(self, offset: int, bases: list[int]) -> tuple[SegmentReader, list[int]]:
        """A reader on the segment holding ``offset`` (or the oldest one), positioned near it."""
        for attempt in range(10):
            if attempt or not bases or bases[-1] < offset:
                bases = list_segments(self.path)
            if not bases:
                raise JournalError(f"journal {self.path} has no segments")
            i = bisect.bisect_right(bases, offset) - 1
            base = bases[max(i, 0)]
            path = os.path.join(self.path, segment_name(base))
            try:
                reader = SegmentReader(path, base)
            except FileNotFoundError:
                continue  # removed by retention between listing and opening
            pos = self._index.lookup(base, reader.ino, offset)
            if pos is not None:
                reader.pos = pos
            return reader, bases
        raise JournalError(f"journal {self.path}: segments keep disappearing while opening offset {offset}")

    # --- registers ------------------------------------------------------------------------------
    def registers(self) -> dict[str, str]:
        """The journal's registers as of the last committed append."""
        if self._writer is not None:
            return dict(self._writer.registers)
        with self._reg_lock:
            return dict(self._derive_registers())

    def _derive_registers(self) -> dict[str, str]:
        view = self.visible()
        path = os.path.join(self.path, segment_name(view.segment))
        try:
            reader = SegmentReader(path, view.segment)
        except FileNotFoundError:
            raise JournalError(
                f"journal {self.path}: segment {segment_name(view.segment)} is missing"
            ) from None
        try:
            cached = self._reg_cache
            if (
                cached is not None
                and cached[0] == view.segment
                and cached[1] == reader.ino
                and cached[2] <= view.position
            ):
                reader.pos = cached[2]
                registers = dict(cached[3])
            else:
                registers = dict(reader.header.registers)
            while True:
                chunk = reader.read(view.position, _ARROW_CHUNK)
                if not chunk.batches:
                    break
                for b in chunk.batches:
                    registers.update(b.registers)
            self._reg_cache = (view.segment, reader.ino, reader.pos, registers)
            return registers
        finally:
            reader.close()

    # --- closing -------------------------------------------------------------------------------
    def stop(self) -> None:
        """End every read: loops see ``closed``; followers blocked in poll/select see the pipe."""
        self.closed = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def release(self) -> None:
        self.closed = True
        if self._head_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._head_fd)
            self._head_fd = -1
        # The wake pipe stays open: followers still blocked on it must see it readable.

    def __del__(self) -> None:
        for fd in (getattr(self, "_wake_r", -1), getattr(self, "_wake_w", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
