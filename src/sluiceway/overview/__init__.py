"""One view of every part: what the workspace watches, its status and health, the drill-downs and
the operator's actions. ``sluice status`` prints it; ``sluice ui`` serves it (:mod:`sluiceway.ui`).

>>> from sluiceway.config import validate
>>> from sluiceway.overview import Workspace, collect
>>> report = collect(validate(Workspace, {"journals": [{"name": "bus", "path": "./nowhere"}]}))
>>> report.journals[0].health.value
'unavailable'
"""

from sluiceway.overview.checks import evaluate, unhealthy
from sluiceway.overview.report import Health, StatusReport
from sluiceway.overview.status import KINDS, collect, find
from sluiceway.overview.workspace import Checks, FeedWatch, JournalWatch, OutboxWatch, Workspace

__all__ = [
    "KINDS",
    "Checks",
    "FeedWatch",
    "Health",
    "JournalWatch",
    "OutboxWatch",
    "StatusReport",
    "Workspace",
    "collect",
    "evaluate",
    "find",
    "unhealthy",
]
