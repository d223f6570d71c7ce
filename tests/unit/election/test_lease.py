"""The database lease's rules (LeaseCampaign) on an in-memory store and a hand-moved clock.

The store's clock plays the database's: expiry is decided there. The campaign's own clock only
measures how long it may trust its last renewal (``ttl * safety``), so it always stops leading
before the store would let a rival in.
"""

from __future__ import annotations

import pytest

from sluiceway.election import LeaseCampaign
from sluiceway.election.memory import MemoryLeaseStore
from sluiceway.testing import ManualClock
from tests.support.election import Events

TTL = 4.0  # renew every 1s, trust a renewal for 3.2s, the store keeps it for 4s


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> MemoryLeaseStore:
    return MemoryLeaseStore(clock)


def candidate(store: MemoryLeaseStore, clock: ManualClock, holder: str) -> tuple[LeaseCampaign, Events]:
    events = Events()
    return LeaseCampaign(store, events, name="orders", holder=holder, ttl=TTL, clock=clock), events


def test_the_first_candidate_wins_and_renews_at_once(store: MemoryLeaseStore, clock: ManualClock) -> None:
    a, events = candidate(store, clock, "a")
    assert not a.is_leader()
    assert a.step() == 0.0, "after winning, the first renewal follows at once"
    assert a.is_leader() and a.epoch == 1 and events.seen == ["acquired 1"]
    assert a.step() == a.renew_interval == 1.0
    assert store.calls == {"acquire": 1, "renew": 1}


def test_a_rival_waits_while_the_lease_is_held(store: MemoryLeaseStore, clock: ManualClock) -> None:
    a, _ = candidate(store, clock, "a")
    b, b_events = candidate(store, clock, "b")
    a.step()
    assert b.step() == b.retry_interval == 0.5
    for _ in range(10):  # a keeps renewing: b never gets in
        clock.advance(1.0)
        a.step()
        b.step()
    assert a.is_leader() and not b.is_leader() and b_events.seen == []


def test_the_local_view_ends_before_the_store_lets_a_rival_in(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, _ = candidate(store, clock, "a")
    b, _ = candidate(store, clock, "b")
    a.step()
    clock.advance(TTL * 0.8 - 0.01)
    assert a.is_leader()
    clock.advance(0.01)
    assert not a.is_leader(), "trusted strictly before renewal start + ttl * safety"
    assert b.step() == b.retry_interval and not b.is_leader(), "the store still holds it for a"
    clock.advance(TTL * 0.2 + 0.01)
    assert b.step() == 0.0 and b.is_leader() and b.epoch == 2


def test_a_renewal_extends_trust_from_the_moment_it_was_sent(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, _ = candidate(store, clock, "a")
    a.step()
    clock.advance(3.0)
    a.step()  # renewed at 103.0: trusted until 103.0 + 3.2
    clock.advance(3.19)
    assert a.is_leader()
    clock.advance(0.01)
    assert not a.is_leader()


def test_failed_renewals_keep_leadership_until_the_deadline_then_fence(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, events = candidate(store, clock, "a")
    a.step()
    store.fail_next("renew", times=10)
    clock.advance(1.0)
    assert a.step() == 0.5, "a failed call is retried sooner than a renewal"
    assert a.is_leader() and events.seen == ["acquired 1"]
    clock.advance(2.2)  # the deadline (3.2s after the last successful renewal, at 100.0)
    a.step()
    assert not a.is_leader() and events.seen == ["acquired 1", "fenced"]
    clock.advance(0.5)
    a.step()
    assert events.seen == ["acquired 1", "fenced"], "fenced once"


def test_a_deposed_leader_learns_it_from_its_next_renewal(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, a_events = candidate(store, clock, "a")
    b, b_events = candidate(store, clock, "b")
    a.step()
    clock.advance(TTL + 0.1)  # a's thread stalled past expiry (a long pause, say)
    b.step()
    assert b_events.seen == ["acquired 2"]
    a.step()
    assert a_events.seen == ["acquired 1", "fenced"] and not a.is_leader()
    view = store.read("orders")
    assert view is not None and (view.holder, view.epoch) == ("b", 2)


def test_a_renewal_that_committed_but_failed_costs_the_term_safely(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    # The renewal took effect and then reported an error: our version is one behind, so the
    # next renewal fails its version check and we fence — never two leaders, at worst a failover.
    a, events = candidate(store, clock, "a")
    a.step()
    store.fail_next("renew", applied=True)
    clock.advance(1.0)
    a.step()
    assert a.is_leader()
    clock.advance(0.5)
    a.step()
    assert not a.is_leader() and events.seen == ["acquired 1", "fenced"]


def test_resigning_releases_the_lease_for_a_rival_at_once(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, a_events = candidate(store, clock, "a")
    b, _ = candidate(store, clock, "b")
    a.step()
    a.resign()
    assert not a.is_leader() and a_events.seen == ["acquired 1", "revoked"]
    assert b.step() == 0.0 and b.is_leader()
    a.resign()
    assert a_events.seen == ["acquired 1", "revoked"], "resigning without the lease does nothing"


def test_a_failed_release_still_ends_the_term_and_the_lease_expires(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, a_events = candidate(store, clock, "a")
    b, _ = candidate(store, clock, "b")
    a.step()
    store.fail_next("release")
    a.resign()
    assert a_events.seen == ["acquired 1", "revoked"]
    assert b.step() == b.retry_interval
    clock.advance(TTL + 0.01)
    assert b.step() == 0.0 and b.is_leader()


def test_an_acquisition_that_failed_after_taking_effect_is_won_after_expiry(
    store: MemoryLeaseStore, clock: ManualClock
) -> None:
    a, events = candidate(store, clock, "a")
    store.fail_next("acquire", applied=True)
    assert a.step() == 0.5 and not a.is_leader() and events.seen == []
    clock.advance(TTL + 0.01)
    assert a.step() == 0.0 and a.is_leader() and a.epoch == 2


def test_the_ttl_must_be_positive(store: MemoryLeaseStore) -> None:
    with pytest.raises(ValueError, match="positive"):
        LeaseCampaign(store, Events(), name="orders", holder="a", ttl=0)
