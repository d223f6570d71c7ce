"""Kafka sink: produce in order, wait for every ack before the batch counts as written.

Who is at fault is told from librdkafka's error codes, here and only here (:func:`failure`): a
cluster that cannot be reached (transport errors, every broker down, deliveries timed out) or
refuses us (authentication, authorization) is the destination's fault, raised as
``DestinationUnreachable`` (the first waited out, the second final), so no record is blamed and
none is replayed one at a time; a record the broker refuses on its own merits (too large, an
invalid record) stays that record's error.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.sources.kafka import KafkaDeliveryError, produce_table

#: The cluster is away, for now: librdkafka gave up waiting for it.
_AWAY = (
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_MSG_TIMED_OUT",
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "_RESOLVE",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "BROKER_NOT_AVAILABLE",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
)
#: The cluster refuses us: waiting will not help.
_REFUSED = (
    "_AUTHENTICATION",
    "SASL_AUTHENTICATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
)


def _codes(names: tuple[str, ...]) -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, name) for name in names if hasattr(KafkaError, name))


def _words(err: Any) -> str:
    return f"{err.name()}: {err.str()}"


def failure(exc: KafkaDeliveryError, client_errors: list[Any], servers: str) -> Exception:
    """What a failed write raises: ``exc`` (a record's error) or a ``DestinationUnreachable``.
    ``client_errors``: the ``KafkaError`` s librdkafka reported on the connection meanwhile."""
    refused, away = _codes(_REFUSED), _codes(_AWAY)
    where = f"kafka {servers}"
    for err in [exc.error, *client_errors]:
        if err is not None and err.code() in refused:
            return DestinationUnreachable(f"{where}: {_words(err)}", permanent=True)
    err = exc.error
    if err is not None and err.code() in away:
        return DestinationUnreachable(f"{where}: {_words(err)}")
    if err is None and exc.remaining:
        last = f" (last client error: {_words(client_errors[-1])})" if client_errors else ""
        return DestinationUnreachable(f"{where}: {exc.remaining} records not acknowledged{last}")
    return exc


class KafkaSink:
    def __init__(self, topic: str | None, config: dict[str, str]) -> None:
        self.topic = topic
        # Idempotent producer by default: broker-side retries cannot reorder or duplicate a key.
        self.config = {"enable.idempotence": "true", "linger.ms": "5", **config}
        self._producer: Any = None
        # What librdkafka reports about the connection (its error callback runs inside flush()).
        self._client_errors: list[Any] = []
        self._lock = threading.Lock()

    def _client_error(self, err: Any) -> None:
        with self._lock:
            self._client_errors = [*self._client_errors[-9:], err]

    def _refused(self) -> bool:
        refused = _codes(_REFUSED)
        with self._lock:
            return any(err.code() in refused for err in self._client_errors)

    def write(self, table: pa.Table, token: str) -> None:
        if self._producer is None:
            from confluent_kafka import Producer

            self._client_errors = []
            self._producer = Producer({**self.config, "error_cb": self._client_error})
        try:
            produce_table(self._producer, table, self.topic, give_up=self._refused)
        except KafkaDeliveryError as exc:
            self._discard()
            with self._lock:
                seen = list(self._client_errors)
            raise failure(exc, seen, self.config.get("bootstrap.servers", "")) from exc
        except BaseException:
            self._discard()  # a fresh producer after a failure: no stale queue, no fatal idempotence state
            raise

    def _discard(self) -> None:
        """Drop the producer and what it still holds (the write is retried whole)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.flush(0)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
