"""The broker adapter of the Publisher port: outbox records to NATS JetStream, RabbitMQ or Redis.

Each record becomes a :class:`~sluiceway.brokers.Message` whose id is ``<prefix><outbox id>``
(the same id whoever leads, so JetStream drops a re-send within its duplicate window) and goes
through a :class:`~sluiceway.brokers.Sender`: delivered only on the broker's acknowledgement,
retried across connection loss until ``deliveryTimeout``, and never attempted again once this
harvester stops being the leader (``may_send``), so a deposed leader's retry cannot land after
its successor's sends. The Sender keeps one record per key awaiting an acknowledgement whatever
``perKeyInFlight`` is, and fails a key's later records unsent once one fails: gapless per key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial
from typing import Literal

from sluiceway.brokers import Ack, Message, Sender, open_client
from sluiceway.brokers.message import epoch_millis
from sluiceway.config.brokers import NatsTarget, RabbitMqTarget, RedisTarget
from sluiceway.db.dsn import parse_dsn
from sluiceway.errors import BrokerError
from sluiceway.harvest.ports import ColumnsDone, Delivery
from sluiceway.outbox.record import MarkedRecord, RecordColumns

Target = NatsTarget | RabbitMqTarget | RedisTarget


def msg_id_prefix(target: Target, data_source: str, table: str) -> str:
    """The configured prefix, or one derived from the outbox's location (password left out, so
    rotating it changes nothing)."""
    if target.msg_id_prefix is not None:
        return target.msg_id_prefix
    where = parse_dsn(data_source).redacted()
    return f"{hashlib.sha1(f'{where}|{table}'.encode()).hexdigest()[:10]}:"


def to_message(record: MarkedRecord, prefix: str) -> Message:
    return Message(
        record.topic,
        record.key,
        record.value,
        tuple(record.headers),
        f"{prefix}{record.id}",
        epoch_millis(record.create_time),
    )


class BrokerPublisher:
    """Publishes outbox records to one broker; see the module docstring."""

    #: ``send_many`` only hands the records to the sender's event loop: the engine calls it inline,
    #: with each dispatched batch whole (no send threads, no ``sendBuffer``-sized pieces).
    inline = True

    def __init__(
        self,
        target: Target,
        *,
        prefix: str,
        may_send: Callable[[], bool] = lambda: True,
        refused: Literal["retry", "stop", "pass"] = "retry",
    ) -> None:
        """``refused``: what a message the broker refuses by a rule of its set-up (RabbitMQ's
        unroutable, ``mandatory``) becomes: ``retry`` — tried again like a lost one (the
        harvester); ``stop`` — a permanent failure at once, the key's later messages failed
        unsent; ``pass`` — a permanent failure at once, the key's later messages sent on (its
        sender takes the refused one elsewhere: ``sluice capture``'s dead letters)."""
        self.target = target
        self.broker = target.type
        self.prefix = prefix
        self._final = refused != "retry"
        # stop_key_on_failure: gapless per key (the Publisher port's rule with perKeyInFlight > 1) —
        # once a record fails, its key's later records already handed over fail too, unsent.
        client = open_client(target)
        #: Whole batches go as one ordered attempt (Sender.submit_ordered) where the broker keeps order.
        self._ordered = bool(getattr(client, "in_order", False))
        self._sender = Sender(
            client,
            target,
            may_send=may_send,
            stop_key_on_failure=True,
            retry_refused=not self._final,
            continue_after_refusal=refused == "pass",
            name="harvest",
        )

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        self.send_many([record], on_done)

    def send_many(self, records: list[MarkedRecord], on_done: Callable[[Delivery], None]) -> None:
        """Several records, in order, handed to the sender at once (the engine's send batches)."""
        prefix = self.prefix
        self._sender.submit_many(
            [(to_message(record, prefix), _reporter(record, on_done, self._final)) for record in records]
        )

    def send_columns(self, columns: RecordColumns, done: ColumnsDone) -> None:
        """The records of ``columns`` handed to the sender at once (the port's rules): as one
        ordered batch where the broker keeps a connection's order (Redis), else a message each
        behind its key's earlier ones."""
        prefix, acked = self.prefix, done.acked
        millis: dict[int, int | None] = {}  # a transaction's records share one commit time
        for stamp in columns.create_times:
            if id(stamp) not in millis:
                millis[id(stamp)] = epoch_millis(stamp)
        ids, topics, keys, values, headers, stamps = (
            columns.ids, columns.topics, columns.keys, columns.values, columns.headers, columns.create_times
        )  # fmt: skip
        messages = [
            Message(
                topics[i], keys[i], values[i], tuple(headers[i]), f"{prefix}{ids[i]}", millis[id(stamps[i])]
            )
            for i in range(len(ids))
        ]

        final = self._final

        def failed(index: int, error: BrokerError) -> None:
            permanent = error.permanent or (final and error.refused)
            done.failed(index, Delivery(columns.record(index), error=str(error), permanent=permanent))

        if self._ordered:

            def outcomes(results: list[Ack | BrokerError]) -> None:
                good = 0
                for i, result in enumerate(results):
                    if result.__class__ is Ack:
                        good += 1
                    else:
                        failed(i, result)  # type: ignore[arg-type]
                if good:
                    acked(good)

            self._sender.submit_ordered(messages, outcomes)
            return

        def outcome(index: int, result: Ack | BrokerError) -> None:
            if result.__class__ is Ack:
                acked(1)
            else:
                failed(index, result)  # type: ignore[arg-type]

        self._sender.submit_many([(message, partial(outcome, i)) for i, message in enumerate(messages)])

    def flush(self, timeout: float) -> int:
        return self._sender.flush(timeout)

    def close(self) -> None:
        self._sender.close()


def _reporter(
    record: MarkedRecord, on_done: Callable[[Delivery], None], final: bool
) -> Callable[[Ack | BrokerError], None]:
    def done(outcome: Ack | BrokerError) -> None:
        if isinstance(outcome, Ack):
            on_done(Delivery(record, offset=outcome.position))
        else:
            permanent = outcome.permanent or (final and outcome.refused)
            on_done(Delivery(record, error=str(outcome), permanent=permanent))

    return done
