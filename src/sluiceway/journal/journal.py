"""The journal: a durable local append-only log with transactional appends.

Concurrency model, in one place:

* **One writer process** holds an exclusive ``flock`` on ``LOCK`` for as long as the journal is
  open for writing. ``flock`` (not ``fcntl``/``lockf`` record locks) because its lock belongs to
  the open file, so an unrelated ``close()`` of the same file elsewhere in the process cannot
  silently drop it, and a second writer in the same process is refused like one in another.
* **Appends buffer** their records in memory (encoded, checksummed) and touch no file until
  they commit, so aborting is free and a crashed append leaves at most a torn tail.
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
  past that view, so they only ever see durable, committed data; ``HEAD`` changing is also
  what wakes followers in other processes (inotify).
* **Failure.** If a write fails for lack of space the file is truncated back and the journal
  stays usable; any other failure of the durable write (e.g. ``EIO``) leaves what reached the
  disk unknown — after a failed sync the kernel may even have dropped the dirty pages — so the
  journal refuses further appends until it is reopened and recovers from what is on disk.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import NoneType, TracebackType
from typing import Final, Self

import pyarrow as pa
from google_crc32c import value as _crc32c

from sluiceway.journal.arrow import decode_arrow
from sluiceway.journal.compaction import (
    CompactionResult,
    compact_segment_bytes,
    compaction_horizon,
    segment_batches,
    select_removals,
)
from sluiceway.journal.consumers import OffsetLog, create_offset_log
from sluiceway.journal.encode import (
    encode_batch,
    encode_many,
    encode_single,
    pack_i64,
    pack_record_body,
    pack_record_prefix,
    stamp_offsets,
)
from sluiceway.journal.errors import (
    AppendAborted,
    CorruptRecordError,
    ExpectationFailed,
    InvalidJournalRecord,
    JournalClosedError,
    JournalError,
    JournalLockedError,
    JournalNotFoundError,
    JournalReadOnlyError,
)
from sluiceway.journal.format import (
    FLAG_NULL_VALUE,
    HEAD_SIZE,
    KIND_RECORD,
    MAX_FIELD_BYTES,
    MAX_NAMESPACE_BYTES,
    REC_CRC_START,
    REC_HEADER_SIZE,
    ZEROS,
    HeadState,
    decode_head,
    decode_segment_header,
    encode_head,
    encode_pairs,
    segment_name,
)
from sluiceway.journal.notify import Watcher, make_watcher
from sluiceway.journal.parse import (
    Invalid,
    ParsedBatch,
    RecordProblem,
    iter_keys,
    iter_records,
    locate_damage,
)
from sluiceway.journal.record import EPOCH, Record
from sluiceway.journal.recovery import DamagedSegment, plan_recovery, scan_committed
from sluiceway.journal.retention import SegmentStat, select_expired
from sluiceway.journal.segment import (
    SegmentReader,
    fsync_dir,
    list_segments,
    pwrite_all,
    read_header,
    remove_temporaries,
    write_segment_file,
)

logger = logging.getLogger(__name__)

LOCK_FILE: Final = "LOCK"
HEAD_FILE: Final = "HEAD"
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
_END: Final = (1 << 63) - 1
_INDEX_EVERY = 1 << 20  # sparse in-memory index: one (offset, position) entry per MiB of segment
_ITER_CHUNK = 1 << 20
_ARROW_CHUNK = 8 << 20
_US = timedelta(microseconds=1)

Clock = Callable[[], int]
"""Returns the current time in microseconds since the Unix epoch."""


_time_ns = time.time_ns


def system_clock() -> int:
    return _time_ns() // 1000


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


def to_timestamp_us(timestamp: datetime | int | None, clock: Clock) -> int:
    if timestamp is None:
        return clock()
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise InvalidJournalRecord("timestamp", "naive datetime (give it a timezone)")
        return (timestamp - EPOCH) // _US
    if isinstance(timestamp, int) and not isinstance(timestamp, bool):
        if not -(1 << 63) <= timestamp < 1 << 63:
            raise InvalidJournalRecord("timestamp", "out of the 64-bit microsecond range")
        return timestamp
    raise InvalidJournalRecord(
        "timestamp", f"expected datetime, int (µs since epoch) or None, got {type(timestamp).__name__}"
    )


def _check_str_map(
    name: str, mapping: Mapping[str, object] | None, *, allow_none: bool
) -> dict[str, str | None]:
    if mapping is None:
        return {}
    out: dict[str, str | None] = {}
    for k, v in mapping.items():
        if not isinstance(k, str) or not (isinstance(v, str) or (allow_none and v is None)):
            raise InvalidJournalRecord(name, f"register names and values must be str, got {k!r}: {v!r}")
        out[k] = v
    return out


def _encode_headers(headers: list[tuple[str, str]]) -> bytes:
    try:
        for hk, hv in headers:
            if type(hk) is not str or type(hv) is not str:
                raise TypeError
        return encode_pairs(headers)
    except UnicodeEncodeError as exc:  # before ValueError: it is one
        raise InvalidJournalRecord("headers", f"not encodable as UTF-8: {exc.reason}") from None
    except (TypeError, ValueError):
        raise InvalidJournalRecord("headers", "must be a list of (str, str) pairs") from None


def _encode_namespace(namespace: str) -> bytes:
    if type(namespace) is not str:
        raise InvalidJournalRecord("namespace", f"must be str, got {type(namespace).__name__}")
    nsb = namespace.encode()
    if len(nsb) > MAX_NAMESPACE_BYTES:
        raise InvalidJournalRecord("namespace", f"longer than {MAX_NAMESPACE_BYTES} bytes")
    return nsb


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidJournalRecord("value", f"must be bytes or None, got {type(value).__name__}")


_MAX_FRAME = MAX_FIELD_BYTES - 8
# Shared by appends without expectations or register updates; never mutated.
_NO_EXPECTATIONS: dict[str, str | None] = {}
_NO_UPDATES: dict[str, str] = {}
_BULK_MIN = 32  # write_many switches to the vectorised encoder from this many records
_IOV_LIMIT = 1000  # below IOV_MAX (1024) so a group is written, and synced, by one pwritev
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Transaction states; OPEN is 0 so the per-record check is a plain truth test.
_OPEN, _COMMITTING, _COMMITTED, _ABORTED, _FAILED = range(5)


class AppendTransaction:
    """One all-or-nothing append. Get one from :meth:`Journal.append`; use it as a context manager.

    Records are encoded and checksummed as they are written and kept in memory; nothing touches
    the disk until the append commits (on leaving the ``with`` block). An exception in the block,
    or :meth:`abort`, discards everything.
    """

    __slots__ = (
        "_clock",
        "_expect_offset",
        "_expect_registers",
        "_journal",
        "_lens",
        "_offsets",
        "_parts",
        "_set_registers",
        "_state",
        "_system_clock",
    )

    def __init__(
        self,
        journal: Journal,
        expect_offset: int | None,
        expect_registers: dict[str, str | None],
        set_registers: dict[str, str],
    ) -> None:
        self._journal = journal
        self._clock = journal._clock
        self._system_clock = journal._clock is system_clock
        self._expect_offset = expect_offset
        self._expect_registers = expect_registers
        self._set_registers = set_registers
        # Encoded frames as (prefix, body) pairs from write(), or one bytearray of many frames
        # from write_many(); joined once at commit. One length per record.
        self._parts: list[bytes | bytearray] = []
        self._lens = array("I")
        self._state = _OPEN
        self._offsets: range | None = None

    def write(
        self,
        key: str,
        value: bytes | bytearray | memoryview | None,
        headers: list[tuple[str, str]] | None = None,
        namespace: str = "",
        timestamp: datetime | int | None = None,
    ) -> None:
        """Add one record to the append. ``value=None`` writes a tombstone.

        ``timestamp`` is an aware ``datetime`` or microseconds since the epoch; default now.
        """
        if self._state:
            self._not_open()
        # Exact-type fast paths with the odd cases handled off the main line: this runs once
        # per record and is most of an append's CPU time.
        if type(key) is not str:
            raise InvalidJournalRecord("key", f"must be str, got {type(key).__name__}")
        try:
            kb = key.encode()
            nsb = _encode_namespace(namespace) if namespace else b""
        except UnicodeEncodeError as exc:
            raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
        if value is None:
            flags = FLAG_NULL_VALUE
            value = b""
        else:
            flags = 0
            if type(value) is not bytes:
                value = _as_bytes(value)
        hb = _encode_headers(headers) if headers else b""
        if timestamp is None:
            ts = _time_ns() // 1000 if self._system_clock else self._clock()
        else:
            ts = to_timestamp_us(timestamp, self._clock)
        # encode.append_record, inlined: a function call is a tenth of the per-record budget.
        # tests/unit/journal/test_format.py checks that both produce identical frames.
        nl, kl, vl, hl = len(nsb), len(kb), len(value), len(hb)
        used = REC_HEADER_SIZE + nl + kl + vl + hl
        if used > _MAX_FRAME:
            raise InvalidJournalRecord("value", "record larger than 4 GiB")
        body = b"".join(
            (pack_record_body(ts, KIND_RECORD, flags, nl, kl, vl, hl), nsb, kb, value, hb, ZEROS[: -used & 7])
        )
        length = len(body) + REC_CRC_START
        parts = self._parts
        parts.append(pack_record_prefix(length, _crc32c(body), 0))
        parts.append(body)
        self._lens.append(length)

    def write_many(
        self,
        records: Iterable[tuple[str, bytes | bytearray | memoryview | None]],
        namespace: str = "",
        timestamp: datetime | int | None = None,
    ) -> int:
        """Add many ``(key, value)`` records sharing a namespace and timestamp; returns how many.

        The bulk form of :meth:`write` for producers that batch: one call, one timestamp (default
        now), no headers, and about half the per-record cost. The same validation applies; if a
        record is invalid, none of this call's records are added.
        """
        if self._state:
            self._not_open()
        try:
            nsb = _encode_namespace(namespace) if namespace else b""
        except UnicodeEncodeError as exc:
            raise InvalidJournalRecord("namespace", f"not encodable as UTF-8: {exc.reason}") from None
        if timestamp is None:
            ts = _time_ns() // 1000 if self._system_clock else self._clock()
        else:
            ts = to_timestamp_us(timestamp, self._clock)
        if not isinstance(records, list | tuple):
            records = list(records)
        # Well-formed bulk input (pairs of str and bytes/None) takes the vectorised encoder; any
        # other input takes the loop below, which converts or rejects record by record.
        if len(records) >= _BULK_MIN:
            try:
                keys, values = zip(*records, strict=True)
            except (ValueError, TypeError):  # not all pairs: the loop below says which is wrong
                keys = values = ()
            value_types = set(map(type, values))
            if keys and set(map(type, keys)) <= {str} and value_types <= {bytes, NoneType}:
                try:
                    frames, flens = encode_many(nsb, keys, values, ts, has_null=NoneType in value_types)
                except UnicodeEncodeError as exc:
                    raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
                if int(flens.max()) > _MAX_FRAME:
                    raise InvalidJournalRecord("value", "record larger than 4 GiB")
                # One part holding many frames: _flush joins parts, it does not care how they split.
                self._parts.append(frames)
                self._lens.frombytes(flens.astype("I").tobytes())  # native uint, as array("I")
                return len(flens)
        nl = len(nsb)
        fixed = REC_HEADER_SIZE + nl
        parts: list[bytes] = []
        lens = array("I")
        append_part, append_len = parts.append, lens.append
        pack_body, pack_prefix, crc, zeros = pack_record_body, pack_record_prefix, _crc32c, ZEROS
        for key, value in records:
            if type(key) is not str:
                raise InvalidJournalRecord("key", f"must be str, got {type(key).__name__}")
            try:
                kb = key.encode()
            except UnicodeEncodeError as exc:
                raise InvalidJournalRecord("key", f"not encodable as UTF-8: {exc.reason}") from None
            if value is None:
                flags = FLAG_NULL_VALUE
                value = b""
            else:
                flags = 0
                if type(value) is not bytes:
                    value = _as_bytes(value)
            kl, vl = len(kb), len(value)
            used = fixed + kl + vl
            if used > _MAX_FRAME:
                raise InvalidJournalRecord("value", "record larger than 4 GiB")
            body = b"".join(
                (pack_body(ts, KIND_RECORD, flags, nl, kl, vl, 0), nsb, kb, value, zeros[: -used & 7])
            )
            length = len(body) + REC_CRC_START
            append_part(pack_prefix(length, crc(body), 0))
            append_part(body)
            append_len(length)
        self._parts.extend(parts)
        self._lens.extend(lens)
        return len(lens)

    def _not_open(self) -> None:
        if self._state == _ABORTED:
            raise AppendAborted("the append was aborted")
        raise JournalError("the append has already been committed or failed")

    @property
    def count(self) -> int:
        """Records written so far."""
        return len(self._lens)

    def abort(self) -> None:
        """Discard the append. Leaving the ``with`` block afterwards commits nothing."""
        if self._state == _OPEN:
            self._state = _ABORTED
            self._parts = []
            self._lens = array("I")

    def commit(self) -> range:
        """Commit now (the ``with`` block does this on exit) and return the assigned offsets."""
        if self._state:
            self._not_open()
        self._state = _COMMITTING
        try:
            self._offsets = self._journal._commit(self)
        except BaseException:
            # Keep the frames: if we were interrupted while queued, a leader may still use them.
            self._state = _FAILED
            raise
        self._state = _COMMITTED
        self._parts = []  # the group is done with them; free the memory early
        return self._offsets

    @property
    def offsets(self) -> range:
        """The offsets the committed append was given (an empty range if it wrote no records)."""
        if self._state == _COMMITTED and self._offsets is not None:
            return self._offsets
        if self._state == _ABORTED:
            raise AppendAborted("the append was aborted")
        raise JournalError("the append has not committed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == _OPEN:
            self.commit()


class _Pending:
    """A committing append waiting in the queue.

    ``wake`` is a lock held from creation and released exactly once: when the append's group is
    done, or when it is promoted to lead the next group. One lock per waiter (rather than one
    condition for all) means a finished group wakes exactly its own appends plus one successor,
    instead of every queued thread fighting for the GIL only to go back to sleep.
    """

    __slots__ = ("done", "error", "result", "tx", "wake")

    def __init__(self, tx: AppendTransaction) -> None:
        self.tx = tx
        self.done = False
        self.error: BaseException | None = None
        self.result: range | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


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
        clock: Clock,
        use_inotify: bool,
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._retention_bytes = retention_bytes
        self._retention_age_us = retention_age_us
        self._clock = clock
        self._use_inotify = use_inotify
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._head_cond = threading.Condition(threading.Lock())  # followers in this process wait here
        self._followers = 0  # how many wait on _head_cond (publishing skips notify when none)
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._index_lock = threading.Lock()
        self._offset_log = OffsetLog(path, fsync=fsync)
        self._created_cache: dict[int, int] = {}
        self._head_fd = -1
        # Reader state: registers are derived incrementally from the active segment.
        self._reg_cache: tuple[int, int, int, dict[str, str]] | None = None
        self._reg_lock = threading.Lock()
        # Writer state.
        self._lock_fd = -1
        self._mutex = threading.Lock()  # guards the commit queue and the flushing flag
        self._idle = threading.Condition(self._mutex)  # signalled when no group is in flight
        self._queue: list[_Pending] = []
        self._flushing = False
        self._failed: BaseException | None = None
        self._seg_fd = -1
        self._seg_base = 0
        self._seg_ino = 0
        self._seg_pos = 0
        self._head = 0
        self._registers: dict[str, str] = {}
        self._view = HeadState(0, 0, 0, fsync)
        self._maint_lock = threading.Lock()

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
        clock: Clock | None = None,
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
            if read_only:
                journal._open_reader()
            else:
                journal._open_writer()
        except BaseException:
            journal._release()
            raise
        return journal

    def _open_reader(self) -> None:
        if not os.path.isdir(self.path) or not (
            os.path.exists(os.path.join(self.path, HEAD_FILE)) or list_segments(self.path)
        ):
            raise JournalNotFoundError(self.path)
        with contextlib.suppress(FileNotFoundError):
            self._head_fd = os.open(os.path.join(self.path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)

    def _open_writer(self) -> None:
        os.makedirs(self.path, exist_ok=True)
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

        remove_temporaries(self.path)
        create_offset_log(self.path)
        published = self._read_head_file()
        bases = list_segments(self.path)
        if not bases:
            if published is not None and published.head > 0:
                # Starting again at offset 0 would hand out offsets that readers already saw.
                raise JournalError(
                    f"journal {self.path}: HEAD says offset {published.head} but no segments exist"
                )
            write_segment_file(self.path, 0, self._clock(), {}, fsync=self._fsync)
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
            if self._fsync:
                # A writer killed during its durable write can leave committed batches only
                # in the page cache; make them durable before anyone is told about them.
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._seg_fd = fd
        self._seg_base = last
        self._seg_ino = os.fstat(fd).st_ino
        self._seg_pos = plan.valid_end
        self._head = plan.head
        self._registers = plan.registers
        self._view = HeadState(plan.head, last, plan.valid_end, self._fsync)
        self._head_fd = os.open(
            os.path.join(self.path, HEAD_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        self._write_head(self._view, sync=True)
        if published is None:
            fsync_dir(self.path)
        self._enforce_retention()

    def _segment_flags(self) -> int:
        # O_DSYNC: each write returns once durable (see the module docstring for why).
        return os.O_RDWR | os.O_CLOEXEC | (os.O_DSYNC if self._fsync else 0)

    # --- HEAD -------------------------------------------------------------------------------
    def _read_head_file(self) -> HeadState | None:
        try:
            fd = os.open(os.path.join(self.path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            return _read_head_fd(fd)
        finally:
            os.close(fd)

    def _write_head(self, view: HeadState, *, sync: bool = False) -> None:
        os.pwrite(self._head_fd, encode_head(view), 0)
        if sync and self._fsync:
            os.fsync(self._head_fd)

    def _visible(self) -> HeadState:
        """How far readers may read: the writer's own view, or the published HEAD."""
        if not self.read_only:
            return self._view
        if self._head_fd < 0:
            with contextlib.suppress(FileNotFoundError):
                self._head_fd = os.open(os.path.join(self.path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
        view = _read_head_fd(self._head_fd) if self._head_fd >= 0 else None
        return view if view is not None else _scan_view(self.path)

    @staticmethod
    def head_offset(path: str | os.PathLike[str]) -> int:
        """The next offset the journal at ``path`` will assign, without opening it or taking a lock."""
        p = os.fspath(path)
        try:
            fd = os.open(os.path.join(p, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not os.path.isdir(p):
                raise JournalNotFoundError(p) from None
            return _scan_view(p).head
        try:
            view = _read_head_fd(fd)
        finally:
            os.close(fd)
        return view.head if view is not None else _scan_view(p).head

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
        if self.read_only or self._closed:
            self._check_writer()
        if expect_offset is None and not expect_registers and not set_registers:
            return AppendTransaction(self, None, _NO_EXPECTATIONS, _NO_UPDATES)
        if expect_offset is not None and (not isinstance(expect_offset, int) or expect_offset < 0):
            raise ValueError("expect_offset must be a non-negative int")
        expect = (
            _check_str_map("expect_registers", expect_registers, allow_none=True) if expect_registers else {}
        )
        sets: dict[str, str] = {}
        if set_registers:
            sets = {
                k: v
                for k, v in _check_str_map("set_registers", set_registers, allow_none=False).items()
                if v is not None
            }
        return AppendTransaction(self, expect_offset, expect, sets)

    def _check_writer(self) -> None:
        if self.read_only:
            raise JournalReadOnlyError(f"journal {self.path} is open read-only")
        if self._closed:
            raise JournalClosedError(f"journal {self.path} is closed")

    def _commit(self, tx: AppendTransaction) -> range:
        pending = _Pending(tx)
        with self._mutex:
            self._check_writer()
            if self._failed is not None:
                raise JournalError(f"journal {self.path} failed and must be reopened: {self._failed}")
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
            if self._failed is None:
                self._failed = exc
            err = exc if isinstance(exc, JournalError) else JournalError(f"append failed: {exc!r}")
            for p in group:
                if p.error is None:
                    p.error, p.result = err, None
        finally:
            successor = None
            with self._mutex:
                for p in group:
                    p.done = True
                if self._queue and (self._closed or self._failed is not None):
                    reason: JournalError = (
                        JournalClosedError(f"journal {self.path} closed before the append committed")
                        if self._closed
                        else JournalError(f"journal {self.path} failed and must be reopened: {self._failed}")
                    )
                    for p in self._queue:
                        p.error, p.done = reason, True
                    group.extend(self._queue)
                    self._queue = []
                if self._queue:
                    successor = self._queue[0]  # stays "flushing": leadership passes on
                else:
                    self._flushing = False
                    if self._closed:
                        self._idle.notify_all()  # close() is waiting for the last group
            for p in group:
                if p is not me:
                    p.wake.release()
            if successor is not None:
                successor.wake.release()

    def _flush(self, group: list[_Pending]) -> None:
        """Leader only: encode, write and sync one group of appends, then publish them."""
        now = self._clock()
        first = head = self._head
        registers = self._registers
        parts: list[bytes | bytearray] = []
        assigned: list[_Pending] = []
        for p in group:
            tx = p.tx
            if tx._expect_offset is not None or tx._expect_registers:
                failed = check_expectations(head, registers, tx._expect_offset, tx._expect_registers)
                if failed is not None:
                    p.error = failed
                    continue
            n = len(tx._lens)
            if n == 0 and not tx._set_registers:
                p.result = range(head, head)
                continue
            if n == 1 and len(tx._parts) == 2 and not tx._set_registers:
                # The common single-record append, encoded in one step.
                prefix, body = tx._parts
                parts.append(encode_single(prefix, body, head, now))
                p.result = range(head, head + 1)
                head += 1
                assigned.append(p)
                continue
            if n == 1 and len(tx._parts) == 2:
                prefix, body = tx._parts
                frames = b"".join((prefix[:8], pack_i64(head), body))
            else:
                only = tx._parts[0] if len(tx._parts) == 1 else None
                # write_many's frames arrive as one bytearray: stamp them in place, no extra copy.
                stamped = only if type(only) is bytearray else bytearray().join(tx._parts)
                stamp_offsets(stamped, tx._lens, head)
                frames = bytes(stamped)
            parts.extend(encode_batch(frames, tx._lens, head, now, tx._set_registers))
            p.result = range(head, head + n)
            head += n
            if tx._set_registers:
                registers = {**registers, **tx._set_registers}
            assigned.append(p)
        if not parts:
            return
        size = sum(len(b) for b in parts)
        try:
            if self._seg_pos + size > self._segment_bytes and self._head > self._seg_base:
                self._roll()
        except OSError as exc:
            self._fail_group(assigned, exc)
            return
        start = self._seg_pos
        if len(parts) > _IOV_LIMIT:
            parts = [b"".join(parts)]  # one O_DSYNC write is one sync: keep the group in one call
        try:
            end = pwrite_all(self._seg_fd, parts, start)  # durable on return (O_DSYNC)
        except OSError as exc:
            self._fail_group(assigned, exc)
            if exc.errno in _NO_SPACE:
                # Refused before anything was acknowledged: cut the file back and carry on.
                try:
                    os.ftruncate(self._seg_fd, start)
                    return
                except OSError as exc2:
                    exc = exc2
            self._failed = exc
            return
        self._publish(head, registers, end)
        if start - self._index_last(self._seg_base, self._seg_ino) >= _INDEX_EVERY:
            self._index_add(self._seg_base, self._seg_ino, first, start)

    def _fail_group(self, assigned: list[_Pending], exc: OSError) -> None:
        for p in assigned:
            p.result = None
            p.error = JournalError(f"append to {self.path} failed: {exc}")

    def _publish(self, head: int, registers: dict[str, str], pos: int) -> None:
        view = HeadState(head, self._seg_base, pos, self._fsync)
        with self._head_cond:
            self._head = head
            self._registers = registers
            self._seg_pos = pos
            self._view = view
            if self._followers:
                self._head_cond.notify_all()
        try:
            self._write_head(view)
        except OSError as exc:
            self._failed = exc
            raise JournalError(f"journal {self.path}: could not publish HEAD: {exc}") from exc

    def _roll(self) -> None:
        """Leader only: start a new segment at the current head."""
        base = self._head
        path = write_segment_file(self.path, base, self._clock(), self._registers, fsync=self._fsync)
        fd = os.open(path, self._segment_flags())
        old = self._seg_fd
        st = os.fstat(fd)
        self._seg_fd, self._seg_base, self._seg_ino = fd, base, st.st_ino
        self._publish(self._head, self._registers, st.st_size)
        os.close(old)
        logger.debug("journal %s: rolled to segment %s", self.path, segment_name(base))
        # Retention runs here, but never waits behind a long compaction on the commit path.
        if self._maint_lock.acquire(blocking=False):
            try:
                self._enforce_retention_locked()
            except OSError:
                logger.exception("journal %s: retention failed", self.path)
            finally:
                self._maint_lock.release()

    # --- reading ----------------------------------------------------------------------------
    @property
    def head(self) -> int:
        """The next offset to be assigned (committed records are ``[start, head)``)."""
        self._check_open()
        return self._visible().head

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
        hi = _END if to_offset is None else to_offset
        return self._read(max(0, from_offset), hi, follow, timeout)

    def _read(self, lo: int, hi: int, follow: bool, timeout: float | None) -> Iterator[Record]:
        for buf, batches, path, file_pos in self._chunks(lo, hi, follow, timeout, _ITER_CHUNK, None):
            for batch in batches:
                try:
                    yield from iter_records(buf, batch, lo, hi)
                except RecordProblem as exc:
                    raise CorruptRecordError(path, file_pos + exc.position, exc.offset, exc.reason) from None

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
        hi = _END if to_offset is None else to_offset
        return self._read_arrow(max(0, from_offset), hi, max_rows)

    def _read_arrow(self, lo: int, hi: int, max_rows: int) -> Iterator[pa.RecordBatch]:
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
            while next_off < hi and not self._closed:
                view = self._visible()
                if next_off >= view.head:
                    if not follow:
                        return
                    if self.read_only and watcher is None:
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
                    reader, bases = self._open_reader_at(next_off, bases)
                closed = reader.base < view.segment
                limit = reader.size() if closed else view.position
                chunk = reader.read(limit, chunk_size, max_records)
                if chunk.batches:
                    self._index_note(reader, chunk.file_pos, chunk.batches)
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
                if watcher is None and self.read_only:
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
        with self._head_cond:
            if self._view.head <= seen_head and not self._closed:
                self._followers += 1
                try:
                    self._head_cond.wait(timeout)
                finally:
                    self._followers -= 1

    def _open_reader_at(self, offset: int, bases: list[int]) -> tuple[SegmentReader, list[int]]:
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
            except ValueError as exc:
                raise CorruptRecordError(path, 0, None, str(exc)) from None
            pos = self._index_lookup(base, reader.ino, offset)
            if pos is not None:
                reader.pos = pos
            return reader, bases
        raise JournalError(f"journal {self.path}: segments keep disappearing while opening offset {offset}")

    # sparse index: (segment base, inode) -> [(first offset of a batch, its file position)]
    def _index_note(self, reader: SegmentReader, file_pos: int, batches: list[ParsedBatch]) -> None:
        key = (reader.base, reader.ino)
        last = self._index_last(*key)
        for b in batches:
            pos = file_pos + b.pos
            if pos - last >= _INDEX_EVERY:
                self._index_add(reader.base, reader.ino, b.first, pos)
                last = pos

    def _index_last(self, base: int, ino: int) -> int:
        entries = self._index.get((base, ino))
        return entries[-1][1] if entries else 0

    def _index_add(self, base: int, ino: int, first: int, pos: int) -> None:
        with self._index_lock:
            entries = self._index.setdefault((base, ino), [])
            if not entries or (first > entries[-1][0] and pos > entries[-1][1]):
                entries.append((first, pos))

    def _index_lookup(self, base: int, ino: int, offset: int) -> int | None:
        with self._index_lock:
            entries = self._index.get((base, ino))
            if not entries:
                return None
            i = bisect.bisect_right(entries, (offset, _END)) - 1
            return entries[i][1] if i >= 0 else None

    # --- registers and consumers --------------------------------------------------------------
    def registers(self) -> dict[str, str]:
        """The journal's registers as of the last committed append."""
        self._check_open()
        if not self.read_only:
            return dict(self._registers)
        with self._reg_lock:
            return dict(self._reader_registers())

    def _reader_registers(self) -> dict[str, str]:
        view = self._visible()
        reader = SegmentReader(os.path.join(self.path, segment_name(view.segment)), view.segment)
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

    def compact(self, *, horizon: int | None = None) -> CompactionResult:
        """Apply retention, then compact closed segments below the consumers' horizon.

        In a closed segment, a record below ``min(committed consumer offsets, horizon)`` is
        removed when a later record has the same ``(namespace, key)``. Kept records keep their
        offsets. With no named consumers, only an explicit ``horizon`` allows removal.
        """
        self._check_writer()
        with self._maint_lock:
            expired = self._enforce_retention_locked()
            h = compaction_horizon(self._offset_log.offsets(), horizon)
            active = self._seg_base
            view = self._view
            bases = list_segments(self.path)
            candidates = [b for b in bases if b < active and b < h]
            result = CompactionResult(h, 0, 0, 0, 0, expired)
            if not candidates:
                return result
            latest: dict[tuple[bytes, bytes], int] = {}
            for base in bases:
                for buf, batch in self._segment_batches(base, view):
                    for off, ns, key, _pos, _len in iter_keys(buf, batch):
                        latest[(ns, key)] = off
            rewritten = removed = before = after = 0
            for base in candidates:
                path = os.path.join(self.path, segment_name(base))
                with open(path, "rb") as f:
                    buf = f.read()
                try:
                    header = decode_segment_header(buf)
                    batches = segment_batches(buf, header)
                except ValueError as exc:
                    raise CorruptRecordError(path, 0, None, f"cannot compact: {exc}") from None
                entries = ((off, ns, key) for b in batches for off, ns, key, _p, _l in iter_keys(buf, b))
                drop = select_removals(entries, latest, h)
                if not drop:
                    continue
                body, n = compact_segment_bytes(buf, batches, drop)
                write_segment_file(
                    self.path, base, header.created_us, header.registers, fsync=self._fsync, body=body
                )
                rewritten += 1
                removed += n
                before += len(buf)
                after += header.data_start + len(body)
            logger.info(
                "journal %s: compacted %d segments, removed %d records", self.path, rewritten, removed
            )
            return CompactionResult(h, rewritten, removed, before, after, expired)

    def _segment_batches(self, base: int, view: HeadState) -> Iterator[tuple[bytes, ParsedBatch]]:
        try:
            reader = SegmentReader(os.path.join(self.path, segment_name(base)), base)
        except FileNotFoundError:
            return
        try:
            limit = view.position if base == view.segment else reader.size()
            while True:
                chunk = reader.read(limit, _ARROW_CHUNK)
                if not chunk.batches:
                    if chunk.problem is not None:
                        reason = (
                            chunk.problem.reason if isinstance(chunk.problem, Invalid) else "truncated batch"
                        )
                        raise CorruptRecordError(reader.path, chunk.file_pos, None, reason)
                    return
                for b in chunk.batches:
                    yield chunk.buf, b
        finally:
            reader.close()

    def _enforce_retention(self) -> int:
        with self._maint_lock:
            return self._enforce_retention_locked()

    def _enforce_retention_locked(self) -> int:
        if self._retention_bytes is None and self._retention_age_us is None:
            return 0
        bases = list_segments(self.path)
        active = self._seg_base
        sizes = {b: os.path.getsize(os.path.join(self.path, segment_name(b))) for b in bases}
        closed = []
        for i, base in enumerate(bases):
            if base >= active:
                break
            closed.append(SegmentStat(base, sizes[base], self._created_us(bases[i + 1])))
        expired = select_expired(
            closed,
            sum(sizes.values()),
            retention_bytes=self._retention_bytes,
            retention_age_us=self._retention_age_us,
            now_us=self._clock(),
        )
        for base in expired:
            os.unlink(os.path.join(self.path, segment_name(base)))
            self._created_cache.pop(base, None)
            logger.info("journal %s: retention removed segment %s", self.path, segment_name(base))
        if expired:
            fsync_dir(self.path)
        return len(expired)

    def _created_us(self, base: int) -> int:
        created = self._created_cache.get(base)
        if created is None:
            fd = os.open(os.path.join(self.path, segment_name(base)), os.O_RDONLY | os.O_CLOEXEC)
            try:
                created = read_header(fd).created_us
            finally:
                os.close(fd)
            self._created_cache[base] = created
        return created

    # --- closing ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError(f"journal {self.path} is closed")

    def close(self) -> None:
        """Finish in-flight commits, fail queued ones, wake followers and release the lock."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True  # new appends are refused; queued ones are failed by the leader
            while self._flushing:
                self._idle.wait()
        with self._head_cond:
            self._head_cond.notify_all()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")  # wakes followers blocked in poll/select
        try:
            if not self.read_only and self._head_fd >= 0 and self._failed is None:
                self._write_head(self._view, sync=True)
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._offset_log.close()
        for name in ("_seg_fd", "_head_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the LOCK descriptor releases the flock
                setattr(self, name, -1)
        # The wake pipe stays open: followers still blocked on it must see it readable.

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
        for fd in (getattr(self, "_wake_r", -1), getattr(self, "_wake_w", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writer"
        state = "closed" if self._closed else f"head={self._visible().head}"
        return f"<Journal {self.path!r} {mode} {state}>"


def _read_head_fd(fd: int) -> HeadState | None:
    # A read can race the writer's in-place rewrite and see a mix; the CRC catches it, so retry.
    for _ in range(10):
        view = decode_head(os.pread(fd, HEAD_SIZE, 0))
        if view is not None:
            return view
    return None


def _scan_view(path: str) -> HeadState:
    """Where committed data ends, found by scanning the last segment (when HEAD is unusable)."""
    bases = list_segments(path)
    if not bases:
        return HeadState(0, 0, 0, False)
    seg = os.path.join(path, segment_name(bases[-1]))
    with open(seg, "rb") as f:
        buf = f.read()
    try:
        header = decode_segment_header(buf)
    except ValueError as exc:
        raise CorruptRecordError(seg, 0, None, str(exc)) from None
    plan = scan_committed(buf, header)
    return HeadState(plan.head, bases[-1], plan.valid_end, False)
