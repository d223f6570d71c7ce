"""The MP/R harvester: outbox → Kafka or journal, leader-elected."""

from sluiceway.harvest.config import HarvestConfig

__all__ = ["HarvestConfig"]
