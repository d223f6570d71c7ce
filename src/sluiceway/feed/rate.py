"""Rate limits: token buckets kept in the database, shared by every worker of a feed.

A limit is a row of ``<prefix>rates``: ``max_rate`` tokens a second flow into a bucket that holds
at most ``burst``; a worker takes one token per item *before* it claims the item, and gives back
what its claim did not use. A bucket belongs to the whole feed (``attribute`` and ``value`` empty)
or to the partitions whose ``attributes[attribute]`` is ``value`` (say every partition of tenant
``acme``); an item needs a token from every bucket its partition matches.

Why it is shaped so:

* **Token bucket, not windows.** A fixed window lets twice the rate through across a window's
  edge, and a sliding window needs a row (or a count) per claim. A bucket is one row per limit,
  updated once per take, and it gives the one bound we promise: over any interval of ``T``
  seconds, at most ``burst + max_rate · T`` items are claimed under a limit, whatever the number
  of workers — a token is taken, under the row's lock, before its item can be claimed.
* **The arithmetic is here, the clock is the database's.** The store reads the bucket and the
  database's now under a row lock; :func:`refill` and :func:`grant` decide; the store writes the
  result back in the same transaction. Skewed worker clocks therefore do not matter.
* **A rate-limited worker sleeps, it does not spin**: :func:`grant` says when the next token is
  due (from the bucket's level and rate), and the worker rests until then.
* Tokens taken and not used (the claim found fewer items) are given back; a worker that dies
  between the take and the give-back loses them — the safe direction (fewer, never more).

>>> refill(tokens=0.0, burst=10.0, max_rate=20.0, elapsed=0.2)
4.0
>>> grant(have=4.0, want=10, max_rate=20.0)
Grant(taken=4, left=0.0, wait=None)
>>> grant(have=0.5, want=10, max_rate=20.0)
Grant(taken=0, left=0.5, wait=0.025)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluiceway.feed.errors import FeedError

#: Longest attribute name and value a limit may be keyed by (the value column is VARCHAR(255)).
MAX_ATTRIBUTE = 64
MAX_VALUE = 255


@dataclass(frozen=True, slots=True, order=True)
class RateKey:
    """Which bucket: the whole feed (both empty, :data:`FEED`) or one attribute's value."""

    attribute: str = ""
    value: str = ""

    @property
    def whole_feed(self) -> bool:
        return not self.attribute

    def __str__(self) -> str:
        return "the whole feed" if self.whole_feed else f"{self.attribute}={self.value}"


#: The bucket of the whole feed.
FEED = RateKey()


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A limit as ``Feed.rates()`` and ``status`` show it: ``tokens`` is the bucket's level now
    (by the database clock)."""

    key: RateKey
    max_rate: float
    burst: float
    tokens: float

    @property
    def attribute(self) -> str | None:
        return self.key.attribute or None

    @property
    def value(self) -> str | None:
        return None if self.key.whole_feed else self.key.value


@dataclass(frozen=True, slots=True)
class Grant:
    """What one take gives: ``taken`` tokens, ``left`` in the bucket, and — when it gave none —
    ``wait`` seconds until the next token is due."""

    taken: int
    left: float
    wait: float | None


def refill(tokens: float, burst: float, max_rate: float, elapsed: float) -> float:
    """The bucket's level ``elapsed`` seconds after it held ``tokens`` (never above ``burst``;
    a negative ``elapsed`` — another worker's later write seen first — adds nothing)."""
    return min(burst, tokens + max_rate * max(0.0, elapsed))


def grant(have: float, want: int, max_rate: float) -> Grant:
    """Take up to ``want`` whole tokens out of ``have``; with none to give, say when one is due."""
    taken = max(0, min(want, math.floor(have + 1e-9)))
    if taken > 0:
        return Grant(taken, max(0.0, have - taken), None)
    return Grant(0, have, max(0.0, (1.0 - have) / max_rate))


def attribute_value(value: object) -> str:
    """An attribute's value as limits key it: text as it is, anything else as compact JSON
    (``5`` → ``"5"``, ``true`` → ``"true"``)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def keys_for(attributes: Mapping[str, Any], limits: Iterable[RateKey]) -> tuple[RateKey, ...]:
    """The buckets an item of a partition with ``attributes`` takes a token from, in one order
    (sorted: the whole feed first), so takes of several buckets never lock them crosswise."""
    return tuple(
        sorted(
            key
            for key in limits
            if key.whole_feed
            or (key.attribute in attributes and attribute_value(attributes[key.attribute]) == key.value)
        )
    )


def check_limit(
    max_rate: object, burst: object, attribute: object, value: object
) -> tuple[RateKey, float, float]:
    """Validate ``Feed.set_rate``'s arguments; the burst defaults to one second's worth (at least 1)."""
    if isinstance(max_rate, bool) or not isinstance(max_rate, int | float) or not math.isfinite(max_rate):
        raise FeedError(f"max_rate must be a number of items per second, not {max_rate!r}")
    if max_rate <= 0:
        raise FeedError(f"max_rate must be positive (clear_rate removes a limit), not {max_rate!r}")
    chosen = max(1.0, float(max_rate)) if burst is None else burst
    if (
        isinstance(chosen, bool)
        or not isinstance(chosen, int | float)
        or not math.isfinite(chosen)
        or chosen < 1
    ):
        raise FeedError(f"burst must be a number >= 1 (a bucket must hold a whole token), not {burst!r}")
    return rate_key(attribute, value), float(max_rate), float(chosen)


def rate_key(attribute: object, value: object) -> RateKey:
    """The key for ``attribute``/``value`` (both None: the whole feed), validated."""
    if attribute is None and value is None:
        return FEED
    if not isinstance(attribute, str) or not 1 <= len(attribute) <= MAX_ATTRIBUTE:
        raise FeedError(
            f"a limit's attribute must be a non-empty name of at most {MAX_ATTRIBUTE} characters, "
            f"not {attribute!r}"
        )
    if value is None:
        raise FeedError(f"a limit on attribute {attribute!r} needs the value it applies to")
    text = attribute_value(value)
    if len(text) > MAX_VALUE:
        raise FeedError(f"a limit's value must be at most {MAX_VALUE} characters, not {text[:40]!r}…")
    return RateKey(attribute, text)
