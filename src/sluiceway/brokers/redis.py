"""Redis Streams adapter (redis-py, asyncio).

Mapping: ``XADD <topic> [MAXLEN ~ n] * key <key> [value <value>] id <msg id> [header:<name>
<value>]…`` — stream = the record's topic; a tombstone has no ``value`` field; every header is a
``header:<name>`` field, in order (a stream entry may repeat a field name, so repeated headers
are kept). A record is delivered when Redis replies with the entry id; its position is that id as
one number (:func:`entry_offset`). Redis has no de-duplication: a record re-sent after a lost
reply is stored twice; consumers can de-duplicate by the ``id`` field.

The messages ready at one moment go as one pipeline (one round trip; Redis runs them in order).
redis-py's own retries are off: the :class:`~sluiceway.brokers.sender.Sender` retries, so it
alone decides what is sent again.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

from sluiceway.brokers.message import Ack, Message, unexpected
from sluiceway.config.brokers import RedisSettings
from sluiceway.errors import BrokerError

BROKER = "redis"
HEADER_PREFIX = "header:"
_SEQ_BITS = 20
_ENTRY_ID = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: Error replies that no retry can get past (the key holds another type, a malformed command).
_PERMANENT_REPLIES = ("WRONGTYPE", "ERR wrong number", "ERR syntax", "ERR Invalid stream ID")


def entry_offset(entry_id: str | bytes) -> int:
    """A stream entry id ``<ms>-<seq>`` as one ordered 63-bit number: ``ms << 20 | seq``.

    Text that is not ``<digits>[-<digits>]``, and ids that do not fit (``seq`` ≥ 2^20, ``ms`` ≥ 2^43 —
    far beyond generated ids), raise ValueError.
    """
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    match = _ENTRY_ID.fullmatch(text)
    if match is None:  # int() alone would take "-5", "+5", " 5" and "5_0"
        raise ValueError(f"{text!r} is not a stream entry id (<ms>-<seq>)")
    ms, seq = int(match[1]), int(match[2] or 0)
    if seq >= 1 << _SEQ_BITS or ms >= 1 << (63 - _SEQ_BITS):
        raise ValueError(f"stream entry id {text} does not fit a 63-bit offset")
    return ms << _SEQ_BITS | seq


def offset_millis(offset: int) -> int:
    """The milliseconds part of an :func:`entry_offset` (the entry's time)."""
    return offset >> _SEQ_BITS


def offset_entry(offset: int) -> str:
    """The inverse of :func:`entry_offset`."""
    return f"{offset >> _SEQ_BITS}-{offset & ((1 << _SEQ_BITS) - 1)}"


def xadd_args(message: Message, max_len: int) -> list[Any]:
    args: list[Any] = ["XADD", message.topic]
    if max_len:
        args += ["MAXLEN", "~", max_len]
    args += ["*", "key", message.key]
    if message.value is not None:
        args += ["value", message.value]
    if message.msg_id:
        args += ["id", message.msg_id]
    for name, value in message.headers:
        args += [HEADER_PREFIX + name, value]
    return args


def from_fields(fields: Sequence[bytes]) -> tuple[str, bytes | None, list[tuple[str, str]]]:
    """(key, value, headers) of an entry's flat field list (as ``XRANGE`` returns it, undecoded)."""
    key, value, headers = "", None, []
    for i in range(0, len(fields) - 1, 2):
        name, data = fields[i].decode("utf-8", "replace"), fields[i + 1]
        if name == "key":
            key = data.decode("utf-8", "replace")
        elif name == "value":
            value = bytes(data)
        elif name.startswith(HEADER_PREFIX):
            headers.append((name[len(HEADER_PREFIX) :], data.decode("utf-8", "replace")))
    return key, value, headers


def raw_stream_replies(client: Any) -> Any:
    """``client`` with ``XRANGE``/``XREVRANGE`` replies left as Redis sends them: redis-py folds an
    entry's fields into a dict, which would lose a repeated header."""
    for command in ("XRANGE", "XREVRANGE"):
        client.set_response_callback(command, lambda response, **options: response)
    return client


def map_error(exc: BaseException, action: str, target: str = "") -> BrokerError:
    """redis-py's errors as :class:`BrokerError` (the one place they are told apart)."""
    import redis.exceptions

    if isinstance(exc, BrokerError):
        return exc
    text = str(exc) or type(exc).__name__
    if isinstance(exc, redis.exceptions.ResponseError) and text.startswith(_PERMANENT_REPLIES):
        return BrokerError(BROKER, action, text, target=target, permanent=True)
    if isinstance(exc, redis.exceptions.TimeoutError):
        return unexpected(BROKER, action, TimeoutError(), target)
    # Set-up errors (credentials, a database number out of range) stop the start-up check; met
    # later they are retried like a lost connection: no record is to blame.
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError):
        return BrokerError(BROKER, action, f"authentication failed: {text}", target=target, retriable=True)
    if isinstance(exc, redis.exceptions.ConnectionError):
        # redis-py's own words name the address: "Error 111 connecting to 127.0.0.1:6399. Connection refused."
        return BrokerError(BROKER, action, f"cannot connect: {text}", target=target, retriable=True)
    return unexpected(BROKER, action, exc, target)


def connect_redis(settings: RedisSettings, *, decode: bool = False) -> Any:
    """An asyncio client for ``settings.url`` with redis-py's retries off."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis.from_url(
        settings.url,
        socket_timeout=settings.ack_timeout,
        socket_connect_timeout=settings.connect_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=decode,
    )


class RedisClient:
    """An asyncio Redis client; see the module docstring for the mapping."""

    broker = BROKER

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self._redis: Any = None

    async def connect(self) -> None:
        if self._redis is None:
            self._redis = connect_redis(self.settings)

    async def check(self) -> None:
        """Connect and PING: the address, the credentials and the database number."""
        await self.connect()
        try:
            await self._redis.ping()
        except Exception as exc:
            await self._reset()
            raise map_error(exc, "connect", self.settings.server) from exc

    async def publish(self, messages: Sequence[Message]) -> list[Ack | BrokerError]:
        pipe = self._redis.pipeline(transaction=False)
        for message in messages:
            pipe.execute_command(*xadd_args(message, self.settings.max_len))
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            error = map_error(exc, "publish", messages[0].topic if len(messages) == 1 else "")
            await self._reset()
            return [error] * len(messages)
        out: list[Ack | BrokerError] = []
        for message, reply in zip(messages, replies, strict=True):
            if isinstance(reply, Exception):
                out.append(map_error(reply, "publish", message.topic))
            else:
                out.append(Ack(position=entry_offset(reply)))
        return out

    async def _reset(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            with contextlib.suppress(Exception):  # being replaced
                await client.aclose()

    async def close(self) -> None:
        await self._reset()
