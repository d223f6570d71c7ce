"""The Redis client's pipeline against the machine's Redis: one round trip per batch, a reply per
message in order, and a refusal of one message (a key that holds another type) that fails that
message alone, leaving the connection fit for the next batch."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from sluiceway.brokers.message import Ack, Message
from sluiceway.brokers.redis import RedisClient, from_fields, raw_stream_replies
from sluiceway.config.brokers import RedisSettings
from sluiceway.errors import BrokerError
from tests.support.brokers import REDIS_URL

pytestmark = [pytest.mark.brokers, pytest.mark.timeout(60)]


def test_one_refused_message_fails_alone_and_the_connection_goes_on() -> None:
    prefix = f"sluicetest{uuid.uuid4().hex[:10]}"
    good, taken = f"{prefix}.good", f"{prefix}.taken"
    admin = raw_stream_replies(redis.Redis.from_url(REDIS_URL))
    admin.set(taken, "a string, not a stream")
    client = RedisClient(RedisSettings(url=REDIS_URL))

    async def run() -> tuple[list[Ack | BrokerError], list[Ack | BrokerError]]:
        await client.connect()
        try:
            first = await client.publish(
                [
                    Message(good, "k1", b"v1", headers=(("h", "1"),)),
                    Message(taken, "k2", b"v2"),
                    Message(good, "k3", None),
                ]
            )
            second = await client.publish([Message(good, f"n{i}", b"x") for i in range(1500)])
            return first, second
        finally:
            await client.close()

    try:
        first, second = asyncio.run(run())
        assert isinstance(first[0], Ack) and isinstance(first[2], Ack)
        refused = first[1]
        assert isinstance(refused, BrokerError) and refused.permanent and "WRONGTYPE" in str(refused)
        assert first[0].position < first[2].position  # entry ids, in the order sent
        assert all(isinstance(o, Ack) for o in second)
        entries = [from_fields(fields) for _id, fields in admin.xrange(good)]
        assert entries[:2] == [("k1", b"v1", [("h", "1")]), ("k3", None, [])]
        assert [key for key, _v, _h in entries[2:]] == [f"n{i}" for i in range(1500)]
    finally:
        admin.delete(good, taken)
        admin.close()
