"""What every capture shares, whichever database it reads: appending with its position, waiting
for the target to hold a position, catching up, stopping.

:class:`~sluiceway.cdc.capture.SlotCapture` (PostgreSQL) and
:class:`~sluiceway.cdc.mysql.capture.BinlogCapture` (MariaDB/MySQL) keep their own fields
(dataclasses) and their own stream; this base holds the methods written once over them. A
source that must tell the server what the target holds (a slot's confirmed position) does it in
:meth:`CaptureLife._confirm`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluiceway.cdc.copier import CopySession, copy_tables
from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.state import SourceState


class CaptureLife:
    #: Position up to which everything is appended to the target.
    position: int
    #: Position up to which the target holds everything durably.
    durable: int
    target: Any
    copy_done: threading.Event
    _stop: threading.Event
    _moved: threading.Condition

    options: Any
    _tables: list[Any]
    _copier: threading.Thread | None
    _copy_error: BaseException | None

    def run(self, until: Callable[[], bool] | None = None) -> None:
        raise NotImplementedError

    @property
    def prefix(self) -> str:
        """What marks this capture's watermarks."""
        raise NotImplementedError

    @property
    def store(self) -> SourceState:
        raise NotImplementedError

    def copying(self) -> bool:
        """Whether a table's copy is still due."""
        raise NotImplementedError

    def _copy_session(self) -> CopySession:
        """A connection of the copier's own."""
        raise NotImplementedError

    def _start_copy(self) -> None:
        """The copier on a thread of its own while a copy is due (else the copy is done)."""
        if self.copying():
            self._copier = threading.Thread(target=self._copy, name="sluice-cdc-copy", daemon=True)
            self._copier.start()
        else:
            self.copy_done.set()

    def _copy(self) -> None:
        try:
            copy_tables(
                self,
                self._copy_session,
                self._tables,
                chunk_size=self.options.chunk_size,
                read_ahead=self.options.read_ahead,
            )
        except BaseException as exc:
            if not self._stop.is_set():
                self._copy_error = exc  # the appender raises it

    def sync_point(self) -> int | str:
        """Write a heartbeat watermark now; a position at or past it (caught up once past it).
        A capture that may write nothing names the point otherwise (see :meth:`reached`)."""
        raise NotImplementedError

    def reached(self, point: int | str) -> bool:
        """The target holds everything up to the :meth:`sync_point` ``point`` durably."""
        return self.durable >= int(point)

    def _confirm(self, position: int) -> None:
        """Tell the server the target holds everything before ``position`` (nothing by default)."""

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        with self._moved:
            self._moved.notify_all()

    def _hold(self, batch: pa.RecordBatch, end: int) -> None:
        """Append ``batch``, the log now complete up to ``end``; a target that holds it durably once
        the append returns (not ``pipelined``) makes ``end`` durable at once (:meth:`durable_at`)."""
        self.target.append(batch, end)
        if not getattr(self.target, "pipelined", False):
            self.durable_at(end)
        with self._moved:
            self.position = end
            self._moved.notify_all()

    def durable_at(self, position: int) -> None:
        """The target holds everything before ``position`` durably: confirm it to the server, and
        wake whoever waits for it (a pipelined target calls this from its own threads, in order)."""
        self._confirm(position)
        with self._moved:
            if position > self.durable:
                self.durable = position
            self._moved.notify_all()

    def catch_up(self, timeout: float | None = None) -> None:
        """Stream until the copy is complete and every change committed before now is appended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        point: list[int | str] = []

        def caught_up() -> bool:
            if deadline is not None and time.monotonic() > deadline:
                raise CdcError(f"the capture did not catch up within {timeout} s")
            if not self.copy_done.is_set():
                return False
            if not point:
                point.append(self.sync_point())
            return self.reached(point[0])

        self.run(until=caught_up)

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until the target holds ``position`` durably (for the copier's read-ahead and for
        tests)."""
        deadline = time.monotonic() + timeout
        with self._moved:
            while self.durable < position and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._moved.wait(min(left, 0.5))
        return self.durable >= position
