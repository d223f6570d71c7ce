"""The feed's errors, all rooted at :class:`sluiceway.errors.SluicewayError`."""

from __future__ import annotations

from sluiceway.errors import SluicewayError


class FeedError(SluicewayError):
    """Something the feed refused or could not do."""


class PartitionNotFoundError(FeedError):
    """No partition has this name (or id)."""

    def __init__(self, partition: str) -> None:
        self.partition = partition
        super().__init__(f"feed partition {partition!r} does not exist")


class PartitionExistsError(FeedError):
    """``Feed.add`` was asked to create a partition whose name is taken."""

    def __init__(self, partition: str) -> None:
        self.partition = partition
        super().__init__(
            f"feed partition {partition!r} already exists (use add_items to add to it, or if_exists='skip')"
        )


class PartitionClosedError(FeedError):
    """Items cannot be added to a partition that is already complete."""

    def __init__(self, partition: str) -> None:
        self.partition = partition
        super().__init__(f"feed partition {partition!r} is complete; no items can be added to it")


class GateError(FeedError):
    """A gate rule was broken: items below a partition's gate, or a checkpoint with open items.

    ``gate`` is what was asked for, ``current`` the partition's gate at the time.
    """

    def __init__(
        self, message: str, *, partition: str, gate: int | None = None, current: int | None = None
    ) -> None:
        self.partition = partition
        self.gate = gate
        self.current = current
        super().__init__(message)


class ProcessorError(FeedError):
    """A processor failed on an item, or answered something that is not a valid result.

    ``retryable=False`` fails the item at once instead of retrying it with backoff.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        self.retryable = retryable
        super().__init__(message)


class FeedTimeout(FeedError, TimeoutError):
    """A feed operation (``run_until_idle``, ``stop``) did not finish in the time given."""
