"""Change data capture from MariaDB and MySQL: the binlog, read as a replica, into the same
records as PostgreSQL's capture (docs/cdc.md, "MariaDB and MySQL").

Pure: :mod:`~sluiceway.cdc.mysql.values` (values → JSON), :mod:`~sluiceway.cdc.mysql.assemble`
(units → records, the copy's windows). At the edge: :mod:`~sluiceway.cdc.mysql.server` (SQL:
checks, tables, chunks, watermarks), :mod:`~sluiceway.cdc.mysql.reader` (the binlog stream),
:mod:`~sluiceway.cdc.mysql.capture` (the capture).
"""

from sluiceway.cdc.mysql.capture import BinlogCapture, BinlogOptions

__all__ = ["BinlogCapture", "BinlogOptions"]
