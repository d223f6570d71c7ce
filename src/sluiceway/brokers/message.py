"""What the brokers carry, independent of any client library: one message, one acknowledgement,
and the port every broker adapter implements."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple, Protocol

from sluiceway.errors import BrokerError

#: Header (NATS, RabbitMQ) or field (Redis) carrying the record key: none of the three has keys.
KEY_HEADER = "Sluice-Key"
#: Marks a tombstone (a NULL value) where an empty payload could not tell it from "".
TOMBSTONE_HEADER = "Sluice-Tombstone"


class Message(NamedTuple):
    """One record on its way to a broker (a named tuple: made per record at a hundred thousand a
    second, where a frozen dataclass's ``__init__`` cost four times as much).

    ``topic`` becomes the NATS subject, the RabbitMQ routing key or the Redis stream; ``value``
    None is a tombstone; ``msg_id`` is the de-duplication id (the outbox row, or the pipeline
    batch and row): JetStream's ``Nats-Msg-Id``, RabbitMQ's ``message_id``, Redis's ``id`` field.
    """

    topic: str
    key: str
    value: bytes | None
    headers: tuple[tuple[str, str], ...] = ()
    msg_id: str = ""
    timestamp_ms: int | None = None


def epoch_millis(stamp: datetime | None) -> int | None:
    """A record's time as :attr:`Message.timestamp_ms` (milliseconds since the epoch; None stays None).

    >>> from datetime import UTC
    >>> epoch_millis(datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=UTC))
    1767225600001
    """
    return int(stamp.timestamp() * 1000) if stamp is not None else None


class Ack(NamedTuple):
    """The broker's acknowledgement, one per message (a named tuple, as :class:`Message`).
    ``position``: where it landed when the broker says (JetStream stream sequence, Redis entry id
    as an offset); ``duplicate``: JetStream recognised the message id within its duplicate window
    and did not store it again."""

    position: int | None = None
    duplicate: bool = False


def unexpected(broker: str, action: str, exc: BaseException, target: str = "") -> BrokerError:
    """A timeout, or a client error no adapter rule names: assumed passing (a lost connection, a
    broker restarting), so the message is tried again until its delivery timeout."""
    if isinstance(exc, TimeoutError):  # asyncio's and the clients' timeouts derive from it
        problem = f"no {'reply' if broker == 'redis' else 'acknowledgement'} in time"
    elif isinstance(exc, OSError) and exc.errno:
        # "Connection refused (Connect call failed ('127.0.0.1', 4299))", not "[Errno 111] …"
        detail = f" ({exc.strerror})" if exc.strerror and exc.strerror != os.strerror(exc.errno) else ""
        problem = f"{os.strerror(exc.errno)}{detail}"
    else:
        problem = f"{type(exc).__name__}: {str(exc) or 'no detail'}"
    return BrokerError(broker, action, problem, target=target, retriable=True)


class BrokerClient(Protocol):
    """The port of one broker connection, used from one asyncio event loop."""

    #: ``nats``, ``rabbitmq`` or ``redis``: names the broker in errors, events and metrics.
    broker: str
    #: The broker applies one connection's messages in the order they were sent and a failure
    #: of one (its connection lost) fails every later one: :meth:`Sender.submit_ordered` may be used.
    in_order: bool

    async def connect(self) -> None:
        """(Re)connect if not connected; raise a retriable BrokerError when the broker is away."""
        ...

    async def check(self) -> None:
        """Connect and check what the settings name (the credentials, the JetStream stream, the
        exchange, the database): the start-up check. Raises a mapped BrokerError."""
        ...

    async def publish(
        self, messages: Sequence[Message], *, positions: bool = True
    ) -> list[Ack | BrokerError]:
        """Publish in order and await every acknowledgement (each within the ack timeout).
        One outcome per message; errors are mapped, never raised. ``positions=False``: the caller
        counts acknowledgements only (an ordered capture), so an adapter may leave
        :attr:`Ack.position` unset rather than work it out per message."""
        ...

    async def close(self) -> None: ...
