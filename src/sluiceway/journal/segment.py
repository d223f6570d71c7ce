"""Segment files: naming, atomic creation, vectored writes and chunked batch reads."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluiceway.journal.errors import CorruptRecordError
from sluiceway.journal.format import (
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
    parse_segment_name,
    segment_name,
)
from sluiceway.journal.parse import Incomplete, Invalid, ParsedBatch, parse_batch

_IOV_MAX = 1024
_HEADER_READ = 64 << 10
TMP_SUFFIX = ".tmp"  # segment.seg.tmp: a segment being created or rewritten


def list_segments(directory: str) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending."""
    bases = []
    for name in os.listdir(directory):
        base = parse_segment_name(name)
        if base is not None:
            bases.append(base)
    bases.sort()
    return bases


def fsync_dir(directory: str) -> None:
    """Make file creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], pos: int) -> int:
    """Write every buffer at ``pos`` with as few ``pwritev`` calls as possible; returns the new end."""
    end = pos + sum(len(b) for b in buffers)
    if len(buffers) <= _IOV_MAX:
        written = os.pwritev(fd, buffers, pos)
        if pos + written == end:  # the usual case: one call
            return end
    else:
        written = 0
    # Short writes (or more buffers than one call takes): continue where the kernel stopped.
    views = [memoryview(b) for b in buffers if len(b)]
    i = 0
    while True:
        pos += written
        while written:
            size = len(views[i])
            if written >= size:
                written -= size
                i += 1
            else:
                views[i] = views[i][written:]
                written = 0
        if pos >= end:
            return end
        written = os.pwritev(fd, views[i : i + _IOV_MAX], pos)


def write_segment_file(
    directory: str,
    base: int,
    created_us: int,
    registers: Mapping[str, str],
    *,
    fsync: bool,
    body: bytes = b"",
) -> str:
    """Create segment ``base`` atomically: write a temporary file, sync it, rename, sync the directory.

    Done this way so a crash never leaves a segment whose header is half written under its
    final name: recovery then only ever has to deal with torn batches, not torn headers.
    ``body`` (already-encoded batches) is used by compaction to replace a segment in one step.
    """
    final = os.path.join(directory, segment_name(base))
    tmp = final + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, [encode_segment_header(base, created_us, registers), body], 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    if fsync:
        fsync_dir(directory)
    return final


def read_header(fd: int) -> SegmentHeader:
    """Read and validate a segment header; ``ValueError`` if it is not one."""
    buf = os.pread(fd, _HEADER_READ, 0)
    try:
        return decode_segment_header(buf)
    except ValueError:
        if len(buf) < _HEADER_READ:
            raise
    # A header bigger than the first read (many registers): read it all.
    return decode_segment_header(os.pread(fd, os.fstat(fd).st_size, 0))


def remove_temporaries(directory: str) -> None:
    for name in os.listdir(directory):
        if name.endswith(".seg" + TMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


@dataclass(slots=True)
class Chunk:
    """Consecutive complete batches read from a segment; positions are indexes into ``buf``."""

    buf: bytes
    file_pos: int  # file position of buf[0]
    batches: list[ParsedBatch]
    problem: Incomplete | Invalid | None  # what stopped the read before ``limit`` (if anything)


class SegmentReader:
    """Sequential reader of one segment file through its own descriptor.

    Holding our own descriptor means a segment replaced by compaction or deleted by retention
    while we read it stays readable (and consistent) until we are done with it.
    """

    def __init__(self, path: str, base: int) -> None:
        self.path = path
        self.base = base
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.header = read_header(self.fd)
            st = os.fstat(self.fd)
        except ValueError as exc:  # a damaged segment header: every reader reports it alike
            os.close(self.fd)
            raise CorruptRecordError(path, 0, None, str(exc)) from None
        except BaseException:
            os.close(self.fd)
            raise
        self.ino = st.st_ino
        self.pos = self.header.data_start

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, limit: int, chunk_size: int, max_records: int | None = None) -> Chunk:
        """Read the complete batches in ``[self.pos, limit)``, about ``chunk_size`` bytes of them.

        Advances ``self.pos`` past the returned batches. A batch bigger than ``chunk_size`` is
        read whole. With ``max_records``, stops before a batch that would take the count past
        it (unless it is the first). ``problem`` is set only when no batch could be returned before ``limit``.
        """
        start = self.pos
        if start >= limit:
            return Chunk(b"", start, [], None)
        want = min(limit - start, chunk_size)
        while True:
            buf = os.pread(self.fd, want, start)
            batches: list[ParsedBatch] = []
            p = 0
            records = 0
            problem: Incomplete | Invalid | None = None
            while p < len(buf):
                parsed = parse_batch(buf, p)
                if isinstance(parsed, ParsedBatch):
                    if max_records is not None and batches and records + parsed.count > max_records:
                        # Stop short rather than overshoot, so Arrow readers get whole batches
                        # of at most max_records rows and never have to slice one.
                        break
                    batches.append(parsed)
                    p = parsed.next_pos
                    records += parsed.count
                    if max_records is not None and records >= max_records:
                        break
                    continue
                problem = parsed
                break
            if batches or problem is None:
                self.pos = start + p
                return Chunk(buf, start, batches, None)
            if isinstance(problem, Incomplete) and start + problem.needed <= limit and len(buf) == want:
                want = problem.needed  # one batch larger than the chunk: read exactly it
                continue
            return Chunk(buf, start, [], problem)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
