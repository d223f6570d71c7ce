"""The Kafka adapter of the Publisher port (confluent-kafka / librdkafka).

Idempotent producer by default (user settings win). Key, value and headers exactly as in the row;
a NULL value publishes a tombstone. Errors the broker can never get past (record too large,
invalid topic) are reported as *permanent* so the engine can dead-letter them at once.
librdkafka's own log and errors reach ``logging`` through :class:`ClientLog`, rate-limited.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from sluiceway.db.failures import classify
from sluiceway.errors import InvalidRecordError, Permanent, PublishError
from sluiceway.harvest.ports import ColumnsDone, Delivery
from sluiceway.outbox.record import MarkedRecord, RecordColumns, validate_topic

log = logging.getLogger("sluiceway.harvest.kafka")

_new_tuple = tuple.__new__


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


class FatalPublishError(PublishError):
    fatal = True


class ClientLog:
    """librdkafka's log and error callbacks, at most one warning line per ``interval`` seconds.

    With its broker unreachable, librdkafka reports every failed connection attempt, every few
    milliseconds, from each client a harvester keeps (the term's publisher, a warm spare, NELI's
    consumer and producer). One ClientLog serves all the clients of a harvester: the first
    problem of an interval is logged at once, the others are only counted, and the next line
    says how many were held back. Fatal errors are never held back; librdkafka's messages below
    warning level go to DEBUG. Give it to a client with :meth:`apply`.
    """

    def __init__(
        self,
        logger: logging.Logger = log,
        *,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_line: float | None = None  # clock time of the last warning written
        self._held = 0  # warnings held back since then

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with this log as its ``logger`` and ``error_cb`` (unless it sets its own)."""
        return {"logger": self, "error_cb": self.error, **config}

    def log(self, level: int, msg: str, *args: Any) -> None:
        """confluent-kafka's ``logger`` interface; it calls this from ``poll()``."""
        text = msg % args if args else msg
        if level < logging.WARNING:
            self.logger.debug("librdkafka: %s", text)
        else:
            self._warn(f"librdkafka: {text}")

    def error(self, err: Any) -> None:
        """confluent-kafka's ``error_cb``: a ``KafkaError``."""
        if err.fatal():
            self.logger.error("Kafka client fatal error: %s: %s", err.name(), err.str())
        else:
            self._warn(f"Kafka client error: {err.name()}: {err.str()}")

    def flush(self) -> None:
        """Report the count of warnings still held back (at shutdown)."""
        with self._lock:
            held, self._held = self._held, 0
        if held:
            self.logger.warning("%d more Kafka client warnings held back since the last one", held)

    def _warn(self, text: str) -> None:
        with self._lock:
            now = self._clock()
            if self._last_line is not None and now - self._last_line < self.interval:
                self._held += 1
                return
            held, self._held, self._last_line = self._held, 0, now
        if held:
            self.logger.warning("%s (and %d more held back since the last warning)", text, held)
        else:
            self.logger.warning("%s", text)


#: librdkafka's idempotent producer asks for its producer id on a 500 ms timer when it starts
#: before its broker connection is up (always, for a new client): until then nothing is delivered.
IDEMPOTENT_WARM_UP = 0.6


