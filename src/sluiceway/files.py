"""Small state files shared between processes: an exclusive ``flock`` and atomic JSON writes.

Pipeline sinks and CDC readers keep a little state beside their Spark checkpoints that the
running queries, their planning processes and the CLI all update: read-modify-write under an
exclusive lock, written whole to a temporary file and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def exclusive(lock_file: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the block.

    Yields True; with ``wait=False`` it yields False at once when another process holds it.
    The lock goes with the process, so a killed holder never leaves it taken.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_json(path: Path, data: Any, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` as JSON, all at once (rename); ``durable``: fsync first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        if durable:
            fsync(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        # A failed write (a full disk) names no file: name the state file, and leave no half of it.
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc
        raise
    if durable:
        fsync(path.parent)


def fsync(path: Path) -> None:
    """fsync a file or a directory (after a rename, so the new entry survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
