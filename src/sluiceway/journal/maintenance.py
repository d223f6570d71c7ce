"""Maintenance of closed segments: retention (expire whole segments) and compaction.

Why it is shaped so:

* **The decisions are pure** (:mod:`sluiceway.journal.retention`,
  :mod:`sluiceway.journal.compaction`) and unit-tested; this module only gathers their inputs
  from the directory and carries out what they decide: unlink a segment, or replace it with
  a rewritten one through the same atomic temporary-file-and-rename as a new segment.
* **It never touches the active segment** and never holds up an append: the writer calls
  :meth:`Maintenance.after_roll` on the commit path, which runs retention only if no other
  maintenance (a long compaction) holds the lock, and otherwise leaves it to the next roll.
  Readers are unaffected by either: each read holds its own descriptor on the segment it
  reads, and readers look segments up by offset, so a vanished or rewritten file is skipped
  or reopened.
* One lock serialises maintenance in this process; other processes never maintain (only the
  writer, which holds the journal's lock, does).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator

from sluiceway.journal.compaction import (
    CompactionResult,
    compact_segment_bytes,
    compaction_horizon,
    segment_batches,
    select_removals,
)
from sluiceway.journal.consumers import OffsetLog
from sluiceway.journal.errors import CorruptRecordError
from sluiceway.journal.format import HeadState, decode_segment_header, segment_name
from sluiceway.journal.parse import Invalid, ParsedBatch, iter_keys
from sluiceway.journal.retention import SegmentStat, select_expired
from sluiceway.journal.segment import SegmentReader, fsync_dir, list_segments, read_header, write_segment_file
from sluiceway.journal.writer import Writer

logger = logging.getLogger(__name__)

_SCAN_CHUNK = 8 << 20


class Maintenance:
    """Retention and compaction for the journal that ``writer`` writes."""

    def __init__(
        self,
        path: str,
        writer: Writer,
        offset_log: OffsetLog,
        *,
        retention_bytes: int | None,
        retention_age_us: int | None,
    ) -> None:
        self.path = path
        self._writer = writer
        self._offset_log = offset_log
        self._retention_bytes = retention_bytes
        self._retention_age_us = retention_age_us
        self._lock = threading.Lock()
        self._created_cache: dict[int, int] = {}

    def after_roll(self) -> None:
        """Retention after the writer rolled a segment; never waits behind a long compaction."""
        if self._lock.acquire(blocking=False):
            try:
                self._enforce_retention_locked()
            except OSError:
                logger.exception("journal %s: retention failed", self.path)
            finally:
                self._lock.release()

    def compact(self, horizon: int | None) -> CompactionResult:
        """Apply retention, then compact closed segments below the horizon (see ``Journal.compact``)."""
        with self._lock:
            expired = self._enforce_retention_locked()
            below = compaction_horizon(self._offset_log.offsets(), horizon)
            active = self._writer.seg_base
            view = self._writer.view
            bases = list_segments(self.path)
            candidates = [b for b in bases if b < active and b < below]
            result = CompactionResult(below, 0, 0, 0, 0, expired)
            if not candidates:
                return result
            latest: dict[tuple[bytes, bytes], int] = {}
            for base in bases:
                for buf, batch in self._segment_batches(base, view):
                    for off, ns, key in iter_keys(buf, batch):
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
                entries = (entry for b in batches for entry in iter_keys(buf, b))
                drop = select_removals(entries, latest, below)
                if not drop:
                    continue
                body, n = compact_segment_bytes(buf, batches, drop)
                write_segment_file(
                    self.path, base, header.created_us, header.registers, fsync=self._writer.fsync, body=body
                )
                rewritten += 1
                removed += n
                before += len(buf)
                after += header.data_start + len(body)
            logger.info(
                "journal %s: compacted %d segments, removed %d records", self.path, rewritten, removed
            )
            return CompactionResult(below, rewritten, removed, before, after, expired)

    def _segment_batches(self, base: int, view: HeadState) -> Iterator[tuple[bytes, ParsedBatch]]:
        try:
            reader = SegmentReader(os.path.join(self.path, segment_name(base)), base)
        except FileNotFoundError:
            return
        try:
            limit = view.position if base == view.segment else reader.size()
            while True:
                chunk = reader.read(limit, _SCAN_CHUNK)
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

    def release_below(self, offset: int) -> int:
        """Remove the closed segments whose every record is below ``offset``, oldest first."""
        with self._lock:
            bases = list_segments(self.path)
            active = self._writer.seg_base
            removed = 0
            for base, following in itertools.pairwise(bases):
                if base >= active or following > offset:
                    break
                os.unlink(os.path.join(self.path, segment_name(base)))
                self._created_cache.pop(base, None)
                removed += 1
            if removed:
                fsync_dir(self.path)
                logger.info("journal %s: released %d segments below offset %d", self.path, removed, offset)
            return removed

    def enforce_retention(self) -> int:
        with self._lock:
            return self._enforce_retention_locked()

    def _enforce_retention_locked(self) -> int:
        if self._retention_bytes is None and self._retention_age_us is None:
            return 0
        bases = list_segments(self.path)
        active = self._writer.seg_base
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
            now_us=self._writer.clock(),
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
