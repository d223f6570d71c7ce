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

import asyncio
import contextlib
import re
from collections.abc import Sequence
from typing import Any

from sluiceway.brokers.message import Ack, Message, unexpected
from sluiceway.config.brokers import RedisSettings
from sluiceway.errors import BrokerError, Cause

BROKER = "redis"
HEADER_PREFIX = "header:"
_SEQ_BITS = 20
_SEQ_LIMIT, _MS_LIMIT = 1 << _SEQ_BITS, 1 << (63 - _SEQ_BITS)
_ENTRY_ID = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: The acknowledgement of every message whose position is not asked for (``publish(positions=False)``).
_ACKED = Ack()
#: Error replies that no retry can get past (the key holds another type, a malformed command).
_PERMANENT_REPLIES = ("WRONGTYPE", "ERR wrong number", "ERR syntax", "ERR Invalid stream ID")


def entry_offset(entry_id: str | bytes) -> int:
    """A stream entry id ``<ms>-<seq>`` as one ordered 63-bit number: ``ms << 20 | seq``.

    Text that is not ``<digits>[-<digits>]``, and ids that do not fit (``seq`` ≥ 2^20, ``ms`` ≥ 2^43 —
    far beyond generated ids), raise ValueError.
    """
    if entry_id.__class__ is bytes:  # as Redis replies: bytes.isdigit() is ASCII digits only
        ms_bytes, _, seq_bytes = entry_id.partition(b"-")
        if ms_bytes.isdigit() and seq_bytes.isdigit():
            ms, seq = int(ms_bytes), int(seq_bytes)
            if seq < _SEQ_LIMIT and ms < _MS_LIMIT:
                return ms << _SEQ_BITS | seq
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms_text, _, seq_text = text.partition("-")
    if ms_text.isdigit() and seq_text.isdigit() and ms_text.isascii() and seq_text.isascii():
        ms, seq = int(ms_text), int(seq_text)  # the usual "<ms>-<seq>", without the pattern
        if seq < 1 << _SEQ_BITS and ms < 1 << (63 - _SEQ_BITS):
            return ms << _SEQ_BITS | seq
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
        cause = (
            Cause.AUTHENTICATION if isinstance(exc, redis.exceptions.AuthenticationError) else Cause.PRIVILEGE
        )
        return BrokerError(
            BROKER, action, f"authentication failed: {text}", target=target, retriable=True, cause=cause
        )
    if isinstance(exc, redis.exceptions.ConnectionError):
        # redis-py's own words name the address: "Error 111 connecting to 127.0.0.1:6399. Connection refused."
        return BrokerError(BROKER, action, f"cannot connect: {text}", target=target, retriable=True)
    return unexpected(BROKER, action, exc, target)


def connect_redis(settings: RedisSettings, *, decode: bool = False, reply_timeout: bool = True) -> Any:
    """An asyncio client for ``settings.url`` with redis-py's retries off, packing commands with
    hiredis (:func:`_packing_connection`).

    ``reply_timeout=False``: no timeout per reply; the caller bounds each round trip itself (a
    pipeline of a thousand ``XADD`` commands under one timeout, not a timer set and cancelled per reply —
    a fifth of the publishing thread, measured in bench/capture.py)."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis.from_url(
        settings.url,
        socket_timeout=settings.ack_timeout if reply_timeout else None,
        socket_connect_timeout=settings.connect_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=decode,
        connection_class=_packing_connection(),
    )


_PACKING: Any = None


def _packing_connection() -> Any:
    """redis-py's asyncio connection, its commands packed by hiredis (C) rather than in Python.

    redis-py's synchronous client already packs with hiredis when it is installed; its asyncio
    one does not, and packing was over a third of the publishing thread (bench/capture.py,
    py-spy). A command whose name has a space (``CONFIG GET``) goes the Python way, which splits it.
    """
    global _PACKING
    if _PACKING is None:
        import hiredis
        from redis.asyncio.connection import Connection

        pack = hiredis.pack_command

        class PackingConnection(Connection):
            def pack_command(self, *args: Any) -> list[bytes]:
                first = args[0]
                if " " in (first if isinstance(first, str) else first.decode("latin-1")):
                    return super().pack_command(*args)
                return [pack(args)]

            def pack_commands(self, commands: Any) -> list[bytes]:
                out: list[bytes] = []
                for command in commands:
                    first = command[0]
                    if first == "XADD":  # the hot path: no name to split
                        out.append(pack(command))
                    else:
                        out += self.pack_command(*command)
                return [b"".join(out)]

        _PACKING = PackingConnection
    return _PACKING


class RedisClient:
    """An asyncio Redis client; see the module docstring for the mapping."""

    broker = BROKER
    in_order = True

    def __init__(self, settings: RedisSettings) -> None:
        import hiredis

        self.settings = settings
        self._redis: Any = None
        self._pack = hiredis.pack_command

    async def connect(self) -> None:
        if self._redis is None:
            self._redis = connect_redis(self.settings, reply_timeout=False)

    async def check(self) -> None:
        """Connect and PING: the address, the credentials and the database number."""
        await self.connect()
        try:
            async with asyncio.timeout(self.settings.ack_timeout):
                await self._redis.ping()
        except Exception as exc:
            await self._reset()
            raise map_error(exc, "connect", self.settings.server) from exc

    async def publish(
        self, messages: Sequence[Message], *, positions: bool = True
    ) -> list[Ack | BrokerError]:
        """``messages`` as one pipeline on one connection: packed by hiredis in one pass, written
        at once, their replies read in order. redis-py's ``Pipeline`` would do the same with a
        command stack, a callback lookup per reply and, from 1,000 commands on, the packing on a
        worker thread — a fifth of the capture's publishing process, measured (bench/capture.py)."""
        import redis.exceptions

        pack, max_len = self._pack, self.settings.max_len
        packed = b"".join([pack(tuple(xadd_args(message, max_len))) for message in messages])
        pool = self._redis.connection_pool
        try:
            # One bound for the round trip (the client sets none per reply: see connect_redis).
            async with asyncio.timeout(self.settings.ack_timeout):
                connection = await pool.get_connection()
                try:
                    await connection.send_packed_command(packed, check_health=False)
                    read, replies = connection.read_response, []
                    for _ in messages:
                        try:
                            replies.append(await read())
                        except redis.exceptions.ResponseError as exc:
                            replies.append(exc)
                finally:
                    await pool.release(connection)
        except Exception as exc:
            error = map_error(exc, "publish", messages[0].topic if len(messages) == 1 else "")
            await self._reset()
            return [error] * len(messages)
        out: list[Ack | BrokerError] = []
        for message, reply in zip(messages, replies, strict=True):
            if isinstance(reply, Exception):
                out.append(map_error(reply, "publish", message.topic))
            else:
                out.append(Ack(entry_offset(reply)) if positions else _ACKED)
        return out

    async def _reset(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            with contextlib.suppress(Exception):  # being replaced
                await client.aclose()

    async def close(self) -> None:
        await self._reset()
