"""Work-stealing balance: the per-worker rule, and convergence of many workers applying it."""

from __future__ import annotations

import math
import random

import pytest

from sluiceway.feed.balance import Census, Plan, plan, victim


def test_alone_takes_everything() -> None:
    assert plan("a", 0, Census(10, {})) == Plan(target=10, acquire=10, release=0)


def test_target_is_the_ceiling_of_a_fair_share() -> None:
    census = Census(10, {"a": 4, "b": 4, "c": 2})
    assert plan("c", 2, census) == Plan(target=4, acquire=2, release=0)
    assert plan("a", 4, census).acquire == 0


def test_over_target_releases_the_excess() -> None:
    assert plan("a", 10, Census(10, {"a": 10, "b": 1})) == Plan(target=5, acquire=0, release=5)


def test_a_newcomer_counts_itself() -> None:
    assert plan("new", 0, Census(200, {f"w{i}": 29 for i in range(7)})).target == 25


def test_nothing_available() -> None:
    assert plan("a", 0, Census(0, {})) == Plan(0, 0, 0)


def test_victim_is_the_most_loaded_over_share() -> None:
    census = Census(10, {"a": 5, "b": 3, "c": 2})
    assert victim("c", 2, 4, census) == "a"
    # Needing a single partition: steal only from an owner strictly over target.
    assert victim("b", 3, 4, Census(10, {"a": 4, "b": 3, "c": 3})) is None
    # Needing more than one: an owner at target is fair game (else 4/4/2 never settles).
    assert victim("c", 2, 4, Census(10, {"a": 4, "b": 4, "c": 2})) == "a"
    assert victim("a", 5, 4, census) is None
    assert victim("a", 0, 1, Census(1, {})) is None


def test_ties_pick_the_same_victim_for_everyone() -> None:
    assert victim("z", 0, 3, Census(9, {"b": 4, "a": 4, "z": 0})) == "a"


class Table:
    """An in-memory partitions table with leases, ticking in whole cycles."""

    def __init__(self, partitions: int, lease: int = 3) -> None:
        self.owner: list[str | None] = [None] * partitions
        self.expiry = [0] * partitions
        self.lease = lease
        self.now = 0
        self.done: set[int] = set()  # completed partitions: no longer available to anyone

    def complete(self, i: int) -> None:
        self.done.add(i)
        self.owner[i] = None

    def census(self) -> Census:
        owners: dict[str, int] = {}
        for owner, expiry in zip(self.owner, self.expiry, strict=True):
            if owner is not None and expiry > self.now:
                owners[owner] = owners.get(owner, 0) + 1
        return Census(len(self.owner) - len(self.done), owners)

    def held(self, me: str) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == me]

    def step(self, me: str, rng: random.Random) -> None:
        mine = self.held(me)
        for i in mine:  # renew
            self.expiry[i] = self.now + self.lease
        census = self.census()
        p = plan(me, len(mine), census)
        if p.release:
            for i in mine[-p.release :]:
                self.owner[i], self.expiry[i] = None, 0
            return
        free = [i for i, e in enumerate(self.expiry) if e <= self.now and i not in self.done]
        rng.shuffle(free)
        for i in free[: p.acquire]:
            self.owner[i], self.expiry[i] = me, self.now + self.lease
        if not free and p.acquire:
            v = victim(me, len(mine), p.target, census)
            if v is not None:
                i = max(self.held(v))
                self.owner[i], self.expiry[i] = me, self.now + self.lease

    def run(self, workers: list[str], cycles: int, rng: random.Random) -> None:
        for _ in range(cycles):
            order = list(workers)
            rng.shuffle(order)
            for w in order:
                self.step(w, rng)
            self.now += 1

    def counts(self, workers: list[str]) -> list[int]:
        return [len(self.held(w)) for w in workers]


@pytest.mark.parametrize("seed", range(5))
def test_workers_converge_on_a_fair_share_through_joins_and_deaths(seed: int) -> None:
    rng = random.Random(seed)
    table = Table(200)
    workers = [f"w{i}" for i in range(7)]
    table.run(workers, 12, rng)
    assert sum(table.counts(workers)) == 200
    assert max(table.counts(workers)) - min(table.counts(workers)) <= 1

    # A newcomer gets its share: it steals one, the others see it and release their excess.
    workers.append("new")
    table.run(workers, 12, rng)
    assert table.counts(["new"]) == [25]
    assert set(table.counts(workers)) == {25}

    # A worker dies: its leases expire and the survivors take them over.
    dead = workers.pop(0)
    for _ in range(12):
        table.run(workers, 1, rng)
    assert table.held(dead) == []
    live = table.counts(workers)
    assert sum(live) == 200
    assert max(live) <= math.ceil(200 / 7) and max(live) - min(live) <= 1


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("completion", [0.002, 0.02, 0.1])
def test_a_dead_workers_partitions_are_taken_while_partitions_complete(seed: int, completion: float) -> None:
    """Targets fall as partitions complete, and survivors release their excess as they go; the
    partitions a dead worker held must still be taken soon after its leases expire, never left
    behind because every survivor happens to sit at its (falling) target."""
    rng = random.Random(seed)
    table = Table(200)
    workers = [f"w{i}" for i in range(8)]

    def cycle() -> None:
        for w in rng.sample(workers, len(workers)):
            for i in table.held(w):  # some of what each worker holds completes
                if rng.random() < completion:
                    table.complete(i)
            table.step(w, rng)
        table.now += 1

    for _ in range(10):
        cycle()
    dead = max(workers, key=lambda w: len(table.held(w)))
    workers.remove(dead)
    for _ in range(table.lease + 3):  # the leases run out, then a few balancing cycles
        cycle()
    assert table.held(dead) == []
