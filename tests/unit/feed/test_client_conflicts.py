"""add_many goes again when the database rolled its transaction back for a conflict (a typed
error), and only then: an error's text never decides."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluiceway import DatabaseError, DeadlockError
from sluiceway.feed import Feed, PartitionExistsError


@pytest.fixture
def feed() -> Iterator[Feed]:
    with Feed("sqlite:///:memory:") as f:
        yield f


def failing_first(feed: Feed, monkeypatch: pytest.MonkeyPatch, *errors: DatabaseError) -> list[int]:
    """Make the first ``len(errors)`` attempts of add_many's transaction raise; count attempts."""
    real = feed._add_many
    attempts: list[int] = []

    def attempt(*args: Any) -> list[int]:
        attempts.append(1)
        if len(attempts) <= len(errors):
            raise errors[len(attempts) - 1]
        return real(*args)

    monkeypatch.setattr(feed, "_add_many", attempt)
    return attempts


def test_a_deadlock_victim_goes_again(feed: Feed, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = failing_first(feed, monkeypatch, DeadlockError("add: deadlock", code="1213"))
    assert feed.add("p", [b"x"]) == 1
    assert len(attempts) == 2


def test_conflicts_are_retried_twice_at_most(feed: Feed, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_first(feed, monkeypatch, *(DeadlockError("add: deadlock", code="40P01") for _ in range(3)))
    with pytest.raises(DeadlockError):
        feed.add("p", [b"x"])
    assert feed.partition("p") is None


def test_an_error_that_only_mentions_a_deadlock_is_not_retried(
    feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = failing_first(feed, monkeypatch, DatabaseError("add: IntegrityError: 'deadlock-7' exists"))
    with pytest.raises(DatabaseError, match="deadlock-7"):
        feed.add("deadlock-7", [b"x"])
    assert len(attempts) == 1


def test_a_name_taken_meanwhile_is_reported_as_such(feed: Feed, monkeypatch: pytest.MonkeyPatch) -> None:
    feed.add("p", [b"x"])
    failing_first(feed, monkeypatch, DatabaseError("add: IntegrityError: unique", code="23505"))
    with pytest.raises(PartitionExistsError):
        feed.add("p", [b"y"])
