"""The outbox table, its records and the stasher that writes them."""

from sluiceway.outbox.record import MarkedRecord, OutboxRecord, validate_record
from sluiceway.outbox.stasher import PreparedStash, Stasher
from sluiceway.outbox.table import OutboxLayout, OutboxStats, discover, init_outbox, outbox_stats

__all__ = [
    "MarkedRecord",
    "OutboxLayout",
    "OutboxRecord",
    "OutboxStats",
    "PreparedStash",
    "Stasher",
    "discover",
    "init_outbox",
    "outbox_stats",
    "validate_record",
]
