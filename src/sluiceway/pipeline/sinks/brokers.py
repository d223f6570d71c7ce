"""NATS JetStream, RabbitMQ and Redis sinks: the harvester's mapping (``sluiceway.brokers``), each
record counted as written only on the broker's acknowledgement.

A write hands the whole slice to a :class:`~sluiceway.brokers.Sender`: across keys many records
await acknowledgements at once, within a key one at a time and in offset order, so a retry never
lets a key's later record overtake an earlier one; a record that still fails fails the write (and
nothing of its key after it is sent). Each message id is ``<token>/<row>``: a replayed slice
carries the same ids, which JetStream drops within its duplicate window (idempotent per batch
there); RabbitMQ and Redis get them again (at-least-once). A broker that stays away is no
record's fault (:func:`write_failure`): the write raises ``DestinationUnreachable``.
"""

from __future__ import annotations

import pyarrow as pa

from sluiceway.brokers import Ack, Message, Sender, open_client
from sluiceway.brokers.message import epoch_millis
from sluiceway.config.brokers import BrokerSettings
from sluiceway.errors import BrokerError
from sluiceway.pipeline.errors import DestinationUnreachable, one_line
from sluiceway.pipeline.record import header_pairs
from sluiceway.pipeline.sinks.base import ClientSink


def table_messages(table: pa.Table, topic: str | None, token: str) -> list[Message]:
    """The rows of ``table`` as messages, in order (topic: ``topic`` or each row's namespace)."""
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    n = table.num_rows
    headers = table.column("headers").to_pylist() if "headers" in table.column_names else [None] * n
    topics = [topic] * n if topic else table.column("namespace").to_pylist()
    stamps = table.column("timestamp").to_pylist() if "timestamp" in table.column_names else [None] * n
    return [
        Message(
            topics[i],
            keys[i] or "",
            values[i],
            tuple(header_pairs(headers[i])),
            f"{token}/{i}",
            epoch_millis(stamps[i]),
        )
        for i in range(n)
    ]


class BrokerSink(ClientSink[Sender]):
    """The sink writer for ``nats``, ``rabbitmq`` and ``redis`` sinks."""

    def __init__(self, settings: BrokerSettings, topic: str | None) -> None:
        self.settings = settings
        self.topic = topic

    def write(self, table: pa.Table, token: str) -> None:
        if table.num_rows:  # an empty slice opens no connection
            super().write(table, token)

    def _open(self) -> Sender:
        return Sender(open_client(self.settings), self.settings, stop_key_on_failure=True, name="sink")

    def _write(self, sender: Sender, table: pa.Table, token: str) -> None:
        errors: list[BrokerError] = []

        def done(outcome: Ack | BrokerError) -> None:
            if isinstance(outcome, BrokerError):
                errors.append(outcome)

        for message in table_messages(table, self.topic, token):
            sender.submit(message, done)
        left = sender.flush(self.settings.delivery_timeout + self.settings.ack_timeout + 5)
        if errors or left:
            raise write_failure(self.settings, errors, left)  # and a fresh connection for the retry

    def _release(self, sender: Sender) -> None:
        sender.close()


def write_failure(settings: BrokerSettings, errors: list[BrokerError], left: int) -> Exception:
    """What a failed write raises, told apart by the adapters' own mapping (``sluiceway.brokers``):
    a message the broker refuses on its merits (``permanent``: too large, a key of the wrong type)
    is a record's error (the batch is replayed to find it); a broker that stayed away for the
    whole ``deliveryTimeout`` (``retriable``: no connection, no acknowledgement, a refused login
    met at run time) or messages still unacknowledged are the destination's, not a record's.
    The other errors are only consequences (a key's later message not sent after its failure).
    """
    refused = next((e for e in errors if e.permanent), None)
    if refused is not None:
        return refused
    away = next((e for e in errors if e.retriable), None)
    if away is not None:
        return DestinationUnreachable(f"{settings.describe()}: {one_line(away.problem)}")
    if left:
        return DestinationUnreachable(
            f"{settings.describe()}: {left} messages not acknowledged within "
            f"{settings.delivery_timeout + settings.ack_timeout:g}s"
        )
    return errors[0]
