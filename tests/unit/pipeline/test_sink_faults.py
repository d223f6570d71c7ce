"""Who is at fault when a sink's write fails, told from the clients' codes: the destination (no
record blamed, no replay; permanent or waited out) or a record (replayed to find it). Real error
objects of each client, no I/O."""

from __future__ import annotations

import errno
import os

import pytest
from confluent_kafka import KafkaError

from sluiceway.config.brokers import RedisSettings
from sluiceway.errors import BrokerError
from sluiceway.pipeline.errors import DestinationUnreachable, file_system_fault
from sluiceway.pipeline.sinks.brokers import write_failure
from sluiceway.pipeline.sinks.kafka import failure
from sluiceway.pipeline.sources.kafka import KafkaDeliveryError

REDIS = RedisSettings(url="redis://127.0.0.1:6399/0")


# --- broker sinks: the adapters' own retriable / permanent flags decide ---------------------------
def test_a_broker_away_for_the_whole_delivery_timeout_is_the_destinations_fault() -> None:
    lost = BrokerError("redis", "publish", "cannot connect: Error 111 connecting", retriable=True)
    behind = BrokerError("redis", "publish", "not sent: an earlier message of key 'k' failed")
    raised = write_failure(REDIS, [behind, lost], 0)
    assert isinstance(raised, DestinationUnreachable) and not raised.permanent
    assert raised.problem == "redis redis://127.0.0.1:6399/0: cannot connect: Error 111 connecting"


def test_a_message_the_broker_refuses_on_its_merits_stays_a_record_error() -> None:
    lost = BrokerError("redis", "publish", "cannot connect", retriable=True)
    too_big = BrokerError("nats", "publish", "maximum payload exceeded", permanent=True)
    assert write_failure(REDIS, [lost, too_big], 0) is too_big


def test_messages_left_unacknowledged_are_the_destinations_fault() -> None:
    raised = write_failure(REDIS, [], 3)
    assert isinstance(raised, DestinationUnreachable) and not raised.permanent
    assert "3 messages not acknowledged" in raised.problem


# --- kafka: librdkafka's codes ---------------------------------------------------------------------
def delivery(code: int | None, remaining: int = 0) -> KafkaDeliveryError:
    return KafkaDeliveryError(
        "kafka delivery failed", error=None if code is None else KafkaError(code), remaining=remaining
    )


@pytest.mark.parametrize(
    "code", [KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN]
)
def test_a_kafka_cluster_out_of_reach_is_waited_for(code: int) -> None:
    raised = failure(delivery(code), [], "127.0.0.1:9092")
    assert isinstance(raised, DestinationUnreachable) and not raised.permanent
    assert raised.problem.startswith(f"kafka 127.0.0.1:9092: {KafkaError(code).name()}")


def test_a_failed_kafka_login_is_final_even_when_only_the_client_said_so() -> None:
    timed_out = delivery(KafkaError._MSG_TIMED_OUT)
    auth = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: wrong password")
    raised = failure(timed_out, [auth], "b:9092")
    assert isinstance(raised, DestinationUnreachable) and raised.permanent
    assert raised.problem == "kafka b:9092: _AUTHENTICATION: SASL authentication error: wrong password"


def test_nothing_acknowledged_names_the_last_client_error() -> None:
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    raised = failure(delivery(None, remaining=5), [down], "b:9092")
    assert isinstance(raised, DestinationUnreachable) and not raised.permanent
    assert (
        raised.problem == "kafka b:9092: 5 records not acknowledged "
        "(last client error: _ALL_BROKERS_DOWN: 1/1 brokers are down)"
    )


def test_a_record_too_large_for_kafka_stays_a_record_error() -> None:
    too_big = delivery(KafkaError.MSG_SIZE_TOO_LARGE)
    assert failure(too_big, [KafkaError(KafkaError._TRANSPORT)], "b:9092") is too_big


# --- files: errno decides ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "permanent"),
    [
        (errno.ENOSPC, False),
        (errno.EDQUOT, False),
        (errno.EACCES, True),
        (errno.EPERM, True),
        (errno.EROFS, True),
    ],
)
def test_a_file_system_at_fault_is_the_destinations_fault(code: int, permanent: bool) -> None:
    fault = file_system_fault(OSError(code, "whatever the text says", "/lake/part-1.parquet"), "/lake")
    assert fault is not None and fault.permanent is permanent
    assert fault.problem == f"/lake/part-1.parquet: {os.strerror(code)}"


def test_a_file_system_fault_is_found_behind_a_wrapping_error() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("append failed") from exc
    except RuntimeError as wrapped:
        fault = file_system_fault(wrapped, "/data/journal")
    assert fault is not None and fault.problem == f"/data/journal: {os.strerror(errno.ENOSPC)}"


@pytest.mark.parametrize(
    "exc", [OSError(errno.ENOTDIR, "Not a directory"), ValueError("bad value"), OSError("no errno")]
)
def test_other_errors_are_not_the_file_systems_fault(exc: Exception) -> None:
    assert file_system_fault(exc, "/lake") is None
