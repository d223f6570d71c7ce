"""librdkafka's log and error callbacks are rate-limited: one warning line per interval, with a count
of what was held back, on an injected clock (no broker, no sleeping)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from sluiceway.harvest.kafka import ClientLog

REFUSED = "[thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed: Connection refused"


@dataclass
class FakeKafkaError:
    code_name: str
    text: str
    is_fatal: bool = False

    def name(self) -> str:
        return self.code_name

    def str(self) -> str:
        return self.text

    def fatal(self) -> bool:
        return self.is_fatal


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client_log(clock: Clock) -> ClientLog:
    return ClientLog(logging.getLogger("test.kafka"), interval=10.0, clock=clock)


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.kafka" and r.levelno >= level]


def test_one_warning_per_interval_with_a_count_of_what_was_held_back(
    client_log: ClientLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    line = f"librdkafka: FAIL [rdkafka#producer-1] {REFUSED}"
    for _ in range(40):  # 10 s of failed connection attempts, one every 250 ms
        client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)
        clock.now += 0.25
    assert lines(caplog) == [line]
    client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", REFUSED)  # 10 s later
    assert lines(caplog) == [line, f"{line} (and 39 more held back since the last warning)"]


def test_error_callbacks_share_the_interval_with_log_lines(
    client_log: ClientLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client_log.error(FakeKafkaError("_TRANSPORT", REFUSED))
    client_log.error(FakeKafkaError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
    client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-2", REFUSED)
    assert lines(caplog) == [f"Kafka client error: _TRANSPORT: {REFUSED}"]
    clock.now += 10.0
    client_log.error(FakeKafkaError("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
    assert lines(caplog)[-1] == (
        "Kafka client error: _ALL_BROKERS_DOWN: 1/1 brokers are down"
        " (and 2 more held back since the last warning)"
    )


def test_fatal_errors_are_never_held_back(client_log: ClientLog, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    client_log.error(FakeKafkaError("_TRANSPORT", REFUSED))
    client_log.error(FakeKafkaError("_FENCED", "producer fenced", is_fatal=True))
    assert lines(caplog, logging.ERROR) == ["Kafka client fatal error: _FENCED: producer fenced"]


def test_chatter_below_warning_goes_to_debug_unlimited(
    client_log: ClientLog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for i in range(3):
        client_log.log(logging.INFO, "%s [%s] %s", "CONNECT", "rdkafka#producer-1", f"attempt {i}")
    assert lines(caplog, logging.WARNING) == []
    assert lines(caplog, logging.DEBUG) == [
        f"librdkafka: CONNECT [rdkafka#producer-1] attempt {i}" for i in range(3)
    ]


def test_flush_reports_what_is_still_held_back(
    client_log: ClientLog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client_log.flush()
    for _ in range(5):
        client_log.error(FakeKafkaError("_TRANSPORT", REFUSED))
    client_log.flush()
    client_log.flush()
    assert lines(caplog)[1:] == ["4 more Kafka client warnings held back since the last one"]


def test_apply_adds_the_callbacks_without_overriding_the_users(client_log: ClientLog) -> None:
    config = client_log.apply({"bootstrap.servers": "127.0.0.1:1"})
    assert config == {"bootstrap.servers": "127.0.0.1:1", "logger": client_log, "error_cb": client_log.error}
    own = logging.getLogger("mine")
    assert client_log.apply({"logger": own})["logger"] is own
