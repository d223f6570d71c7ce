"""The MP/R harvester: outbox → Kafka or journal, leader-elected."""

from sluiceway.harvest.config import HarvestConfig
from sluiceway.harvest.events import (
    Event,
    KeyParked,
    LeaderAcquired,
    LeaderFenced,
    LeaderRefreshed,
    LeaderRevoked,
    MeterRead,
    RecordDeadLettered,
    Stats,
)
from sluiceway.harvest.harvest import Harvest
from sluiceway.harvest.sequence import SLUICE_ID, SLUICE_LEADER, Deduplicator, sequence_id

__all__ = [
    "SLUICE_ID",
    "SLUICE_LEADER",
    "Deduplicator",
    "Event",
    "Harvest",
    "HarvestConfig",
    "KeyParked",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "MeterRead",
    "RecordDeadLettered",
    "Stats",
    "sequence_id",
]