class KafkaPublisher:
    """Publishes outbox records to Kafka. ``producers`` independent clients, chosen by key hash."""

    #: ``send`` only queues the record in librdkafka (it waits only while that queue is full): the
    #: engine calls it from the dispatching thread, with no send threads between.
    inline = True

    def __init__(self, config: dict[str, Any], *, producers: int = 1) -> None:
        from confluent_kafka import Producer

        self.created = time.monotonic()
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
        _id, _created, topic, key, value, headers, _leader, partition = record
        if topic not in self._valid_topics:
            try:
                validate_topic(topic)
            except InvalidRecordError as exc:
                raise PermanentPublishError(f"invalid topic {topic!r}: {exc.problem}") from exc
            self._valid_topics.add(topic)
        producers = self._producers
        producer = producers[0] if len(producers) == 1 else producers[hash(key) % len(producers)]
        permanent = self._permanent

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                # Delivery(record, partition=…, offset=…), built without the keyword call: once a record.
                on_done(_new_tuple(Delivery, (record, None, False, msg.partition(), msg.offset(), False)))
            else:
                on_done(
                    Delivery(
                        record,
                        error=f"{err.name()}: {err.str()}",
                        permanent=err.code() in permanent,
                        fatal=err.fatal(),
                    )
                )

        raw_key = key.encode("utf-8")
        listed: list[tuple[str, str | bytes | None]] | None = list(headers) if headers else None
        while True:
            try:
                # Positional where produce() allows it: a keyword dict per record costs 0.3 µs.
                if partition is None:
                    producer.produce(topic, value, raw_key, on_delivery=delivered, headers=listed)
                else:
                    producer.produce(topic, value, raw_key, partition, on_delivery=delivered, headers=listed)
                return
            except BufferError:
                # librdkafka's local queue is full: wait for deliveries to drain, then retry.
                producer.poll(0.05)
                if self._closed.is_set():
                    raise PublishError("publisher closed while its queue was full") from None
            except KafkaException as exc:
                err = exc.args[0]
                cls = (
                    FatalPublishError
                    if err.fatal()
                    else PermanentPublishError
                    if err.code() in permanent
                    else PublishError
                )
                raise cls(f"{err.name()}: {err.str()}") from exc

    def send_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        """The records of ``columns`` in order, one delivery callback object for all of them (see
        :class:`_ColumnsReport`); the port's rules for ``send_columns``."""
        topics, keys, values, headers = columns.topics, columns.keys, columns.values, columns.headers
        for topic in set(topics) - self._valid_topics:
            try:
                validate_topic(topic)
            except InvalidRecordError as exc:
                raise PermanentPublishError(f"invalid topic {topic!r}: {exc.problem}") from exc
            self._valid_topics.add(topic)
        report = _ColumnsReport(columns, done, self._permanent)
        producers = self._producers
        one = producers[0] if len(producers) == 1 else None
        for i in range(len(topics)):
            key = keys[i]
            producer = one or producers[hash(key) % len(producers)]
            while True:
                try:
                    # str keys go in as UTF-8 without an encode() of ours; -1: the key's partition.
                    producer.produce(topics[i], values[i], key, -1, report, headers=headers[i])  # type: ignore[arg-type]
                    break
                except BufferError:
                    producer.poll(0.05)
                    if self._closed.is_set():
                        raise PublishError("publisher closed while its queue was full") from None
                except KafkaException as exc:
                    err = exc.args[0]
                    if err.code() not in self._permanent or err.fatal():
                        cls = FatalPublishError if err.fatal() else PublishError
                        raise cls(f"{err.name()}: {err.str()}") from exc
                    error = f"{err.name()}: {err.str()}"
                    done.failed(i, Delivery(columns.record(i), error=error, permanent=True))
                    break

    def wait_ready(self) -> None:
        """Block until a new client can deliver (its idempotent producer id is assigned)."""
        if str(self.config.get("enable.idempotence", "false")).lower() in ("true", "1"):
            remaining = self.created + IDEMPOTENT_WARM_UP - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)

    def flush(self, timeout: float) -> int:
        return sum(p.flush(timeout) for p in self._producers)

    def close(self) -> None:
        self.flush(5.0)
        for p in self._producers:
            # What is still queued (the broker is away) must not go out later, behind the records
            # the next leader re-sends: it fails now, and its rows stay for that leader.
            p.purge(in_queue=True, in_flight=False)
            p.poll(0)  # their delivery reports (failed: purged)
        self._closed.set()
        for t in self._pollers:
            t.join(timeout=2)


class _ColumnsReport:
    """The delivery callback of every message of one ``send_columns`` call: a success is one
    count for ``done.acked``; a failure is traced back to its record (a delivery report carries
    the topic, key and value, not the headers) for ``done.failed``."""

    __slots__ = ("acked", "columns", "done", "permanent")

    def __init__(self, columns: RecordColumns, done: ColumnsDone, permanent: frozenset[int]) -> None:
        self.columns, self.done, self.permanent = columns, done, permanent
        self.acked = done.acked

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked(1)
            return
        key = msg.key()
        index = self.columns.index_of(msg.topic(), key.decode() if key is not None else "", msg.value())
        delivery = Delivery(
            self.columns.record(index),
            error=f"{err.name()}: {err.str()}",
            permanent=err.code() in self.permanent,
            fatal=err.fatal(),
        )
        self.done.failed(index, delivery)


