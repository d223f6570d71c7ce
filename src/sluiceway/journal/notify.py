"""Wake a follower in another process when the writer publishes new records.

The writer rewrites the small ``HEAD`` file after every durable commit, so "new data" is "HEAD
was modified". On Linux a follower blocks on an inotify watch of that file (through ctypes, no
extra dependency) and wakes within microseconds without touching the disk in between. Where
inotify is unavailable (other systems, or the per-user instance limit is reached) it falls
back to polling with a bounded exponential back-off: quick after activity, at most
``max_delay`` apart when idle — never a hot loop.

Both kinds also wake when the journal that owns them is closed (a shared "wake" pipe).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import sys
from typing import Protocol

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVE_SELF = 0x00000800
IN_DELETE_SELF = 0x00000400
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF


class Watcher(Protocol):
    def wait(self, timeout: float | None) -> None:
        """Block until the watched file may have changed, the owner closed, or ``timeout``."""

    def progressed(self) -> None:
        """Tell the watcher the follower found new data (resets a polling back-off)."""

    def close(self) -> None: ...


class _Inotify:
    """Thin ctypes binding; ``None`` from :func:`load` when the platform has no inotify."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._init1 = libc.inotify_init1
        self._init1.argtypes = [ctypes.c_int]
        self._init1.restype = ctypes.c_int
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add_watch.restype = ctypes.c_int

    def init(self) -> int:
        fd = int(self._init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def add_watch(self, fd: int, path: str, mask: int) -> int:
        wd = int(self._add_watch(fd, os.fsencode(path), mask))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd


_INOTIFY: _Inotify | None = None
_INOTIFY_LOADED = False


def _load_inotify() -> _Inotify | None:
    global _INOTIFY, _INOTIFY_LOADED
    if not _INOTIFY_LOADED:
        _INOTIFY_LOADED = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                _INOTIFY = _Inotify(libc)
            except (OSError, AttributeError):
                _INOTIFY = None
    return _INOTIFY


class InotifyWatcher:
    def __init__(self, path: str, wake_fd: int, ino: _Inotify) -> None:
        self._fd = ino.init()
        try:
            ino.add_watch(self._fd, path, _WATCH_MASK)
        except OSError:
            os.close(self._fd)
            raise
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._poll.register(wake_fd, select.POLLIN)

    def wait(self, timeout: float | None) -> None:
        # Events that arrived since the last drain are still queued, so a change that happened
        # between the caller's check and this call returns at once instead of being missed.
        ms = None if timeout is None else max(0, int(timeout * 1000))
        try:
            self._poll.poll(ms)
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for old kernels
            return
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self._fd, 4096):
                    return
            except BlockingIOError:
                return
            except OSError as exc:  # pragma: no cover - defensive
                if exc.errno == errno.EINTR:
                    continue
                return

    def progressed(self) -> None:
        pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class PollingWatcher:
    """Bounded exponential back-off: ``min_delay`` doubling up to ``max_delay`` while idle."""

    def __init__(self, wake_fd: int, min_delay: float = 0.001, max_delay: float = 0.1) -> None:
        self._wake_fd = wake_fd
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.delay = min_delay

    def wait(self, timeout: float | None) -> None:
        step = self.delay if timeout is None else min(self.delay, max(0.0, timeout))
        # select() on the wake pipe doubles as an interruptible sleep.
        if step > 0:
            select.select([self._wake_fd], [], [], step)
        self.delay = min(self.delay * 2, self.max_delay)

    def progressed(self) -> None:
        self.delay = self.min_delay

    def close(self) -> None:
        pass


def make_watcher(path: str, wake_fd: int, *, use_inotify: bool = True) -> Watcher:
    """An inotify watcher of ``path`` when possible, else a polling one."""
    ino = _load_inotify() if use_inotify else None
    if ino is not None:
        try:
            return InotifyWatcher(path, wake_fd, ino)
        except OSError:
            pass  # e.g. EMFILE: too many inotify instances for this user; poll instead
    return PollingWatcher(wake_fd)
