"""RabbitMQ adapter (aio-pika, AMQP 0-9-1 with publisher confirms).

Mapping: published to the configured exchange with routing key = the record's topic; body = the
value (empty for a tombstone); properties: ``message_id`` = the msg id, ``timestamp`` = the
record's time, ``delivery_mode`` persistent; headers table = the record's headers (a name used
more than once carries the list of its values), plus ``Sluice-Key`` and, for a NULL value,
``Sluice-Tombstone: true``. A record is delivered when the broker's publisher confirm (Basic.Ack)
arrives; a Nack, or — with ``mandatory`` — a return of an unroutable message, is a failure.
RabbitMQ has no de-duplication of its own: consumers can de-duplicate by ``message_id``.

The connection is plain (not aio-pika's "robust" one): after a connection or channel error the
next attempt opens a new connection and channel, and the
:class:`~sluiceway.brokers.sender.Sender` sends again every message whose confirm did not arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sluiceway.brokers.message import KEY_HEADER, TOMBSTONE_HEADER, Ack, Message, unexpected
from sluiceway.config.brokers import RabbitMqSettings
from sluiceway.errors import BrokerError, Cause

BROKER = "rabbitmq"


class _DropTransportErrors(logging.Filter):
    """aiormq logs a refused connection at ERROR before raising it; we map and raise the same
    error (and the Sender reports it, rate-limited), so its own line is left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("error when creating transport")


logging.getLogger("aiormq.connection").addFilter(_DropTransportErrors())


def amqp_headers(message: Message) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for name, value in message.headers:
        if name in table:
            prior = table[name]
            table[name] = [*prior, value] if isinstance(prior, list) else [prior, value]
        else:
            table[name] = value
    table[KEY_HEADER] = message.key
    if message.value is None:
        table[TOMBSTONE_HEADER] = True
    return table


def map_error(exc: BaseException, action: str, target: str = "", *, server: str = "") -> BrokerError:
    """aio-pika's and aiormq's errors as :class:`BrokerError` (the one place they are told apart).
    ``server``: the (password-masked) URL, named in set-up errors."""
    import aiormq.exceptions

    if isinstance(exc, BrokerError):
        return exc
    text = str(exc) or type(exc).__name__
    reply = str(exc.args[0]) if exc.args and isinstance(exc.args[0], str) else text  # the broker's words
    on = f" on {server}" if server else ""
    if isinstance(exc, aiormq.exceptions.PublishError):
        return BrokerError(
            BROKER,
            action,
            "returned unroutable (no queue bound)",
            target=target,
            retriable=True,
            refused=True,
        )
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return BrokerError(BROKER, action, "the broker refused it (nack)", target=target, retriable=True)
    # Set-up errors (credentials, permissions, a missing exchange) stop the start-up check. Met
    # later — a password rotated, an exchange deleted while running — they are retried like a lost
    # connection: no record is to blame, and someone is probably fixing the set-up.
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return BrokerError(
            BROKER,
            action,
            f"not found: {reply}{on} (declare it first)",
            target=target,
            retriable=True,
            cause=Cause.MISSING,
        )
    if isinstance(exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError):
        return BrokerError(
            BROKER,
            action,
            f"authentication failed{on}: {reply}",
            target=target,
            retriable=True,
            cause=Cause.AUTHENTICATION,
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return BrokerError(
            BROKER, action, f"refused{on}: {reply}", target=target, retriable=True, cause=Cause.PRIVILEGE
        )
    return unexpected(BROKER, action, exc, target)


class RabbitMqClient:
    """One AMQP connection with one confirming channel; see the module docstring for the mapping."""

    broker = BROKER
    in_order = False

    def __init__(self, settings: RabbitMqSettings) -> None:
        self.settings = settings
        self._connection: Any = None
        self._channel: Any = None
        self._exchange: Any = None

    def _healthy(self) -> bool:
        return (
            self._connection is not None
            and not self._connection.is_closed
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def connect(self) -> None:
        if self._healthy():
            return
        await self._drop()
        import aio_pika
        from yarl import URL

        try:
            # Built first and connected second (not aio_pika.connect()), so that a connection that
            # fails half-way is still ours to close: its socket is released.
            self._connection = aio_pika.Connection(URL(self.settings.url))
            await self._connection.connect(timeout=self.settings.ack_timeout)
            self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            if self.settings.exchange:
                self._exchange = await self._channel.get_exchange(self.settings.exchange, ensure=False)
            else:
                self._exchange = self._channel.default_exchange
        except Exception as exc:
            await self._drop()
            raise map_error(exc, "connect", self.settings.server) from exc

    async def check(self) -> None:
        """Connect (the credentials, the vhost), then declare the exchange passively: it must exist."""
        await self.connect()
        if not self.settings.exchange:
            return  # the default exchange always exists
        try:
            await self._channel.get_exchange(self.settings.exchange, ensure=True)
        except Exception as exc:
            await self._drop()  # a failed passive declare closes the channel
            exchange, server = self.settings.exchange, self.settings.server
            raise map_error(exc, "check exchange", exchange, server=server) from exc

    async def publish(
        self, messages: Sequence[Message], *, positions: bool = True
    ) -> list[Ack | BrokerError]:
        import aio_pika

        exchange, mandatory, timeout = self._exchange, self.settings.mandatory, self.settings.ack_timeout

        async def one(message: Message) -> Ack | BrokerError:
            amqp = aio_pika.Message(
                message.value if message.value is not None else b"",
                headers=amqp_headers(message),
                message_id=message.msg_id or None,
                timestamp=datetime.fromtimestamp(message.timestamp_ms / 1000, UTC)
                if message.timestamp_ms is not None
                else None,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            try:
                await exchange.publish(amqp, message.topic, mandatory=mandatory)
            except Exception as exc:
                return map_error(exc, "publish", message.topic)
            return Ack()

        # One timeout for the burst, not publish(timeout=…) per message: that wraps each publish in
        # a task of its own (asyncio.wait_for), twice the tasks for the same wait. The messages
        # of a burst start together, so a confirm missing ``timeout`` s after the burst is one
        # missing ``timeout`` s after its own publish.
        tasks = [asyncio.ensure_future(one(m)) for m in messages]
        _done, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        outcomes = [
            map_error(TimeoutError(), "publish", m.topic) if task.cancelled() else task.result()
            for m, task in zip(messages, tasks, strict=True)
        ]
        if not self._healthy():
            await self._drop()  # the next attempt reconnects
        return outcomes

    async def _drop(self) -> None:
        connection, self._connection, self._channel, self._exchange = self._connection, None, None, None
        if connection is not None:
            # Even a connection the broker already closed: closing it is what releases its socket.
            with contextlib.suppress(Exception):  # it is being replaced: nothing more to do with it
                await connection.close()

    async def close(self) -> None:
        await self._drop()
