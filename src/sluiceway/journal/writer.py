"""The journal's writer: the file lock, recovery on open, group commit, HEAD and segment rolls.

Everything that changes the journal's files on the append path lives here, and with it the
writer's state (the queue, the active segment, the head and registers); the concurrency model,
in one place:

* **One writer process** holds an exclusive ``flock`` on ``LOCK`` for as long as the journal is
  open for writing. ``flock`` (not ``fcntl``/``lockf`` record locks) because its lock belongs to
  the open file, so an unrelated ``close()`` of the same file elsewhere in the process cannot
  silently drop it, and a second writer in the same process is refused like one in another.
* **Appends buffer** their records in memory and touch no file until they commit
  (:mod:`sluiceway.journal.append`), so aborting is free and a crashed append leaves at most a
  torn tail. The writer sees only their encoded, checksummed records blocks and expectations:
  per append, the leader adds a 56-byte header (offsets, commit time, register updates).
* **Group commit.** A committing append joins a queue. If no flush is in progress it becomes
  the *leader*: it takes the whole queue, checks each append's expectations in queue order
  against the head and registers as they will be after the appends before it, assigns
  offsets, and writes every batch with one vectored write that is also the sync: segments are
  opened ``O_DSYNC``, so ``pwritev`` returns only once the data and the metadata needed to
  read it back are durable — what ``write`` + ``fdatasync`` give, in one system call. That
  matters under threads: every blocking call releases the GIL, and getting it back while
  other appenders run Python costs tens of microseconds, so one call per group instead of two
  is a measurable share of group-commit throughput (and the kernel syncs only the written
  range). Appends that arrive meanwhile queue up for the next leader, so under concurrency
  many appends share one sync; the leader does its I/O without holding the queue lock, so the
  next group fills while the disk works.
* **Publication.** Only after the durable write returns does the writer advance its view and
  rewrite ``HEAD`` (next offset, active segment, durable end position). Readers never read
  past that view, so they only ever see durable, committed data. Followers in this process
  wait on the writer's condition (:meth:`Writer.wait_past`); ``HEAD`` changing is what wakes
  followers in other processes (inotify).
* **Failure.** If a write fails for lack of space the file is truncated back and the journal
  stays usable; any other failure of the durable write (e.g. ``EIO``) leaves what reached the
  disk unknown — after a failed sync the kernel may even have dropped the dirty pages — so the
  journal refuses further appends until it is reopened and recovers from what is on disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Final

from sluiceway.journal.append import Expectations, MicrosClock
from sluiceway.journal.consumers import create_offset_log
from sluiceway.journal.encode import EncodedRecords, encode_batch_header
from sluiceway.journal.errors import (
    CorruptRecordError,
    ExpectationFailed,
    JournalClosedError,
    JournalError,
    JournalLockedError,
)
from sluiceway.journal.format import (
    SEGMENT_VERSION,
    HeadState,
    decode_segment_header,
    encode_head,
    segment_name,
)
from sluiceway.journal.head import HEAD_FILE, read_head_file
from sluiceway.journal.index import INDEX_EVERY, SparseIndex
from sluiceway.journal.recovery import DamagedSegment, plan_recovery
from sluiceway.journal.segment import (
    fsync_dir,
    list_segments,
    pwrite_all,
    remove_temporaries,
    write_segment_file,
)

logger = logging.getLogger(__name__)

LOCK_FILE: Final = "LOCK"
_IOV_LIMIT = 1000  # below IOV_MAX (1024) so a group is written, and synced, by one pwritev
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def check_expectations(
    head: int,
    registers: Mapping[str, str],
    expect_offset: int | None,
    expect_registers: Mapping[str, str | None] | None,
) -> ExpectationFailed | None:
    """The first expectation that does not hold against ``head``/``registers``, or ``None``.

    ``expect_registers`` maps a register to its required value; ``None`` requires it unset.
    """
    if expect_offset is not None and expect_offset != head:
        return ExpectationFailed("offset", expect_offset, head)
    if expect_registers:
        for name, want in expect_registers.items():
            have = registers.get(name)
            if have != want:
                return ExpectationFailed(f"register:{name}", want, have)
    return None


class _Pending:
    """A committing append waiting in the queue: its records, its expectations, its outcome.

    ``wake`` is a lock held from creation and released exactly once: when the append's group is
    done, or when it is promoted to lead the next group. One lock per waiter (rather than one
    condition for all) means a finished group wakes exactly its own appends plus one successor,
    instead of every queued thread fighting for the GIL only to go back to sleep.
    """

    __slots__ = ("done", "error", "expectations", "records", "result", "wake")

    def __init__(self, records: EncodedRecords, expectations: Expectations) -> None:
        self.records = records
        self.expectations = expectations
        self.done = False
        self.error: BaseException | None = None
        self.result: range | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class Writer:
    """The one writer of a journal directory: owns ``LOCK``, the active segment and ``HEAD``.

    Other modules read its published state (``view``, ``registers``, ``seg_base``) and wait on
    it (:meth:`wait_past`); only the group leader changes it, in :meth:`_flush` and :meth:`_roll`.
    """

    def __init__(
        self, path: str, *, fsync: bool, segment_bytes: int, clock: MicrosClock, index: SparseIndex
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.clock = clock
        self._segment_bytes = segment_bytes
        self._index = index
        self.on_roll: Callable[[], None] = lambda: None  # retention hooks in here; must not block
        self.closed = False
        self.failed: BaseException | None = None
        self._lock_fd = -1
        self._head_fd = -1
        self._mutex = threading.Lock()  # guards the commit queue and the flushing flag
        self._idle = threading.Condition(self._mutex)  # signalled when no group is in flight
        self._queue: list[_Pending] = []
        self._flushing = False
        self._published = threading.Condition(threading.Lock())  # followers in this process wait here
        self._followers = 0  # how many wait on _published (publishing skips notify when none)
        self.seg_fd = -1
        self.seg_base = 0
        self._seg_ino = 0
        self._seg_pos = 0
        self._head = 0
        self.registers: dict[str, str] = {}
        self.view = HeadState(0, 0, 0, fsync)

    # --- opening: lock, then recover the active segment --------------------------------------
    def open(self) -> None:
        """Take the writer lock, then recover: truncate a torn tail, publish a durable HEAD."""
        os.makedirs(self.path, exist_ok=True)
        self._take_lock()
        remove_temporaries(self.path)
        create_offset_log(self.path)
        self._recover()

    def _take_lock(self) -> None:
        self._lock_fd = os.open(
            os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 200, 0).decode(errors="replace").strip()
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise JournalLockedError(self.path, holder) from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"pid {os.getpid()}\n".encode(), 0)

    def _recover(self) -> None:
        published = read_head_file(self.path)
        bases = list_segments(self.path)
        if not bases:
            if published is not None and published.head > 0:
                # Starting again at offset 0 would hand out offsets that readers already saw.
                raise JournalError(
                    f"journal {self.path}: HEAD says offset {published.head} but no segments exist"
                )
            write_segment_file(self.path, 0, self.clock(), {}, fsync=self.fsync)
            bases = [0]
        last = bases[-1]
        if published is not None and published.segment > last:
            raise JournalError(f"journal {self.path}: segment {segment_name(published.segment)} is missing")
        seg_path = os.path.join(self.path, segment_name(last))
        fd = os.open(seg_path, self._segment_flags())
        try:
            buf = os.pread(fd, os.fstat(fd).st_size, 0)
            try:
                header = decode_segment_header(buf)
            except ValueError as exc:
                raise CorruptRecordError(seg_path, 0, None, str(exc)) from None
            if header.base != last:
                raise CorruptRecordError(seg_path, 0, None, f"header says base {header.base}")
            durable = (
                published.position
                if published is not None and published.synced and published.segment == last
                else None
            )
            try:
                plan = plan_recovery(buf, header, durable)
            except DamagedSegment as exc:
                raise CorruptRecordError(
                    seg_path, exc.position, None, f"{exc.reason} in acknowledged data"
                ) from None
            for pos, reason in plan.damaged:
                logger.error(
                    "journal %s: damaged committed batch at byte %d of %s: %s",
                    self.path,
                    pos,
                    seg_path,
                    reason,
                )
            if plan.valid_end < len(buf):
                logger.warning(
                    "journal %s: truncating %d bytes of torn tail from %s (uncommitted append)",
                    self.path,
                    len(buf) - plan.valid_end,
                    seg_path,
                )
                os.ftruncate(fd, plan.valid_end)
            if self.fsync:
                # A writer killed during its durable write can leave committed batches only
                # in the page cache; make them durable before anyone is told about them.
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self.seg_fd = fd
        self.seg_base = last
        self._seg_ino = os.fstat(fd).st_ino
        self._seg_pos = plan.valid_end
        self._head = plan.head
        self.registers = plan.registers
        self.view = HeadState(plan.head, last, plan.valid_end, self.fsync)
        self._head_fd = os.open(
            os.path.join(self.path, HEAD_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        self._write_head(self.view, sync=True)
        if published is None:
            fsync_dir(self.path)
        if header.version < SEGMENT_VERSION:
            # Written by an earlier version: append to a new segment, so that every segment's
            # version tells which batch formats it may hold (and an older reader refuses a
            # newer segment by its version rather than calling its batches corrupt). A segment
            # that holds no records yet is replaced in place (same base, registers and age).
            self._roll(header.created_us if self._head == last else None)

    def _segment_flags(self) -> int:
        # O_DSYNC: each write returns once durable (see the module docstring for why).
        return os.O_RDWR | os.O_CLOEXEC | (os.O_DSYNC if self.fsync else 0)

    # --- HEAD -------------------------------------------------------------------------------
    def _write_head(self, view: HeadState, *, sync: bool = False) -> None:
        os.pwrite(self._head_fd, encode_head(view), 0)
        if sync and self.fsync:
            os.fsync(self._head_fd)

    # --- appending: group commit --------------------------------------------------------------
    def commit(self, records: EncodedRecords, expectations: Expectations) -> range:
        """Commit one append's encoded records; its offsets once durable."""
        pending = _Pending(records, expectations)
        with self._mutex:
            if self.closed:
                raise JournalClosedError(f"journal {self.path} is closed")
            if self.failed is not None:
                raise JournalError(f"journal {self.path} failed and must be reopened: {self.failed}")
            self._queue.append(pending)
            lead = not self._flushing
            self._flushing = True
        if not lead:
            pending.wake.acquire()  # until our group is done, or we are promoted to lead the next
        if not pending.done:
            self._lead(pending)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _lead(self, me: _Pending) -> None:
        """Flush everything queued so far as one group, then hand over to one successor."""
        with self._mutex:
            group, self._queue = self._queue, []
        try:
            self._flush(group)
        except BaseException as exc:
            # Unexpected (a bug, an interrupt, a failed HEAD publication): bytes may be on
            # disk that the in-memory state does not account for, so appending on could
            # reuse their offsets. Refuse appends until a reopen recovers from the disk, and
            # fail the whole group (some may be durable: like any failed call, it may have
            # succeeded).
            if self.failed is None:
                self.failed = exc
            err = exc if isinstance(exc, JournalError) else JournalError(f"append failed: {exc!r}")
            for p in group:
                if p.error is None:
                    p.error, p.result = err, None
        finally:
            successor = None
            with self._mutex:
                for p in group:
                    p.done = True
                if self._queue and (self.closed or self.failed is not None):
                    reason: JournalError = (
                        JournalClosedError(f"journal {self.path} closed before the append committed")
                        if self.closed
                        else JournalError(f"journal {self.path} failed and must be reopened: {self.failed}")
                    )
                    for p in self._queue:
                        p.error, p.done = reason, True
                    group.extend(self._queue)
                    self._queue = []
                if self._queue:
                    successor = self._queue[0]  # stays "flushing": leadership passes on
                else:
                    self._flushing = False
                    if self.closed:
                        self._idle.notify_all()  # close() is waiting for the last group
            for p in group:
                if p is not me:
                    p.wake.release()
            if successor is not None:
                successor.wake.release()

    def _flush(self, group: list[_Pending]) -> None:
        """Leader only: encode, write and sync one group of appends, then publish them."""
        now = self.clock()
        first = head = self._head
        registers = self.registers
        parts: list[bytes] = []
        assigned: list[_Pending] = []
        for p in group:
            expect = p.expectations
            sets = expect.set_registers
            if expect.offset is not None or expect.registers:
                failed = check_expectations(head, registers, expect.offset, expect.registers)
                if failed is not None:
                    p.error = failed
                    continue
            records = p.records
            n = records.count
            if n == 0 and not sets:
                p.result = range(head, head)
                continue
            # The records block was encoded and checksummed by the appending thread; all that
            # depends on the group (offsets, time, registers) is this header.
            parts.append(encode_batch_header(head, head + n, now, records, sets))
            parts.extend(records.parts)
            p.result = range(head, head + n)
            head += n
            if sets:
                registers = {**registers, **sets}
            assigned.append(p)
        if not parts:
            return
        size = sum(len(b) for b in parts)
        try:
            if self._seg_pos + size > self._segment_bytes and self._head > self.seg_base:
                self._roll()
        except OSError as exc:
            self._fail_group(assigned, exc)
            return
        start = self._seg_pos
        if len(parts) > _IOV_LIMIT:
            parts = [b"".join(parts)]  # one O_DSYNC write is one sync: keep the group in one call
        try:
            end = pwrite_all(self.seg_fd, parts, start)  # durable on return (O_DSYNC)
        except OSError as exc:
            self._fail_group(assigned, exc)
            if exc.errno in _NO_SPACE:
                # Refused before anything was acknowledged: cut the file back and carry on.
                try:
                    os.ftruncate(self.seg_fd, start)
                    return
                except OSError as exc2:
                    exc = exc2
            self.failed = exc
            return
        self._publish(head, registers, end)
        if start - self._index.last(self.seg_base, self._seg_ino) >= INDEX_EVERY:
            self._index.add(self.seg_base, self._seg_ino, first, start)

    def _fail_group(self, assigned: list[_Pending], exc: OSError) -> None:
        for p in assigned:
            p.result = None
            p.error = JournalError(f"append to {self.path} failed: {exc}")

    def _publish(self, head: int, registers: dict[str, str], pos: int) -> None:
        view = HeadState(head, self.seg_base, pos, self.fsync)
        with self._published:
            self._head = head
            self.registers = registers
            self._seg_pos = pos
            self.view = view
            if self._followers:
                self._published.notify_all()
        try:
            self._write_head(view)
        except OSError as exc:
            self.failed = exc
            raise JournalError(f"journal {self.path}: could not publish HEAD: {exc}") from exc

    def _roll(self, created_us: int | None = None) -> None:
        """Leader only: start a new segment at the current head (default creation time: now)."""
        base = self._head
        created = self.clock() if created_us is None else created_us
        path = write_segment_file(self.path, base, created, self.registers, fsync=self.fsync)
        fd = os.open(path, self._segment_flags())
        old = self.seg_fd
        st = os.fstat(fd)
        self.seg_fd, self.seg_base, self._seg_ino = fd, base, st.st_ino
        self._publish(self._head, self.registers, st.st_size)
        os.close(old)
        logger.debug("journal %s: rolled to segment %s", self.path, segment_name(base))
        self.on_roll()

    # --- followers in this process ------------------------------------------------------------
    def wait_past(self, seen_head: int, timeout: float | None) -> None:
        """Block until the head moves past ``seen_head``, the writer closes, or ``timeout`` passes."""
        with self._published:
            if self.view.head <= seen_head and not self.closed:
                self._followers += 1
                try:
                    self._published.wait(timeout)
                finally:
                    self._followers -= 1

    # --- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        """Refuse new appends and let the group in flight finish (its leader fails the queued ones).

        Then wake the followers in this process, and publish the final HEAD durably unless the
        writer failed.
        """
        with self._mutex:
            if self.closed:
                return
            self.closed = True
            while self._flushing:
                self._idle.wait()
        with self._published:
            self._published.notify_all()
        if self._head_fd >= 0 and self.failed is None:
            self._write_head(self.view, sync=True)

    def release(self) -> None:
        """Close the descriptors; closing ``LOCK``'s releases the ``flock``."""
        self.closed = True
        for name in ("seg_fd", "_head_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)
