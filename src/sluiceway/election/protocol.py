"""The election protocol: what an election promises its user, and the port a lease talks to.

It lives here, with the elections that implement it, so that the harvester (and the pipeline's
outbox source) depend on the election layer and never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ElectionListener(Protocol):
    """Told about leadership transitions, from the election's own thread."""

    def leader_acquired(self, epoch: int) -> None: ...

    def leader_revoked(self) -> None: ...

    def leader_fenced(self) -> None: ...


class LeaderElection(Protocol):
    """Only one candidate (say one harvester per outbox) leads at a time.

    ``start`` begins campaigning and reports transitions to the listener (from the election's own
    thread); ``stop`` releases leadership if held. ``is_leader`` is the current, fenced-aware view.
    """

    def start(self, listener: ElectionListener) -> None: ...

    def is_leader(self) -> bool: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One lease row as the store read it; ``remaining`` is seconds until expiry by the store's
    clock, ``term`` seconds since the holder took it (``None`` while free, or not recorded)."""

    holder: str | None
    epoch: int
    version: int
    remaining: float
    term: float | None = None


class LeaseStore(Protocol):
    """Where leases live: one row per name (holder, epoch, version, expiry).

    Expiry is decided by the store's own clock (the database's), never the caller's. Each call
    may fail with a ``DatabaseError`` *after* taking effect on the server.
    """

    def acquire(self, name: str, holder: str, ttl: float) -> LeaseView | None:
        """Take the lease if it is free or expired: a new epoch, valid for ``ttl`` seconds.
        Return the row as taken, or ``None`` when someone else holds it."""
        ...

    def renew(self, name: str, holder: str, epoch: int, version: int, ttl: float) -> bool:
        """Extend our lease by ``ttl`` if nobody changed the row since ``version``."""
        ...

    def release(self, name: str, holder: str, epoch: int) -> None:
        """Give the lease up (only if still ours at ``epoch``)."""
        ...

    def read(self, name: str) -> LeaseView | None: ...

    def close(self) -> None: ...
