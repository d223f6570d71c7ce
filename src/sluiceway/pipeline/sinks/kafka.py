"""Kafka sink: produce in order, wait for every ack before the batch counts as written.

Who is at fault is told from librdkafka's error codes, here and only here (:func:`failure`): a
cluster that cannot be reached (transport errors, every broker down, deliveries timed out) or
refuses us (authentication, authorization) is the destination's fault, raised as
``DestinationUnreachable`` (the first waited out, the second final), so no record is blamed and
none is replayed one at a time; a record the broker refuses on its own merits (too large, an
invalid record) stays that record's error.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import DestinationUnreachable
from sluiceway.pipeline.sinks.base import ClientSink
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


@functools.cache
def _codes(names: tuple[str, ...]) -> frozenset[int]:
    """The codes of librdkafka's error names (worked out once: ``_refused`` asks while waiting)."""
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


#: Seconds a kept producer may sit unused before it is closed rather than taken again (a broker
#: may forget an idle producer id; a producer that old would only save its start-up anyway).
KEEP_IDLE = 60.0
#: Idle producers kept per configuration (one per task running at once in a process is enough).
KEEP_AT_MOST = 4


class _Kept:
    """A producer and where its error callback reports: the sink that holds it now."""

    __slots__ = ("idle_since", "producer", "report_to")

    def __init__(self) -> None:
        self.producer: Any = None
        self.report_to: Callable[[Any], None] | None = None
        self.idle_since = 0.0

    def error(self, err: Any) -> None:
        report = self.report_to
        if report is not None:
            report(err)


class _ProducerShelf:
    """Producers kept across writes in one process, per configuration.

    A task's writer is made for its batch and closed after it; a new idempotent producer waits
    about half a second for its producer id before it delivers anything, which cost every task of
    every micro-batch that long. Spark reuses its Python workers, so a writer takes a producer
    left by an earlier task of this process (every record it had was acknowledged: it is put back
    only after a flush that left nothing), and a failed write's producer is never put back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[tuple[str, str], ...], list[_Kept]] = {}
        # Closes producers idle past KEEP_IDLE, so that one kept after the last batch does not
        # stay connected (or keep retrying a broker gone away) for as long as the worker lives.
        self._sweeper: threading.Thread | None = None

    def take(self, key: tuple[tuple[str, str], ...]) -> _Kept | None:
        stale: list[_Kept] = []
        kept = None
        with self._lock:
            idle = self._idle.get(key, [])
            now = time.monotonic()
            while idle:
                candidate = idle.pop()
                if now - candidate.idle_since <= KEEP_IDLE:
                    kept = candidate
                    break
                stale.append(candidate)
        for old in stale:
            old.producer.flush(0)
        return kept

    def put(self, key: tuple[tuple[str, str], ...], kept: _Kept) -> None:
        kept.report_to = None
        kept.idle_since = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < KEEP_AT_MOST:
                idle.append(kept)
                if self._sweeper is None:
                    self._sweeper = threading.Thread(
                        target=self._sweep, name="sluice-kafka-kept", daemon=True
                    )
                    self._sweeper.start()
                return
        kept.producer.flush(0)

    def _sweep(self) -> None:
        while True:
            time.sleep(KEEP_IDLE / 4)
            with self._lock:
                now = time.monotonic()
                stale = [k for idle in self._idle.values() for k in idle if now - k.idle_since > KEEP_IDLE]
                for key in list(self._idle):
                    self._idle[key] = [k for k in self._idle[key] if k not in stale]
                    if not self._idle[key]:
                        del self._idle[key]
                done = not self._idle
                if done:
                    self._sweeper = None
            for old in stale:
                old.producer.flush(0)  # and dropped: its connections close with it
            if done:
                return


_SHELF = _ProducerShelf()


@functools.cache
def _client_log() -> Any:
    """One rate-limited librdkafka log for every producer of this process."""
    import logging

    from sluiceway.harvest.kafka import ClientLog

    return ClientLog(logging.getLogger("sluiceway.pipeline.kafka"))


class KafkaSink(ClientSink[Any]):
    def __init__(self, topic: str | None, config: dict[str, str]) -> None:
        self.topic = topic
        # Idempotent producer by default: broker-side retries cannot reorder or duplicate a key.
        self.config = {"enable.idempotence": "true", "linger.ms": "5", **config}
        self._key = tuple(sorted((str(k), str(v)) for k, v in self.config.items()))
        self._kept: _Kept | None = None
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

    def _open(self) -> Any:
        from confluent_kafka import Producer

        self._client_errors = []
        kept = _SHELF.take(self._key)
        if kept is None:
            kept = _Kept()
            # librdkafka's own log through Python's logging, a warning per 10 s at most (as the
            # harvester's clients), not a line per failed connection attempt on stderr; it is
            # delivered inside poll()/flush(), so a kept producer sitting idle prints nothing.
            kept.producer = Producer({"logger": _client_log(), **self.config, "error_cb": kept.error})
        kept.report_to = self._client_error
        self._kept = kept
        return kept.producer

    def _write(self, producer: Any, table: pa.Table, token: str) -> None:
        produce_table(producer, table, self.topic, give_up=self._refused)

    def _failure(self, exc: Exception) -> Exception | None:
        if not isinstance(exc, KafkaDeliveryError):
            return None
        with self._lock:
            seen = list(self._client_errors)
        return failure(exc, seen, self.config.get("bootstrap.servers", ""))

    def _discard(self, producer: Any) -> None:
        """A fresh producer after a failure: no stale queue, no fatal idempotence state (the
        write is retried whole). This one is not kept."""
        self._kept = None
        producer.purge()
        producer.flush(0)

    def _release(self, producer: Any) -> None:
        kept, self._kept = self._kept, None
        if producer.flush(5) == 0 and kept is not None and kept.producer is producer:
            _SHELF.put(self._key, kept)  # nothing left in it: the next writer here takes it
