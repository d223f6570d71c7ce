"""A sparse in-memory index of segment positions, so a read from an offset need not scan a segment.

One ``(first offset of a batch, its file position)`` entry per MiB of segment, learnt for free
as the writer writes and as readers read, never persisted: a journal opened afresh scans once
and is fast from then on. Entries are keyed by segment base *and inode*, because compaction
replaces a segment file under the same name and positions in the old file mean nothing in the
new one. Shared by the writer (which adds entries after its durable write) and the readers,
hence its own lock; the lock is not taken on the writer's common path (see :meth:`last`).
"""

from __future__ import annotations

import bisect
import threading

from sluiceway.journal.parse import ParsedBatch

INDEX_EVERY = 1 << 20  # one (offset, position) entry per MiB of segment
_PAST_ANY_POSITION = (1 << 63) - 1


class SparseIndex:
    def __init__(self) -> None:
        # (segment base, inode) -> [(first offset of a batch, its file position)], both ascending
        self._entries: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def note_batches(self, base: int, ino: int, file_pos: int, batches: list[ParsedBatch]) -> None:
        """Learn from batches just read at ``file_pos`` of segment ``(base, ino)``."""
        last = self.last(base, ino)
        for b in batches:
            pos = file_pos + b.pos
            if pos - last >= INDEX_EVERY:
                self.add(base, ino, b.first, pos)
                last = pos

    def last(self, base: int, ino: int) -> int:
        """Position of the segment's last entry (0 if none). Lock-free: a stale answer only
        means an entry is added a little later, and ``add`` keeps the list ordered."""
        entries = self._entries.get((base, ino))
        return entries[-1][1] if entries else 0

    def add(self, base: int, ino: int, first: int, pos: int) -> None:
        with self._lock:
            entries = self._entries.setdefault((base, ino), [])
            if not entries or (first > entries[-1][0] and pos > entries[-1][1]):
                entries.append((first, pos))

    def lookup(self, base: int, ino: int, offset: int) -> int | None:
        """A position in segment ``(base, ino)`` at or before the batch holding ``offset``."""
        with self._lock:
            entries = self._entries.get((base, ino))
            if not entries:
                return None
            i = bisect.bisect_right(entries, (offset, _PAST_ANY_POSITION)) - 1
            return entries[i][1] if i >= 0 else None
