"""Journal sink: each write is one all-or-nothing append carrying its token in a register.

A journal locked by another writer, a full disk, a directory it may not write to: the
destination's fault, not a record's (``DestinationUnreachable``)."""

from __future__ import annotations

import pyarrow as pa

from sluiceway.journal import Journal, JournalLockedError
from sluiceway.pipeline.errors import DestinationUnreachable, file_system_fault
from sluiceway.pipeline.sinks.base import ClientSink
from sluiceway.pipeline.sources.journal import append_table, open_writer


class JournalSink(ClientSink[Journal]):
    def __init__(self, path: str, sink: str) -> None:
        self.path = path
        self.sink = sink

    def _open(self) -> Journal:
        return open_writer(self.path)

    def _write(self, journal: Journal, table: pa.Table, token: str) -> None:
        append_table(journal, table, self.sink, token)

    def _release(self, journal: Journal) -> None:
        # A failed append may leave the journal refusing appends until reopened: dropped then too.
        journal.close()

    def _failure(self, exc: Exception) -> Exception | None:
        if isinstance(exc, JournalLockedError):
            # Another process writes to it (only one writer at a time): not a record's fault;
            # the sink waits for it (``retry.outage``), then stops saying so.
            return DestinationUnreachable(str(exc))
        return file_system_fault(exc, self.path)
