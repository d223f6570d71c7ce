"""The journal: a durable local append-only log with transactional appends.

For example::

    from sluiceway.journal import Journal
    with Journal.open("./data/journal") as j:
        with j.append() as tx:
            tx.write("order-1", b"...", namespace="orders")
        for rec in j.read():
            print(rec.offset, rec.namespace, rec.key)
"""

from __future__ import annotations

from sluiceway.journal.append import AppendTransaction
from sluiceway.journal.compaction import CompactionResult
from sluiceway.journal.errors import (
    AppendAborted,
    CorruptRecordError,
    ExpectationFailed,
    InvalidJournalRecord,
    JournalClosedError,
    JournalError,
    JournalLockedError,
    JournalNotFoundError,
    JournalReadOnlyError,
)
from sluiceway.journal.journal import Journal, SegmentInfo
from sluiceway.journal.record import ARROW_SCHEMA, Record

__all__ = [
    "ARROW_SCHEMA",
    "AppendAborted",
    "AppendTransaction",
    "CompactionResult",
    "CorruptRecordError",
    "ExpectationFailed",
    "InvalidJournalRecord",
    "Journal",
    "JournalClosedError",
    "JournalError",
    "JournalLockedError",
    "JournalNotFoundError",
    "JournalReadOnlyError",
    "Record",
    "SegmentInfo",
]
