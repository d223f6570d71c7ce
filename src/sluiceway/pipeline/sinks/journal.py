"""Journal sink: each write is one all-or-nothing append carrying its token in a register."""

from __future__ import annotations

import pyarrow as pa

from sluiceway.journal import Journal
from sluiceway.pipeline.sources.journal import append_table, open_writer


class JournalSink:
    def __init__(self, path: str, sink: str) -> None:
        self.path = path
        self.sink = sink
        self._journal: Journal | None = None

    def write(self, table: pa.Table, token: str) -> None:
        if self._journal is None:
            self._journal = open_writer(self.path)
        try:
            append_table(self._journal, table, self.sink, token)
        except BaseException:
            # A failed append may leave the journal refusing appends until reopened.
            self.close()
            raise

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
