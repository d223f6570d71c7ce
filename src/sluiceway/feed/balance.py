"""Load balancing by work stealing, after the Cosmos DB change feed processor.

Every worker runs the same rule on the same facts, with no coordinator:

* the *live owners* are the owners of unexpired leases (seen in the database, by its clock),
  plus the worker itself even while it holds nothing;
* ``target = ceil(available partitions / live owners)``;
* under target: first take free partitions (never leased, released, or whose lease expired);
  if there are none, steal **one** per cycle from the most loaded owner, when that owner holds
  more than its share (stealing one at a time keeps workers from stampeding on each other);
* over target: release the excess so that others can take it.

A newcomer therefore shows up as a live owner after its first steal; everyone's target drops,
the over-loaded release, and the newcomer takes what they released. Which free partitions a
worker takes: the highest priorities first (:func:`choose`). Pure functions only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Census:
    """What the partitions table says: available partitions and unexpired leases per owner."""

    available: int
    owners: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Plan:
    target: int
    #: how many free partitions to try to take now
    acquire: int
    #: how many of our own partitions to give up
    release: int


def plan(me: str, mine: int, census: Census) -> Plan:
    """Target, how many to acquire and how many to release for worker ``me`` holding ``mine``."""
    owners = {owner: count for owner, count in census.owners.items() if count > 0}
    owners[me] = mine
    target = math.ceil(census.available / len(owners)) if census.available > 0 else 0
    if mine > target:
        return Plan(target, 0, mine - target)
    return Plan(target, target - mine, 0)


def victim(me: str, mine: int, target: int, census: Census) -> str | None:
    """The owner to steal one partition from, or ``None``.

    As in Cosmos: the most loaded other owner, if it holds more than ``target`` — or at least
    ``target`` when we need more than one (otherwise two workers one short of target and one
    over would never settle). Ties go to the lexically smallest owner so that concurrent
    stealers agree on whom to steal from rather than spreading the disruption.
    """
    need = target - mine
    if need <= 0:
        return None
    others = [(count, owner) for owner, count in census.owners.items() if owner != me and count > 0]
    if not others:
        return None
    count, owner = min(others, key=lambda pair: (-pair[0], pair[1]))
    threshold = target - 1 if need > 1 else target
    return owner if count > threshold else None


@dataclass(frozen=True, slots=True)
class FreePartition:
    """A free (or expired) partition as the free-partition page lists it."""

    id: int
    version: int
    priority: int = 0


def choose(free: Sequence[FreePartition], need: int, rand: Callable[[], float]) -> list[FreePartition]:
    """The ``need`` partitions to try to take from a page of free ones: the highest priorities
    first; among equal priorities a random part, so that workers balancing at the same moment
    mostly try different rows instead of all losing on the same ones.

    >>> page = [FreePartition(1, 0, 0), FreePartition(2, 0, 5), FreePartition(3, 0, 0)]
    >>> [p.id for p in choose(page, 1, lambda: 0.5)]
    [2]
    """
    return sorted(free, key=lambda p: (-p.priority, rand()))[: max(0, need)]
