"""Change data capture from PostgreSQL: copy each table, then follow its changes.

A reader decodes a logical replication slot (``pgoutput``) through SQL functions, copies tables
in primary-key chunks with the watermark method (DBLog) so that changes made during the copy
are neither lost nor reordered, and advances the slot only when every sink has committed. The
pipeline's ``postgres-cdc`` source (``sluice-postgres-cdc`` in Spark) is built on it; see
``docs/cdc.md``.

Layout: :mod:`~sluiceway.cdc.pgoutput` (decoding messages) and :mod:`~sluiceway.cdc.values`
(values → JSON) and :mod:`~sluiceway.cdc.assemble` (messages → records, chunk windows) are pure;
:mod:`~sluiceway.cdc.postgres` is the database edge; :mod:`~sluiceway.cdc.state` the shared
files; :mod:`~sluiceway.cdc.reader` ties them into one sink's reader.
"""

from sluiceway.cdc.errors import CdcError, LostChangesError, SlotInUseError
from sluiceway.cdc.reader import CdcOptions, CdcReader, describe

__all__ = ["CdcError", "CdcOptions", "CdcReader", "LostChangesError", "SlotInUseError", "describe"]
