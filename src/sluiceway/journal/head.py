"""The ``HEAD`` file: how far readers may read, as the writer last published it.

The writer rewrites ``HEAD`` in place after every durable write (next offset, active segment,
end of durable data in it), so a reader in another process needs one small ``pread`` to know
what it may read, and watching the file (inotify) is how it learns that there is more.

An in-place rewrite can be read half-done; ``HEAD`` carries its own checksum, so a torn read
is detected and simply read again. When ``HEAD`` is missing or unusable, the truth is still
on disk: scanning the last segment for its committed batches gives the same answer, slower.
"""

from __future__ import annotations

import os
from typing import Final

from sluiceway.journal.errors import CorruptRecordError, JournalNotFoundError
from sluiceway.journal.format import HEAD_SIZE, HeadState, decode_head, decode_segment_header, segment_name
from sluiceway.journal.recovery import scan_committed
from sluiceway.journal.segment import list_segments

HEAD_FILE: Final = "HEAD"


def read_head_fd(fd: int) -> HeadState | None:
    # A read can race the writer's in-place rewrite and see a mix; the CRC catches it, so retry.
    for _ in range(10):
        view = decode_head(os.pread(fd, HEAD_SIZE, 0))
        if view is not None:
            return view
    return None


def read_head_file(directory: str) -> HeadState | None:
    """The published ``HEAD`` of the journal in ``directory`` (``None`` if absent or unreadable)."""
    try:
        fd = os.open(os.path.join(directory, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return read_head_fd(fd)
    finally:
        os.close(fd)


def scan_view(path: str) -> HeadState:
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


def head_offset(path: str) -> int:
    """The next offset the journal at ``path`` will assign, without opening it or taking a lock."""
    try:
        fd = os.open(os.path.join(path, HEAD_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not os.path.isdir(path):
            raise JournalNotFoundError(path) from None
        return scan_view(path).head
    try:
        view = read_head_fd(fd)
    finally:
        os.close(fd)
    return view.head if view is not None else scan_view(path).head
