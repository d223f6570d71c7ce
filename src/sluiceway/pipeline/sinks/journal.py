"""Journal sink: each write is one all-or-nothing append carrying its token in a register.

A journal locked by another writer, a full disk, a directory it may not write to: the
destination's fault, not a record's (``DestinationUnreachable``)."""

from __future__ import annotations

import pyarrow as pa

from sluiceway.journal import Journal, JournalLockedError
from sluiceway.pipeline.errors import DestinationUnreachable, file_system_fault
from sluiceway.pipeline.sources.journal import append_table, open_writer


class JournalSink:
    def __init__(self, path: str, sink: str) -> None:
        self.path = path
        self.sink = sink
        self._journal: Journal | None = None

    def write(self, table: pa.Table, token: str) -> None:
        try:
            if self._journal is None:
                self._journal = open_writer(self.path)
            append_table(self._journal, table, self.sink, token)
        except JournalLockedError as exc:
            # Another process writes to it (only one writer at a time): not a record's fault;
            # the sink waits for it (``retry.outage``), then stops saying so.
            raise DestinationUnreachable(str(exc)) from exc
        except BaseException as exc:
            # A failed append may leave the journal refusing appends until reopened.
            self.close()
            fault = file_system_fault(exc, self.path) if isinstance(exc, Exception) else None
            if fault is None:
                raise
            raise fault from exc

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
