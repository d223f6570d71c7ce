"""Change data capture from PostgreSQL: copy each table, then follow its changes — streamed once.

The capture (:mod:`~sluiceway.cdc.capture`) reads a logical replication slot (``pgoutput``) over
the streaming replication protocol (:mod:`~sluiceway.cdc.stream`), copies tables in primary-key
chunks with the watermark method (DBLog) so that changes made during the copy are neither lost
nor reordered, and appends everything in commit order to a target (:mod:`~sluiceway.cdc.target`:
a journal), confirming to the server only what the target holds durably. The pipeline's
``postgres-cdc`` source runs a capture (:mod:`~sluiceway.cdc.service`) and its sinks read the
journal, each at its own offset; see ``docs/cdc.md``.

Layout — pure, no I/O: :mod:`~sluiceway.cdc.pgoutput` (decoding messages),
:mod:`~sluiceway.cdc.values` (values → JSON), :mod:`~sluiceway.cdc.relation` and
:mod:`~sluiceway.cdc.columnar` (a relation's changes, value by value and column-wise),
:mod:`~sluiceway.cdc.assemble` and :mod:`~sluiceway.cdc.records` (a stretch of the stream →
records, the copy's chunk windows), :mod:`~sluiceway.cdc.model` (the values they pass). At the
edge: :mod:`~sluiceway.cdc.postgres` (SQL), :mod:`~sluiceway.cdc.stream` (the replication
protocol), :mod:`~sluiceway.cdc.state` (the copy's files), :mod:`~sluiceway.cdc.target`.
"""

from sluiceway.cdc.capture import CaptureOptions, SlotCapture
from sluiceway.cdc.errors import CdcError, LostChangesError, SlotInUseError
from sluiceway.cdc.service import CaptureService, describe
from sluiceway.cdc.target import CaptureTarget, JournalTarget

__all__ = [
    "CaptureOptions",
    "CaptureService",
    "CaptureTarget",
    "CdcError",
    "JournalTarget",
    "LostChangesError",
    "SlotCapture",
    "SlotInUseError",
    "describe",
]
