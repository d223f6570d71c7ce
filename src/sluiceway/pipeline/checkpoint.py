"""Reading a sink's Spark checkpoint without Spark: its last committed and last planned batch.

``offsets/<n>`` holds the source offset batch ``n`` was planned to read up to, ``commits/<n>``
marks it done. Both the operator tools (status, lag) and the source adapters (the outbox's purge
at the end of a run) read it, so it lives below both.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluiceway.pipeline.errors import PipelineError


@dataclass(frozen=True)
class Checkpoint:
    committed_batch: int | None
    committed: dict[str, Any] | None
    planned_batch: int | None
    planned: dict[str, Any] | None


def _numbered(path: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


def _offset_of(path: Path) -> dict[str, Any] | None:
    """The source offset in one ``offsets/<n>`` file: ``v1``, metadata, then one line per source."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        return None
    if len(lines) < 3 or lines[-1] == "-":
        return None
    value = json.loads(lines[-1])
    return value if isinstance(value, dict) else None


def read_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    d = Path(directory)
    commits = _numbered(d / "commits")
    offsets = _numbered(d / "offsets")
    cb = commits[-1] if commits else None
    pb = offsets[-1] if offsets else None
    return Checkpoint(
        cb,
        _offset_of(d / "offsets" / str(cb)) if cb is not None else None,
        pb,
        _offset_of(d / "offsets" / str(pb)) if pb is not None else None,
    )


class CheckpointInUse(PipelineError):
    """Another run holds the checkpoint (see :class:`CheckpointLock`)."""


class CheckpointLock:
    """One run per checkpoint: an exclusive ``flock`` on ``<checkpoint>/.sluice-run.lock``, held
    for the run, naming its holder (process, host, start) for whoever is refused.

    Two runs of one spec would both plan the same batches: Spark fails the second ~40 s later
    (``CONCURRENT_STREAM_LOG_UPDATE``) after both counted records. The kernel drops the lock when
    the process ends, ``kill -9`` included, so a crashed run never blocks the next.
    """

    NAME = ".sluice-run.lock"

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        self.path = Path(checkpoint) / self.NAME
        self._fd: int | None = None
        #: The checkpoint directories this lock made (outermost first), to take away again if the
        #: run ends holding nothing else there: a run refused at start leaves nothing behind.
        self._made: list[Path] = []

    def acquire(self) -> None:
        import fcntl
        import socket
        import time

        self._made = [p for p in (*reversed(self.path.parent.parents), self.path.parent) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointInUse(self._refusal()) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._made and [p.name for p in self.path.parent.iterdir()] == [self.NAME]:
            self.path.unlink()  # the run made nothing here but its lock: leave no trace
            for made in reversed(self._made):
                with contextlib.suppress(OSError):  # another run may have begun in it since
                    made.rmdir()
        os.close(fd)  # closing drops the lock; the file stays (its content is the last holder)

    def holder(self) -> str | None:
        """Who holds the lock now (``None``: nobody), without taking it; for a check before Spark."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._refusal()
        finally:
            os.close(fd)
        return None

    def _refusal(self) -> str:
        try:
            held = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            held = {}
        who = (
            f"process {held['pid']} on {held.get('host', '?')}, started {held.get('started', '?')}"
            if "pid" in held
            else "another process"
        )
        return (
            f"checkpoint {self.path.parent} is in use by another run of this pipeline ({who}); "
            "one run per checkpoint: stop that one first"
        )
