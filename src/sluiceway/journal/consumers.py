"""Named consumer offsets, kept durably in an append-only offset log shared by processes.

Consumers usually run in reader processes, not in the writer, so the offset log has its own
short-lived exclusive ``flock`` instead of relying on the journal's writer lock. Each commit
appends one checksummed entry and fsyncs it; the latest entry for a name wins, and an offset of
``-1`` removes the name. When the log grows well past the number of live names it is rewritten
(write temporary, lock it, fsync, rename, fsync directory). A process whose descriptor still
points at the replaced file notices (inode changed) after taking the lock and reopens.
"""

from __future__ import annotations

import fcntl
import os
import threading

from sluiceway.journal.format import CONSUMERS_MAGIC, decode_consumer_entries, encode_consumer_entry
from sluiceway.journal.segment import fsync_dir

FILE_NAME = "consumers.log"
_REWRITE_MIN_ENTRIES = 1024


def create_offset_log(directory: str) -> None:
    path = os.path.join(directory, FILE_NAME)
    if os.path.exists(path):
        return
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, CONSUMERS_MAGIC)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class OffsetLog:
    def __init__(self, directory: str, *, fsync: bool = True) -> None:
        self._dir = directory
        self._path = os.path.join(directory, FILE_NAME)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd = -1
        self._ino = -1
        self._pos = 0
        self._entries = 0
        self._offsets: dict[str, int] = {}

    # --- reading ----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self._ino = os.fstat(self._fd).st_ino
        self._pos = 0
        self._entries = 0
        self._offsets = {}

    def _refresh(self) -> None:
        """Apply entries appended since the last look (reopening if the file was replaced)."""
        try:
            ino = os.stat(self._path).st_ino
        except FileNotFoundError:
            self._offsets = {}
            return
        if self._fd < 0 or ino != self._ino:
            self._open()
        size = os.fstat(self._fd).st_size
        if size <= self._pos:
            return
        start = self._pos or len(CONSUMERS_MAGIC)
        if self._pos == 0:
            magic = os.pread(self._fd, len(CONSUMERS_MAGIC), 0)
            if magic != CONSUMERS_MAGIC:
                raise ValueError(f"{self._path} is not a consumer offset log")
        buf = os.pread(self._fd, size - start, start)
        entries, end = decode_consumer_entries(buf, 0)
        for name, offset in entries:
            if offset < 0:
                self._offsets.pop(name, None)
            else:
                self._offsets[name] = offset
        self._entries += len(entries)
        self._pos = start + end

    def offsets(self) -> dict[str, int]:
        with self._lock:
            self._refresh()
            return dict(self._offsets)

    # --- writing ----------------------------------------------------------------------------
    def commit(self, name: str, offset: int) -> None:
        """Durably record ``offset`` for ``name`` (``-1`` removes it)."""
        entry = encode_consumer_entry(name, offset)
        with self._lock:
            self._lock_file()
            try:
                self._refresh()
                size = os.fstat(self._fd).st_size
                if size > self._pos:
                    # A committer died mid-append: drop its torn entry, or ours would be unreadable
                    # behind it. Safe because we hold the exclusive lock.
                    os.ftruncate(self._fd, self._pos)
                os.write(self._fd, entry)  # O_APPEND
                if self._fsync:
                    os.fsync(self._fd)
                self._pos += len(entry)
                self._entries += 1
                if offset < 0:
                    self._offsets.pop(name, None)
                else:
                    self._offsets[name] = offset
                if self._entries > max(_REWRITE_MIN_ENTRIES, 4 * len(self._offsets)):
                    self._rewrite()
            finally:
                if self._fd >= 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _lock_file(self) -> None:
        while True:
            if self._fd < 0:
                self._open()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            # The file may have been replaced by a rewrite while we waited for the lock.
            if os.stat(self._path).st_ino == self._ino:
                return
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._open()

    def _rewrite(self) -> None:
        """Replace the log with one entry per live name (we hold the lock on the current file).

        The new file is locked *before* it takes the log's name. Closing our descriptor of the
        old file releases that file's lock; a committer blocked on it then finds the name moved,
        reopens and locks the new file, and must wait there until our caller unlocks. Locked only
        after the rename, the new file was free for a moment: such a committer could append to it
        while we still took it over (the soak found it, as an assertion here, after an hour).
        """
        # Only one process rewrites at a time (we hold the lock), so a fixed name is safe; a
        # leftover from a crash is simply overwritten.
        tmp = self._path + ".rewrite"
        data = CONSUMERS_MAGIC + b"".join(encode_consumer_entry(n, o) for n, o in self._offsets.items())
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, data)
            os.fsync(fd)
            os.replace(tmp, self._path)
            fsync_dir(self._dir)
        except BaseException:
            # Our descriptor of the old file still holds its lock (the caller releases it); if
            # the rename happened, the next call finds the new inode and reopens by name.
            os.close(fd)
            raise
        old, self._fd = self._fd, fd
        self._ino = os.fstat(fd).st_ino
        self._pos = len(data)
        self._entries = len(self._offsets)
        os.close(old)  # its waiters go to the new file, which the caller unlocks when done

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
