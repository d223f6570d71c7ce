"""The feed: a database-backed fan-out/fan-in work queue (partitions · items · gates · leases).

Producers add *partitions* (units of work) holding *items* (sub-work, bytes). Workers lease
partitions, process the items at each partition's current *gate*, and advance the gate when
all of them are done (fan-in). See ``docs/feed.md``.

>>> from sluiceway.feed import Feed, FeedWorker
>>> feed = Feed("sqlite:///:memory:")
>>> feed.add("folder-1", [b"a.pdf", b"b.pdf"])
1
"""

from sluiceway.feed.client import Feed
from sluiceway.feed.core import RetryPolicy
from sluiceway.feed.errors import (
    FeedError,
    FeedTimeout,
    GateError,
    PartitionClosedError,
    PartitionExistsError,
    PartitionNotFoundError,
    ProcessorError,
)
from sluiceway.feed.model import (
    FeedStatus,
    Item,
    ItemRecord,
    NewPartition,
    Page,
    Partition,
    ProcessorResult,
    ScheduledWork,
    Status,
    WorkerLeases,
    WorkerStats,
)
from sluiceway.feed.processors import HttpProcessor, load_processor
from sluiceway.feed.rate import RateKey, RateLimit
from sluiceway.feed.settings import FeedSettingsError, FeedWorkerSettings
from sluiceway.feed.worker import FeedWorker

__all__ = [
    "Feed",
    "FeedError",
    "FeedSettingsError",
    "FeedStatus",
    "FeedTimeout",
    "FeedWorker",
    "FeedWorkerSettings",
    "GateError",
    "HttpProcessor",
    "Item",
    "ItemRecord",
    "NewPartition",
    "Page",
    "Partition",
    "PartitionClosedError",
    "PartitionExistsError",
    "PartitionNotFoundError",
    "ProcessorError",
    "ProcessorResult",
    "RateKey",
    "RateLimit",
    "RetryPolicy",
    "ScheduledWork",
    "Status",
    "WorkerLeases",
    "WorkerStats",
    "load_processor",
]
