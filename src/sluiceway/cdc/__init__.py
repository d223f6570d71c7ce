"""Change data capture from PostgreSQL: copy each table, then follow its changes.

A reader decodes a logical replication slot (``pgoutput``) through SQL functions, copies tables
in primary-key chunks with the watermark method (DBLog) so that changes made during the copy
are neither lost nor reordered, and advances the slot only when every sink has committed. The
pipeline's ``postgres-cdc`` source (``sluice-postgres-cdc`` in Spark) is built on it; see
``docs/cdc.md``.

Layout — pure, no I/O: :mod:`~sluiceway.cdc.pgoutput` (decoding messages),
:mod:`~sluiceway.cdc.values` (values → JSON), :mod:`~sluiceway.cdc.relation` and
:mod:`~sluiceway.cdc.columnar` (a relation's changes, value by value and column-wise),
:mod:`~sluiceway.cdc.assemble` and :mod:`~sluiceway.cdc.records` (a stretch of the slot →
records, the copy's chunk windows), :mod:`~sluiceway.cdc.model` (the values they pass). At the
edge: :mod:`~sluiceway.cdc.postgres` (the database), :mod:`~sluiceway.cdc.state` (the files the
sinks share); :mod:`~sluiceway.cdc.reader` ties them into one sink's reader.
"""

from sluiceway.cdc.errors import CdcError, LostChangesError, SlotInUseError
from sluiceway.cdc.reader import CdcOptions, CdcReader, describe

__all__ = ["CdcError", "CdcOptions", "CdcReader", "LostChangesError", "SlotInUseError", "describe"]
