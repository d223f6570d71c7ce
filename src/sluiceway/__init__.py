"""sluiceway — move data out of operational databases reliably and in order.

Public API (everything else is internal)::

    from sluiceway import OutboxRecord, Stasher            # write outbox rows in your transaction
    from sluiceway import Harvest, HarvestConfig           # the MP/R harvester (embedded)
    from sluiceway import Capture, CaptureConfig           # table changes to a broker (CDC, no Spark)
    from sluiceway import Deduplicator                     # consumers: drop re-sent records
    from sluiceway import Journal                          # the embedded durable log
    from sluiceway import Feed, FeedWorker                 # the database-backed work feed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluiceway.errors import (
    BrokerError,
    ConfigError,
    ConflictError,
    DatabaseError,
    DatabaseUnavailableError,
    DeadlockError,
    InvalidIdentifierError,
    InvalidRecordError,
    InvariantViolation,
    LeadershipError,
    LockTimeoutError,
    PublishError,
    SluicewayError,
    UnsupportedDsnError,
)
from sluiceway.lazy import exports as _exports
from sluiceway.outbox import OutboxRecord, PreparedStash, Stasher

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and IDEs
    from sluiceway.capture import Capture, CaptureConfig
    from sluiceway.feed import Feed, FeedWorker
    from sluiceway.harvest import Deduplicator, Harvest, HarvestConfig
    from sluiceway.journal import Journal
    from sluiceway.pipeline import Pipeline, PipelineSpec

#: The one version source: hatch reads it from here into the package metadata.
__version__ = "0.1.0"

# Heavier parts load on first use, so `import sluiceway` stays cheap for a service that only stashes.
_LAZY = {
    "Capture": "sluiceway.capture",
    "CaptureConfig": "sluiceway.capture",
    "Deduplicator": "sluiceway.harvest",
    "Harvest": "sluiceway.harvest",
    "HarvestConfig": "sluiceway.harvest",
    "Journal": "sluiceway.journal",
    "Feed": "sluiceway.feed",
    "FeedWorker": "sluiceway.feed",
    "Pipeline": "sluiceway.pipeline",
    "PipelineSpec": "sluiceway.pipeline",
}

__all__ = [
    "BrokerError",
    "Capture",
    "CaptureConfig",
    "ConfigError",
    "ConflictError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "DeadlockError",
    "Deduplicator",
    "Feed",
    "FeedWorker",
    "Harvest",
    "HarvestConfig",
    "InvalidIdentifierError",
    "InvalidRecordError",
    "InvariantViolation",
    "Journal",
    "LeadershipError",
    "LockTimeoutError",
    "OutboxRecord",
    "Pipeline",
    "PipelineSpec",
    "PreparedStash",
    "PublishError",
    "SluicewayError",
    "Stasher",
    "UnsupportedDsnError",
    "__version__",
]


__getattr__ = _exports(__name__, _LAZY)
