"""NATS JetStream adapter (nats-py).

Mapping: subject = the record's topic; payload = the value (empty for a tombstone); NATS headers =
the record's headers, plus ``Sluice-Key: <key>``, ``Nats-Msg-Id: <msg id>``, ``Sluice-Tombstone:
true`` for a NULL value and ``Nats-Expected-Stream`` when a stream is configured. A record is
delivered when JetStream's publish acknowledgement arrives (the message is stored in the stream);
its position is the stream sequence. JetStream drops a message whose ``Nats-Msg-Id`` it has seen
within the stream's duplicate window (default 2 minutes) and acknowledges it as a duplicate.

Publishing is JetStream's asynchronous publish done here rather than by nats-py's
``publish_async``: each message goes out with a reply subject under one inbox of ours and a
counter as its token, and one subscription on that inbox settles the acknowledgements. nats-py's
own asks the system's random source for a token per message and parses each acknowledgement into
a dataclass — a fifth of the publishing thread's time, measured (bench/capture.py, py-spy).

A lost connection is closed for good (nats-py's own reconnection is off): every publish whose
acknowledgement was lost with it fails at once, and the
:class:`~sluiceway.brokers.sender.Sender` reconnects and sends it again — with the same message
id, so the server drops the copy if the first one had arrived.

Connecting. nats-py's first ``connect`` keeps trying a server that refuses it (every 2 s, 60
times) whatever ``allow_reconnect`` says, reporting each failure only to the error callback. Here
each server is tried at most twice, at once, each attempt bounded by ``connectTimeout``; the last
error the callback saw is the one raised (nats-py itself ends with a bare "no servers available").
Errors after the connection is up (a permissions violation, a slow consumer) are logged as
warnings, at most one a minute: nothing the client reports is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from sluiceway.brokers.message import KEY_HEADER, TOMBSTONE_HEADER, Ack, Message, unexpected
from sluiceway.config.brokers import NatsSettings
from sluiceway.errors import BrokerError, Cause

log = logging.getLogger("sluiceway.brokers")

BROKER = "nats"
MSG_ID_HEADER = "Nats-Msg-Id"
_EXPECTED_STREAM = "Nats-Expected-Stream"
#: JetStream error codes that no retry can get past (the subject belongs to another stream…).
_PERMANENT_JS_CODES = frozenset({10060})
#: JetStream's "stream not found".
_NO_STREAM = 10059
#: At most one warning per this many seconds for errors nats-py reports on an open connection.
_WARN_INTERVAL = 60.0


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


def map_error(exc: BaseException, action: str, target: str = "", *, server: str = "") -> BrokerError:
    """nats-py's errors as :class:`BrokerError` (the one place they are told apart). ``server``:
    the URL connected to, named in set-up errors."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, BrokerError):
        return exc
    text = str(exc) or type(exc).__name__
    on = f" on {server}" if server else ""
    if isinstance(
        exc, nats.errors.MaxPayloadError | nats.errors.BadSubjectError | nats.errors.BadHeaderError
    ):
        return BrokerError(BROKER, action, text, target=target, permanent=True)
    # Set-up errors (credentials, a missing stream, JetStream off) stop the start-up check. Met
    # later — a password rotated, a stream deleted while running — they are retried like a lost
    # connection: no record is to blame, and someone is probably fixing the set-up.
    if isinstance(exc, nats.errors.AuthorizationError):
        return BrokerError(
            BROKER,
            action,
            "authorization failed (check the user and password in the server URL)",
            target=target,
            retriable=True,
            cause=Cause.AUTHENTICATION,
        )
    if isinstance(exc, TimeoutError):  # an OSError too: told apart first
        if action == "connect":
            return BrokerError(
                BROKER, action, "cannot connect: no answer in time", target=target, retriable=True
            )
        return unexpected(BROKER, action, exc, target)
    if isinstance(exc, nats.errors.NoServersError | OSError):
        problem = unexpected(BROKER, action, exc).problem
        return BrokerError(BROKER, action, f"cannot connect: {problem}", target=target, retriable=True)
    if isinstance(exc, nats.js.errors.NotFoundError) and getattr(exc, "err_code", None) == _NO_STREAM:
        return BrokerError(
            BROKER,
            action,
            f"no such JetStream stream{on} (create it first: see docs/harvester.md)",
            target=target,
            retriable=True,
            cause=Cause.MISSING,
        )
    if isinstance(exc, nats.errors.NoRespondersError):
        return BrokerError(
            BROKER,
            action,
            f"JetStream is not enabled{on} (no responders)",
            target=target,
            retriable=True,
            cause=Cause.CONFIGURATION,
        )
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
    in_order = False

    def __init__(self, settings: NatsSettings) -> None:
        # Publishes awaiting their acknowledgement: failed at once when the connection drops.
        self._waiting: set[asyncio.Future[Any]] = set()
        self.settings = settings
        self._nc: Any = None  # the connection, and its JetStream context
        self._js: Any = None
        self._connecting = False
        self._last_error: BaseException | None = None  # the last one nats-py reported
        self._warned_at: float | None = None
        #: Acknowledgements awaited, by token (the last part of their reply subject).
        self._acks: dict[str, asyncio.Future[Any]] = {}
        self._inbox = ""
        self._tokens = itertools.count()

    async def connect(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            return
        from nats.aio.client import Client

        where = ",".join(self.settings.servers)
        nc = Client()
        self._connecting, self._last_error = True, None
        try:
            await nc.connect(
                servers=list(self.settings.servers),
                connect_timeout=max(1, math.ceil(self.settings.connect_timeout)),  # nats-py takes seconds
                # We reconnect ourselves (the Sender's next attempt), so a lost connection is closed
                # for good: its socket released, its unacknowledged publishes failed and sent again.
                allow_reconnect=False,
                # Without these the first connect retries a refusing server for two minutes, in
                # silence (see the module docstring): two prompt tries per server, then give up.
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                disconnected_cb=self._disconnected,
                error_cb=self._error,
                name="sluiceway",
            )
        except BaseException as exc:
            with contextlib.suppress(Exception):  # a half-open client: release what it holds
                await nc.close()
            if not isinstance(exc, Exception):
                raise  # cancelled
            cause = self._last_error if self._last_error is not None else exc
            raise map_error(cause, "connect", where) from exc
        finally:
            self._connecting = False
        self._nc = nc
        self._js = nc.jetstream(timeout=self.settings.ack_timeout)
        self._inbox = f"{nc.new_inbox()}."
        self._acks = {}
        await nc.subscribe(f"{self._inbox}*", cb=self._on_ack)

    async def _on_ack(self, msg: Any) -> None:
        """A publish acknowledgement (or JetStream's refusal) for the message of its token."""
        future = self._acks.pop(msg.subject[len(self._inbox) :], None)
        if future is None or future.done():
            return  # given up on already (no acknowledgement in time)
        import nats.js.errors

        if msg.headers and msg.headers.get("Status") == "503":  # no stream takes the subject
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            reply = json.loads(msg.data)
        except ValueError as exc:
            future.set_exception(exc)
            return
        if "error" in reply:
            future.set_exception(nats.js.errors.APIError.from_error(reply["error"]))
        else:
            future.set_result(reply)

    async def check(self) -> None:
        """Connect, then ask JetStream for the configured stream (or, with none configured, for the
        account: is JetStream enabled at all)."""
        await self.connect()
        stream = self.settings.stream
        try:
            if stream:
                await self._js.stream_info(stream)
            else:
                await self._js.account_info()
        except Exception as exc:
            url = self._nc.connected_url
            server = f"{url.scheme}://{url.hostname}:{url.port}" if url else ""
            raise map_error(
                exc, "check stream" if stream else "check JetStream", stream or "", server=server
            ) from exc

    async def _disconnected(self) -> None:
        lost = BrokerError(BROKER, "publish", "connection lost before the acknowledgement", retriable=True)
        for future in list(self._waiting):
            if not future.done():
                future.set_exception(lost)

    async def _error(self, exc: Exception) -> None:
        """nats-py's error callback. While connecting: each failed try (the last one is raised).
        Once connected: what the server or the client reports, as a warning (at most one per
        ``_WARN_INTERVAL``; a lost connection is also seen by every publish it fails)."""
        self._last_error = exc
        if self._connecting:
            log.debug("nats: connection attempt failed: %s", exc)
            return
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= _WARN_INTERVAL:
            self._warned_at = now
            log.warning("%s", map_error(exc, "connection"))
        else:
            log.debug("nats: %s", exc)

    @property
    def jetstream(self) -> Any:
        return self._js

    async def publish(
        self, messages: Sequence[Message], *, positions: bool = True
    ) -> list[Ack | BrokerError]:
        stream = self.settings.stream
        futures: list[asyncio.Future[Any] | BrokerError] = []
        tokens: list[str] = []
        loop = asyncio.get_running_loop()
        nc, inbox, acks, counter = self._nc, self._inbox, self._acks, self._tokens
        for message in messages:
            subject, payload, headers = to_nats(message, stream)
            token = str(next(counter))
            waiting: asyncio.Future[Any] = loop.create_future()
            acks[token] = waiting
            try:
                await nc.publish(subject, payload, reply=inbox + token, headers=headers)
            except Exception as exc:
                acks.pop(token, None)
                futures.append(map_error(exc, "publish", subject))
                tokens.append("")
                continue
            self._waiting.add(waiting)
            futures.append(waiting)
            tokens.append(token)
        pending = [f for f in futures if not isinstance(f, BrokerError)]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.ack_timeout)
        out: list[Ack | BrokerError] = []
        for message, future, token in zip(messages, futures, tokens, strict=True):
            if isinstance(future, BrokerError):
                out.append(future)
                continue
            self._waiting.discard(future)
            if not future.done():
                acks.pop(token, None)  # a late acknowledgement finds nothing to settle
                future.cancel()
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
                out.append(Ack(position=int(ack["seq"]), duplicate=bool(ack.get("duplicate", False))))
        return out

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except Exception as exc:
                raise map_error(exc, "close") from exc
