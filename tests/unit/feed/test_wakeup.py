"""Wake-up options and naming, without a database (the behaviour is in
tests/integration/feed/test_wakeups.py, on a real PostgreSQL)."""

from __future__ import annotations

import pytest

from sluiceway.db import Dialect, Listener, load_queries, parse_dsn
from sluiceway.db.identifiers import MAX_NAME_BYTES as MAX_CHANNEL
from sluiceway.errors import ConfigError
from sluiceway.feed import FeedError, FeedWorker
from sluiceway.feed.store import FeedStore, wake_channel

PG = "postgresql://app@127.0.0.1:5432/app"


def done(item: object) -> dict[str, bool]:
    return {"done": True}


def test_the_channel_is_named_from_the_prefix_and_always_fits() -> None:
    assert wake_channel("feed_") == "feed_wakeup"
    assert wake_channel("ops.q_") == "ops.q_wakeup"
    long_schema = "s" * 63 + "."
    a, b = wake_channel(long_schema + "a_"), wake_channel(long_schema + "b_")
    assert len(a) <= MAX_CHANNEL and len(b) <= MAX_CHANNEL
    assert a != b  # distinct feeds keep distinct channels
    assert a == wake_channel(long_schema + "a_")  # producers and workers agree
    with pytest.raises(ConfigError):
        wake_channel('x"; NOTIFY y; --')


def test_the_channel_is_bound_in_notify_and_quoted_in_listen() -> None:
    # NOTIFY takes the channel as a value: nothing from configuration is pasted into its SQL.
    assert "%(channel)s" in load_queries("sluiceway.feed", Dialect.POSTGRES)["notify"]

    class FakeDb:
        dialect = Dialect.POSTGRES

    store = FeedStore(FakeDb(), "ops.q_")  # type: ignore[arg-type]
    assert store.q["listen"] == 'LISTEN "ops.q_wakeup"'
    assert store.notifies


def test_wake_ups_are_on_by_default_on_postgresql_only() -> None:
    assert FeedWorker(PG, done).wake_ups
    assert not FeedWorker(PG, done, wake_ups=False).wake_ups
    assert not FeedWorker("sqlite:///:memory:", done).wake_ups
    assert not FeedWorker("mysql://root@127.0.0.1:3306/app", done).wake_ups


def test_asking_for_wake_ups_elsewhere_is_a_clear_error() -> None:
    with pytest.raises(FeedError, match="wake_ups need PostgreSQL"):
        FeedWorker("sqlite:///:memory:", done, wake_ups=True)
    with pytest.raises(FeedError, match="fallback_poll"):
        FeedWorker(PG, done, fallback_poll=0)
    with pytest.raises(ConfigError, match="LISTEN/NOTIFY needs PostgreSQL"):
        Listener(parse_dsn("sqlite:///:memory:"), ["SELECT 1"])


@pytest.mark.timeout(5)
def test_an_interrupt_ends_a_sleep_and_is_harmless_after_close() -> None:
    listener = Listener(parse_dsn(PG), [])
    listener.interrupt()
    listener.sleep(30)  # returns at once: the interrupt came first (a stop before the rest)
    listener.close()
    listener.interrupt()  # closed: nothing to wake, no error
