"""Message brokers beyond Kafka — NATS JetStream, RabbitMQ, Redis Streams — behind one small port.

Each adapter (:mod:`.nats`, :mod:`.rabbitmq`, :mod:`.redis`) maps a :class:`Message` to its
system's native shape and back, and maps its client library's errors to
:class:`~sluiceway.errors.BrokerError` in one place. :class:`Sender` is the part they share: it
publishes from a background event loop, at most one message per key awaiting its acknowledgement
(so a retry can never overtake a key's later message), retrying with backoff across connection
loss. The harvester (``harvest/brokers.py``) and the pipeline's sinks and sources use them.
"""

import asyncio

from sluiceway.brokers.message import Ack, BrokerClient, Message
from sluiceway.brokers.sender import Sender
from sluiceway.config.brokers import BrokerSettings

__all__ = ["Ack", "BrokerClient", "BrokerSettings", "Message", "Sender", "check_broker", "open_client"]


def open_client(settings: BrokerSettings) -> BrokerClient:
    """The adapter for a broker's settings (the client library is imported here, not before)."""
    from sluiceway.config.brokers import NatsSettings, RabbitMqSettings, RedisSettings

    if isinstance(settings, NatsSettings):
        from sluiceway.brokers.nats import NatsClient

        return NatsClient(settings)
    if isinstance(settings, RabbitMqSettings):
        from sluiceway.brokers.rabbitmq import RabbitMqClient

        return RabbitMqClient(settings)
    if isinstance(settings, RedisSettings):
        from sluiceway.brokers.redis import RedisClient

        return RedisClient(settings)
    raise TypeError(f"no broker adapter for {type(settings).__name__}")


def check_broker(settings: BrokerSettings) -> None:
    """The start-up check: connect to the broker and check what the settings name (credentials,
    the JetStream stream, the RabbitMQ exchange, the Redis database), within about the connect
    timeout. Raises :class:`BrokerError` naming the broker, the server and what is wrong.

    Run before a harvester campaigns for leadership: a wrong address, password or stream is said
    once, at once, instead of retried by a leader that holds its rows.
    """
    from sluiceway.errors import BrokerError

    client = open_client(settings)
    servers = len(getattr(settings, "servers", ())) or 1
    # NATS tries each server twice; then one request (stream info, passive declare, PING).
    bound = settings.connect_timeout * 2 * servers + settings.ack_timeout + 1.0

    async def run() -> None:
        try:
            await asyncio.wait_for(client.check(), bound)
        except TimeoutError:
            raise BrokerError(
                client.broker, "connect", f"no answer within {bound:g}s", target=settings.describe()
            ) from None
        finally:
            await client.close()

    asyncio.run(run())
