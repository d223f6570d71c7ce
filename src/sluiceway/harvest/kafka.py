"""The Kafka adapter of the Publisher port (confluent-kafka / librdkafka).

Idempotent producer by default (user settings win). Key, value and headers exactly as in the row;
a NULL value publishes a tombstone. Errors the broker can never get past (record too large,
invalid topic) are reported as *permanent* so the engine can dead-letter them at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from sluiceway.errors import InvalidRecordError, PublishError
from sluiceway.harvest.ports import Delivery
from sluiceway.outbox.record import MarkedRecord, validate_topic

log = logging.getLogger("sluiceway.harvest.kafka")


def _permanent_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    names = (
        "MSG_SIZE_TOO_LARGE",
        "TOPIC_EXCEPTION",
        "RECORD_LIST_TOO_LARGE",
        "INVALID_RECORD",
        "_INVALID_ARG",
        "TOPIC_AUTHORIZATION_FAILED",
        "INVALID_REQUIRED_ACKS",
    )
    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


class PermanentPublishError(PublishError):
    permanent = True


class KafkaPublisher:
    """Publishes outbox records to Kafka. ``producers`` independent clients, chosen by key hash."""

    def __init__(self, config: dict[str, Any], *, producers: int = 1) -> None:
        from confluent_kafka import Producer

        self.config = dict(config)
        self._producers = [Producer(self.config) for _ in range(max(1, producers))]
        self._permanent = _permanent_codes()
        self._valid_topics: set[str] = set()
        self._closed = threading.Event()
        # librdkafka runs delivery callbacks inside poll(): one thread per client keeps them flowing.
        self._pollers = [
            threading.Thread(target=self._poll_loop, args=(p,), name=f"sluice-kafka-poll-{i}", daemon=True)
            for i, p in enumerate(self._producers)
        ]
        for t in self._pollers:
            t.start()
        # Connect and load topic metadata now, so the first records of a term do not wait for it.
        for p in self._producers:
            try:
                p.list_topics(timeout=5)
            except Exception as exc:  # the broker may be away: sends will wait for it anyway
                log.debug("metadata warm-up failed: %s", exc)

    def _poll_loop(self, producer: Any) -> None:
        while not self._closed.is_set():
            producer.poll(0.05)

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if record.topic not in self._valid_topics:
            try:
                validate_topic(record.topic)
            except InvalidRecordError as exc:
                raise PermanentPublishError(f"invalid topic {record.topic!r}: {exc.problem}") from exc
            self._valid_topics.add(record.topic)
        producer = self._producers[hash(record.key) % len(self._producers)]
        permanent = self._permanent

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                on_done(Delivery(record, partition=msg.partition(), offset=msg.offset()))
            else:
                on_done(
                    Delivery(record, error=f"{err.name()}: {err.str()}", permanent=err.code() in permanent)
                )

        kwargs: dict[str, Any] = {
            "key": record.key.encode("utf-8"),
            "value": record.value,
            "headers": list(record.headers) or None,
            "on_delivery": delivered,
        }
        if record.partition is not None:
            kwargs["partition"] = record.partition
        while True:
            try:
                producer.produce(record.topic, **kwargs)
                return
            except BufferError:
                # librdkafka's local queue is full: wait for deliveries to drain, then retry.
                producer.poll(0.05)
                if self._closed.is_set():
                    raise PublishError("publisher closed while its queue was full") from None
            except KafkaException as exc:
                err = exc.args[0]
                cls = PermanentPublishError if err.code() in permanent else PublishError
                raise cls(f"{err.name()}: {err.str()}") from exc

    def flush(self, timeout: float) -> int:
        return sum(p.flush(timeout) for p in self._producers)

    def close(self) -> None:
        self.flush(5.0)
        self._closed.set()
        for t in self._pollers:
            t.join(timeout=2)
