"""The MP/R harvester: outbox → Kafka or journal, leader-elected."""

from sluiceway.harvest.config import HarvestConfig
from sluiceway.harvest.events import (
    Event,
    LeaderAcquired,
    LeaderFenced,
    LeaderRefreshed,
    LeaderRevoked,
    MeterRead,
    RecordDeadLettered,
    Stats,
)
from sluiceway.harvest.harvest import Harvest

__all__ = [
    "Event",
    "Harvest",
    "HarvestConfig",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "MeterRead",
    "RecordDeadLettered",
    "Stats",
]