class SparePublishers:
    """Hands each leadership term a fresh, already-warm KafkaPublisher.

    A standby harvester keeps one spare client connected, so when it becomes the leader it can
    publish at once. The spare is replaced every ``refresh`` seconds and after every term, so a
    client never carries state across a broker outage or a long idle period (a broker forgets
    idle producer ids); each term's client is closed at the end of the term.
    """

    def __init__(self, config: dict[str, Any], *, refresh: float = 20.0) -> None:
        self.config = config
        self.refresh = refresh
        self._cv = threading.Condition()
        self._spare: KafkaPublisher | None = None
        self._spare_born = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._wanted = False

    def prepare(self) -> None:
        """Keep a warm spare from now on (idempotent)."""
        with self._cv:
            self._wanted = True
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._keeper, name="sluice-kafka-spare", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _keeper(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(
                    lambda: (
                        self._closed
                        or (
                            self._wanted
                            and (self._spare is None or time.monotonic() - self._spare_born > self.refresh)
                        )
                    ),
                    timeout=1.0,
                )
                if self._closed:
                    return
                if not self._wanted or (
                    self._spare is not None and time.monotonic() - self._spare_born <= self.refresh
                ):
                    continue
                stale, self._spare = self._spare, None
            if stale is not None:
                stale.close()
            try:
                fresh = KafkaPublisher(self.config)
            except Exception:
                log.warning("could not create a spare Kafka client", exc_info=True)
                fresh = None
            with self._cv:
                if fresh is not None and not self._closed and self._spare is None:
                    self._spare, self._spare_born = fresh, fresh.created
                    fresh = None
                self._cv.notify_all()
            if fresh is not None:
                fresh.close()

    def take(self, epoch: int = 0) -> KafkaPublisher:
        with self._cv:
            publisher, self._spare = self._spare, None
            self._cv.notify_all()  # the keeper warms the next one
        if publisher is None:
            publisher = KafkaPublisher(self.config)
        publisher.wait_ready()
        return publisher

    def discard(self) -> None:
        """Drop the spare (e.g. after an outage); a new one is warmed."""
        with self._cv:
            stale, self._spare = self._spare, None
            self._cv.notify_all()
        if stale is not None:
            stale.close()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            spare, self._spare = self._spare, None
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(15)
        if spare is not None:
            spare.close()


#: librdkafka settings an admin client refuses or warns about (a producer's, a consumer's).
_NOT_FOR_ADMIN = ("group.", "enable.idempotence", "enable.gapless", "linger.ms", "message.", "acks",
                  "compression.", "batch.", "queue.buffering", "delivery.", "partitioner",
                  "enable.auto", "auto.offset", "session.timeout", "heartbeat.")  # fmt: skip


class _Quiet:
    """A librdkafka ``logger`` for a start-up check: its lines go to DEBUG (the check's own
    one-line error says what matters; librdkafka writes to stderr itself otherwise)."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        log.debug("librdkafka: %s", msg % args if args else msg)


def check_kafka(config: dict[str, Any], timeout: float) -> None:
    """The start-up check of a Kafka cluster: a metadata request (``list_topics``) answered within
    ``timeout`` seconds, with ``config``'s connection and security settings (the harvester's
    ``baseKafkaConfig``, the capture's ``kafka``). A producer only retries, for ever, so this is
    the one way to learn at start that the cluster cannot be reached, or refuses us.

    Raises librdkafka's ``KafkaException`` for :func:`sluiceway.db.classify` to read: an error it
    reported on the way when there was one — an authentication failure (permanent, raised as soon
    as it is reported) rather than the timeout it leads to, or the broker's own words ("Connect to
    ipv4#127.0.0.1:19092 failed: Connection refused") rather than "Local: Broker transport failure".
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    reported: list[KafkaError] = []
    settings = {k: v for k, v in config.items() if not str(k).startswith(_NOT_FOR_ADMIN)}
    admin_config: dict[str, Any] = {**settings, "error_cb": reported.append, "logger": _Quiet()}
    admin = AdminClient(admin_config)
    deadline = time.monotonic() + timeout
    while True:
        # Asked a second at a time: librdkafka reports a refusal at once but answers the request
        # only when it times out.
        step = max(0.1, min(1.0, deadline - time.monotonic()))
        try:
            admin.list_topics(timeout=step)
            return
        except KafkaException as exc:
            admin.poll(0)  # serves the error callbacks of the attempt
            said = [KafkaException(error) for error in reported]
            refusal = next((e for e in said if isinstance(classify(e), Permanent)), None)
            if refusal is not None:
                raise refusal from None
            if time.monotonic() >= deadline:
                transport = [e for e in said if e.args[0].code() == KafkaError._TRANSPORT]
                raise (transport[-1] if transport else exc) from None
