"""NATS JetStream adapter (nats-py).

Mapping: subject = the record's topic; payload = the value (empty for a tombstone); NATS headers =
the record's headers, plus ``Sluice-Key: <key>``, ``Nats-Msg-Id: <msg id>``, ``Sluice-Tombstone:
true`` for a NULL value and ``Nats-Expected-Stream`` when a stream is configured. A record is
delivered when JetStream's publish acknowledgement arrives (the message is stored in the stream);
its position is the stream sequence. JetStream drops a message whose ``Nats-Msg-Id`` it has seen
within the stream's duplicate window (default 2 minutes) and acknowledges it as a duplicate.

A lost connection is closed for good (nats-py's own reconnection is off): every publish whose
acknowledgement was lost with it fails at once, and the
:class:`~sluiceway.brokers.sender.Sender` reconnects and sends it again — with the same message
id, so the server drops the copy if the first one had arrived.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sluiceway.brokers.message import KEY_HEADER, TOMBSTONE_HEADER, Ack, Message, unexpected
from sluiceway.config.brokers import NatsSettings
from sluiceway.errors import BrokerError

BROKER = "nats"
MSG_ID_HEADER = "Nats-Msg-Id"
_EXPECTED_STREAM = "Nats-Expected-Stream"
#: JetStream error codes that no retry can get past (the subject belongs to another stream…).
_PERMANENT_JS_CODES = frozenset({10060})


def to_nats(message: Message, stream: str | None) -> tuple[str, bytes, dict[str, str]]:
    """(subject, payload, headers). A header name repeated in one record keeps its last value:
    nats-py sends one value per name."""
    headers = dict(message.headers)
    headers[KEY_HEADER] = message.key
    if message.msg_id:
        headers[MSG_ID_HEADER] = message.msg_id
    if message.value is None:
        headers[TOMBSTONE_HEADER] = "true"
    if stream:
        headers[_EXPECTED_STREAM] = stream
    return message.topic, message.value if message.value is not None else b"", headers


def from_nats(
    headers: dict[str, str] | None, payload: bytes
) -> tuple[str, bytes | None, list[tuple[str, str]]]:
    """(key, value, headers) of a stored message: our own headers and NATS's are taken off."""
    hdrs = headers or {}
    tombstone = hdrs.get(TOMBSTONE_HEADER) == "true"
    user = [
        (k, v)
        for k, v in hdrs.items()
        if k not in (KEY_HEADER, TOMBSTONE_HEADER, MSG_ID_HEADER, _EXPECTED_STREAM)
        and not k.startswith("Nats-")
    ]
    return hdrs.get(KEY_HEADER, ""), None if tombstone else payload, user


def map_error(exc: BaseException, action: str, target: str = "") -> BrokerError:
    """nats-py's errors as :class:`BrokerError` (the one place they are told apart)."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, BrokerError):
        return exc
    text = str(exc) or type(exc).__name__
    if isinstance(
        exc, nats.errors.MaxPayloadError | nats.errors.BadSubjectError | nats.errors.BadHeaderError
    ):
        return BrokerError(BROKER, action, text, target=target, permanent=True)
    if isinstance(exc, nats.js.errors.APIError):
        code = getattr(exc, "err_code", None)
        detail = f"{getattr(exc, 'description', '') or text} (code {getattr(exc, 'code', '?')}/{code})"
        if code in _PERMANENT_JS_CODES:
            return BrokerError(BROKER, action, detail, target=target, permanent=True)
        return BrokerError(BROKER, action, detail, target=target, retriable=True)
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        return BrokerError(
            BROKER,
            action,
            "no JetStream stream stores this subject (no responders)",
            target=target,
            retriable=True,
        )
    return unexpected(BROKER, action, exc, target)


class NatsClient:
    """One NATS connection with JetStream publishing; see the module docstring for the mapping."""

    broker = BROKER

    def __init__(self, settings: NatsSettings) -> None:
        # Publishes awaiting their acknowledgement: failed at once when the connection drops.
        self._waiting: set[asyncio.Future[Any]] = set()
        self.settings = settings
        self._nc: Any = None  # the connection, and its JetStream context
        self._js: Any = None

    async def connect(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            return
        import nats

        try:
            self._nc = await nats.connect(
                servers=list(self.settings.servers),
                connect_timeout=max(1, int(self.settings.ack_timeout)),
                # We reconnect ourselves (the Sender's next attempt), so a lost connection is closed
                # for good: its socket released, its unacknowledged publishes failed and sent again.
                allow_reconnect=False,
                disconnected_cb=self._disconnected,
                error_cb=self._error,
                name="sluiceway",
            )
        except Exception as exc:
            raise map_error(exc, "connect", ",".join(self.settings.servers)) from exc
        self._js = self._nc.jetstream(timeout=self.settings.ack_timeout)

    async def _disconnected(self) -> None:
        lost = BrokerError(BROKER, "publish", "connection lost before the acknowledgement", retriable=True)
        for future in list(self._waiting):
            if not future.done():
                future.set_exception(lost)

    async def _error(self, exc: Exception) -> None:
        pass  # nats-py reports each failed reconnect here; the Sender logs what matters

    @property
    def jetstream(self) -> Any:
        return self._js

    async def publish(self, messages: Sequence[Message]) -> list[Ack | BrokerError]:
        stream = self.settings.stream
        futures: list[asyncio.Future[Any] | BrokerError] = []
        for message in messages:
            subject, payload, headers = to_nats(message, stream)
            try:
                # No wait_stall: the Sender's window (≤ max_in_flight) stays below nats-py's own
                # limit of pending publishes, and a stall timer per message costs a task each.
                future = await self._js.publish_async(subject, payload, headers=headers)
            except Exception as exc:
                futures.append(map_error(exc, "publish", subject))
                continue
            self._waiting.add(future)
            futures.append(future)
        pending = [f for f in futures if not isinstance(f, BrokerError)]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.ack_timeout)
        out: list[Ack | BrokerError] = []
        for message, future in zip(messages, futures, strict=True):
            if isinstance(future, BrokerError):
                out.append(future)
                continue
            self._waiting.discard(future)
            if not future.done():
                future.cancel()  # nats-py forgets it (and frees its slot)
                out.append(
                    BrokerError(
                        BROKER, "publish", "no acknowledgement in time", target=message.topic, retriable=True
                    )
                )
            elif future.cancelled():
                out.append(BrokerError(BROKER, "publish", "cancelled", target=message.topic, retriable=True))
            elif future.exception() is not None:
                out.append(map_error(future.exception(), "publish", message.topic))  # type: ignore[arg-type]
            else:
                ack = future.result()
                out.append(Ack(position=int(ack.seq), duplicate=bool(ack.duplicate)))
        return out

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except Exception as exc:
                raise map_error(exc, "close") from exc
