"""How a feed worker runs: one validated model, shared by :class:`~sluiceway.feed.FeedWorker`
and ``sluice feed worker`` (whose options are these fields, with these defaults).

>>> FeedWorkerSettings(lease=60).renew_interval
20.0
>>> FeedWorkerSettings.of(lease=0.1)                               # doctest: +ELLIPSIS
Traceback (most recent call last):
...
sluiceway.feed.settings.FeedSettingsError: feed worker: lease: Input should be greater than ... 0.5 (got 0.1)
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from sluiceway.config.loader import format_validation_error
from sluiceway.config.types import StrictModel
from sluiceway.feed.errors import FeedError
from sluiceway.feed.processors import Encoding


class FeedSettingsError(FeedError):
    """A worker setting that is out of range or unknown: ``field`` names it, ``problem`` says why."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"feed worker: {field}: {problem}" if field else f"feed worker: {problem}")


class FeedWorkerSettings(StrictModel):
    """Every setting of a feed worker but its database and processor (see the module docstring
    of :mod:`sluiceway.feed.worker` for what each does to the loop)."""

    #: The feed's table prefix.
    prefix: str = "feed_"
    #: Items processed at once (threads; 1: inline, on the worker's own thread).
    concurrency: int = Field(1, ge=1)
    #: Attempts per step before the item is failed (and its partition with it).
    max_attempts: int = Field(5, ge=1)
    #: Never advance gates; leave it to ``sluice feed checkpoint``.
    manual_checkpoint: bool = False
    #: Items claimed per statement.
    batch_size: int = Field(100, ge=1)
    #: Seconds a partition's lease (and an item's claim) lasts; renewed every third.
    lease: float = Field(20.0, ge=0.5)
    #: Seconds between idle polls (without wake-ups), and the throttle of a busy worker's top-ups.
    poll_interval: float = Field(0.5, gt=0)
    #: Rest on LISTEN/NOTIFY when idle (PostgreSQL only; ``None``: on there, off elsewhere).
    wake_ups: bool | None = None
    #: With wake-ups: the longest idle rest before looking anyway (a direct write notifies nobody).
    fallback_poll: float = Field(30.0, gt=0)
    #: A failed attempt's first backoff and its cap (seconds; doubling in between).
    backoff: float = Field(1.0, ge=0)
    max_backoff: float = Field(60.0, ge=0)
    #: Seconds between gate checks of the partitions a busy worker touched.
    checkpoint_interval: float = Field(0.05, ge=0)
    #: An HTTP processor's timeout (seconds) and how item data goes in its bodies.
    http_timeout: float = Field(10.0, gt=0)
    http_encoding: Encoding = "base64"
    #: The worker's id (``None``: host, pid and a random part — never reused).
    owner: str | None = None
    #: Create or upgrade the feed's tables at start.
    migrate: bool = True
    #: A span per item whose partition carries a sampled trace (:mod:`sluiceway.feed.tracing`);
    #: exported as the ``OTEL_*`` variables say. Needs the ``otel`` extra.
    tracing: bool = False

    @classmethod
    def of(cls, **options: Any) -> FeedWorkerSettings:
        """The settings from keyword options, or :class:`FeedError` naming the first bad one."""
        try:
            return cls(**options)
        except ValidationError as exc:
            error = format_validation_error(exc)
            field = error.path.split(".", 1)[0]
            text = error.problem.removeprefix("invalid configuration: ").removeprefix(f"{field}: ")
            raise FeedSettingsError(field, text) from None

    @property
    def renew_interval(self) -> float:
        """Seconds between lease renewals (a third of the lease)."""
        return self.lease / 3
