"""The token bucket's arithmetic and a limit's keys, without a database or a clock."""

from __future__ import annotations

import pytest

from sluiceway.feed import FeedError
from sluiceway.feed.rate import FEED, Grant, RateKey, attribute_value, check_limit, grant, keys_for, refill


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    assert refill(tokens=0.0, burst=10.0, max_rate=20.0, elapsed=0.25) == 5.0
    assert refill(tokens=8.0, burst=10.0, max_rate=20.0, elapsed=1.0) == 10.0  # never above burst
    # Another worker's later write read first (elapsed < 0): nothing added, nothing taken away.
    assert refill(tokens=3.0, burst=10.0, max_rate=20.0, elapsed=-0.5) == 3.0


def test_a_take_gives_whole_tokens_and_says_when_the_next_one_is_due() -> None:
    assert grant(have=7.6, want=5, max_rate=2.0) == Grant(taken=5, left=pytest.approx(2.6), wait=None)
    assert grant(have=3.5, want=10, max_rate=2.0) == Grant(taken=3, left=pytest.approx(0.5), wait=None)
    # None to give: the wait is the time to the next whole token, from the level and the rate.
    assert grant(have=0.25, want=10, max_rate=2.0) == Grant(taken=0, left=0.25, wait=0.375)
    assert grant(have=0.0, want=1, max_rate=20.0).wait == pytest.approx(0.05)
    # A level a hair below a whole token (float arithmetic) is that token.
    assert grant(have=0.9999999999, want=1, max_rate=1.0).taken == 1


def test_over_any_interval_a_bucket_gives_at_most_burst_plus_rate_times_the_interval() -> None:
    # Greedy takers every 10 ms for 3 s, starting from a full bucket: the bound, and no less.
    burst, rate, tokens, given = 5.0, 20.0, 5.0, 0
    for _ in range(300):
        tokens = refill(tokens, burst, rate, 0.01)
        taken = grant(tokens, 100, rate)
        tokens, given = taken.left, given + taken.taken
    assert burst + rate * 3.0 - 1 <= given <= burst + rate * 3.0


def test_a_partition_takes_from_the_feed_bucket_and_from_every_attribute_it_matches() -> None:
    acme, eu, other = RateKey("tenant", "acme"), RateKey("region", "eu"), RateKey("tenant", "globex")
    limits = {FEED, acme, eu, other}
    assert keys_for({"tenant": "acme", "region": "eu"}, limits) == (FEED, eu, acme)  # sorted
    assert keys_for({"tenant": "initech"}, limits) == (FEED,)
    assert keys_for({"tenant": "acme"}, {acme}) == (acme,)
    assert keys_for({}, {acme, eu}) == ()
    # Values other than text are keyed as compact JSON.
    assert keys_for({"shard": 5}, {RateKey("shard", "5")}) == (RateKey("shard", "5"),)
    assert attribute_value(True) == "true"
    assert attribute_value({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


def test_limits_are_validated_and_the_burst_defaults_to_one_seconds_worth() -> None:
    assert check_limit(50, None, None, None) == (FEED, 50.0, 50.0)
    assert check_limit(0.2, None, "tenant", "acme") == (RateKey("tenant", "acme"), 0.2, 1.0)
    assert check_limit(5, 12, "shard", 3) == (RateKey("shard", "3"), 5.0, 12.0)
    for bad in (
        (0, None, None, None),
        (-1, None, None, None),
        (float("inf"), None, None, None),
        (True, None, None, None),
        ("5", None, None, None),
        (5, 0.5, None, None),
        (5, None, "tenant", None),
        (5, None, "", "acme"),
        (5, None, "x" * 65, "acme"),
        (5, None, "tenant", "v" * 256),
    ):
        with pytest.raises(FeedError):
            check_limit(*bad)
