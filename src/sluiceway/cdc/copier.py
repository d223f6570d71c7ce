"""The copy's taker: chunks of each table by the watermark method (DBLog), for any source.

The copier writes ``L`` (a chunk's window opens), reads the chunk's rows, saves them, writes ``H``
(it closes); the watermarks come back through the change stream, where the capture's appender
puts the chunk's rows in place. What a source must offer is :class:`CopySession` (PostgreSQL
writes its watermarks as logical decoding messages, MariaDB/MySQL as rows of a small table of
ours); what the capture must offer is :class:`CopyHost`. At most ``read_ahead`` chunks are taken
ahead of what the capture's target holds durably, so chunk files stay few.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sluiceway.cdc.state import CopyState, SourceState, TableCopy
from sluiceway.cdc.watermark import Watermark

log = logging.getLogger("sluiceway.cdc")


class CopySession(Protocol):
    """One connection of the copier (its own: not shared with the stream)."""

    def emit(self, prefix: str, content: str) -> int:
        """Write a watermark durably; a stream position at or past its end."""
        ...

    def read_chunk(self, table: Any, after: list[Any] | None, size: int) -> Any:
        """The next ``size`` rows after ``after``: a :class:`~sluiceway.cdc.postgres.ChunkRead`."""
        ...

    def close(self) -> None: ...


class CopyHost(Protocol):
    """What the copier asks of its capture."""

    durable: int
    copy_done: threading.Event

    @property
    def prefix(self) -> str: ...

    @property
    def store(self) -> SourceState: ...

    @property
    def stopped(self) -> bool: ...

    def wait_for(self, position: int, timeout: float) -> bool: ...


def copy_tables(
    host: CopyHost,
    connect: Callable[[], CopySession],
    tables: Sequence[Any],
    *,
    chunk_size: int,
    read_ahead: int,
) -> None:
    """Take every table's chunks still to take, then wait until the target holds the last
    watermark and set ``host.copy_done``. Runs on the copier's thread; raises what stopped it."""
    session = connect()
    store = host.store
    try:
        with store.locked():
            state = store.load()
            if state.open is not None:
                # Its taker stopped between L and H: close the window so the stream moves on.
                log.warning("cdc: chunk %d was left open by a capture that stopped; abandoned it", state.open)
                state.closes[str(state.open)] = session.emit(
                    host.prefix, Watermark.abandoned(state.open).encode()
                )
                state.open = None
                store.save(state)
            taken: deque[int] = deque(maxlen=read_ahead)
            for table in tables:
                progress = state.tables.setdefault(table.namespace, TableCopy())
                while not progress.done and not host.stopped:
                    # At most `read_ahead` chunks taken and not yet appended: the server renders
                    # the next while the target takes this one, and chunk files stay few.
                    oldest = taken[0] if len(taken) == taken.maxlen else 0
                    while not host.wait_for(oldest, 1.0):
                        if host.stopped:
                            return
                    forget_chunks(host, state)
                    _take_chunk(host, session, table, state, progress, chunk_size)
                    taken.append(state.frontier)
            if not host.stopped and state.done_at is None:
                state.done_at = state.frontier
                store.save(state)
                log.info("cdc: the copy of every table is complete")
        if not host.stopped:
            host.wait_for(state.frontier, 3600)
            with store.locked():
                forget_chunks(host, state)
            host.copy_done.set()
    finally:
        session.close()


def forget_chunks(host: CopyHost, state: CopyState) -> None:
    """Remove the files of chunks whose window the target has passed (called by the copier only)."""
    gone = [cid for cid, close in state.closes.items() if close <= host.durable]
    for cid in gone:
        host.store.chunk_path(int(cid)).unlink(missing_ok=True)
        del state.closes[cid]
    if gone:
        host.store.save(state)


def _take_chunk(
    host: CopyHost, session: CopySession, table: Any, state: CopyState, progress: TableCopy, size: int
) -> None:
    store = host.store
    chunk = state.next_chunk
    state.next_chunk += 1
    state.open = chunk
    store.save(state)
    try:
        session.emit(host.prefix, Watermark.opened(chunk, table.namespace).encode())
        read = session.read_chunk(table, progress.last, size)
        store.write_chunk(chunk, table.namespace, read.snapshot, read.read_time, read.keys, read.values)
        close = session.emit(host.prefix, Watermark.closed(chunk).encode())
    except BaseException:
        try:
            state.closes[str(chunk)] = session.emit(host.prefix, Watermark.abandoned(chunk).encode())
            state.open = None
            store.save(state)
        except Exception as exc:  # the next run abandons it instead
            log.warning("cdc: could not abandon chunk %d: %s", chunk, exc)
        raise
    state.closes[str(chunk)] = close
    state.open, state.frontier = None, close
    progress.last = read.last
    progress.rows += len(read.keys)
    progress.chunks += 1
    if read.done:
        progress.done = True
        done = Watermark.completed(table.namespace).encode()
        progress.completed_at = state.frontier = session.emit(host.prefix, done)
        log.info("cdc: copied %s (%d rows in %d chunks)", table.namespace, progress.rows, progress.chunks)
    store.save(state)
