"""NELI's rules (NeliCampaign) driven by hand: assignments, heartbeats read back, a moved clock.

The Kafka driver feeds the campaign what its consumer reports; here the test does, so every
transition is checked without a broker and without sleeping.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from sluiceway.election import NeliCampaign
from sluiceway.election.neli import topic_already_exists
from sluiceway.testing import ManualClock
from tests.support.election import Events

TOPIC = "orders-leader"
TIMEOUT = 5.0
ZERO = [(TOPIC, 0)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def neli(clock: ManualClock, events: Events) -> NeliCampaign:
    return NeliCampaign(
        events,
        topic=TOPIC,
        group_id="orders",
        member="m1",
        heartbeat_timeout=TIMEOUT,
        heartbeat_interval=0.5,
        clock=clock,
    )


def lead(neli: NeliCampaign, clock: ManualClock) -> None:
    neli.on_assign(ZERO)
    assert neli.beat_due(clock.now)
    neli.on_message(0, neli.beat, clock.now)  # our heartbeat came back


def test_being_assigned_partition_0_is_not_yet_leadership(
    neli: NeliCampaign, clock: ManualClock, events: Events
) -> None:
    neli.on_assign(ZERO)
    assert neli.assigned and not neli.is_leader() and events.seen == []
    neli.on_message(0, neli.beat, clock.now)
    assert neli.is_leader() and neli.epoch == 1 and events.seen == ["acquired 1"]


def test_only_our_own_heartbeat_on_partition_0_while_assigned_confirms(
    neli: NeliCampaign, clock: ManualClock, events: Events
) -> None:
    neli.on_message(0, neli.beat, clock.now)
    assert not neli.is_leader(), "not assigned"
    neli.on_assign([(TOPIC, 1), ("other", 0)])
    assert not neli.assigned
    neli.on_assign(ZERO)
    neli.on_message(0, b"heartbeat:m2", clock.now)
    neli.on_message(1, neli.beat, clock.now)
    neli.on_message(0, None, clock.now)
    assert not neli.is_leader() and events.seen == []


def test_heartbeats_are_due_every_interval_while_assigned(neli: NeliCampaign, clock: ManualClock) -> None:
    assert not neli.beat_due(clock.now), "no beats before partition 0 is ours"
    neli.on_assign(ZERO)
    assert neli.beat_due(clock.now)
    assert not neli.beat_due(clock.now + 0.49)
    assert neli.beat_due(clock.now + 0.5)
    assert neli.beat == b"heartbeat:m1"


def test_no_heartbeat_within_the_timeout_fences(
    neli: NeliCampaign, clock: ManualClock, events: Events
) -> None:
    lead(neli, clock)
    clock.advance(TIMEOUT - 0.01)
    neli.check_deadline(clock.now)
    assert neli.is_leader()
    clock.advance(0.01)
    assert not neli.is_leader(), "the view ends at the deadline even before the driver checks"
    neli.check_deadline(clock.now)
    assert events.seen == ["acquired 1", "fenced"]
    neli.check_deadline(clock.now + 1)
    assert events.seen == ["acquired 1", "fenced"], "fenced once"


def test_each_heartbeat_seen_extends_leadership(neli: NeliCampaign, clock: ManualClock) -> None:
    lead(neli, clock)
    for _ in range(20):
        clock.advance(1.0)
        neli.on_message(0, neli.beat, clock.now)
        neli.check_deadline(clock.now)
    assert neli.is_leader() and neli.epoch == 1


def test_seeing_the_heartbeat_again_after_a_fence_starts_a_new_term(
    neli: NeliCampaign, clock: ManualClock, events: Events
) -> None:
    lead(neli, clock)
    clock.advance(TIMEOUT)
    neli.check_deadline(clock.now)
    neli.on_message(0, neli.beat, clock.now)
    assert neli.is_leader() and neli.epoch == 2
    assert events.seen == ["acquired 1", "fenced", "acquired 2"]


def test_losing_partition_0_revokes(neli: NeliCampaign, clock: ManualClock, events: Events) -> None:
    lead(neli, clock)
    neli.on_revoke([(TOPIC, 1)])
    assert neli.is_leader(), "another partition does not matter"
    neli.on_revoke(ZERO)
    assert not neli.is_leader() and not neli.assigned
    assert events.seen == ["acquired 1", "revoked"]
    neli.on_revoke(ZERO)
    assert events.seen == ["acquired 1", "revoked"]


def test_leaving_the_group_ends_leadership_at_once(neli: NeliCampaign, clock: ManualClock) -> None:
    assert neli.leave() is False
    lead(neli, clock)
    assert neli.leave() is True
    assert not neli.is_leader() and not neli.assigned and not neli.beat_due(clock.now + 10)


def test_topic_exists_is_recognised_by_its_error_code() -> None:
    assert topic_already_exists(
        KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "whatever it says"))
    )
    assert not topic_already_exists(
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "exists"))
    )
    assert not topic_already_exists(RuntimeError("Topic with this name already exists."))
