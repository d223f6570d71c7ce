"""The outbox table, its records and the stasher that writes them."""

from sluiceway.outbox.deadletters import (
    DeadLetter,
    DeadLetterNotFoundError,
    list_dead_letters,
    resolve_dead_letter,
    retry_dead_letter,
)
from sluiceway.outbox.record import MarkedRecord, OutboxRecord, validate_record
from sluiceway.outbox.stasher import PreparedStash, Stasher
from sluiceway.outbox.table import OutboxLayout, OutboxStats, discover, init_outbox, outbox_stats

__all__ = [
    "DeadLetter",
    "DeadLetterNotFoundError",
    "MarkedRecord",
    "OutboxLayout",
    "OutboxRecord",
    "OutboxStats",
    "PreparedStash",
    "Stasher",
    "discover",
    "init_outbox",
    "list_dead_letters",
    "outbox_stats",
    "resolve_dead_letter",
    "retry_dead_letter",
    "validate_record",
]
