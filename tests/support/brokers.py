"""The three shared brokers in tests: a private place on each (a JetStream stream, a RabbitMQ
exchange with its queue, Redis streams under a unique prefix), read back with each broker's own
client, removed afterwards — never anything another test owns. And a TCP proxy to cut."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NATS_URL = "nats://127.0.0.1:4222"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
REDIS_URL = "redis://127.0.0.1:6379/0"
PORTS = {"nats": 4222, "rabbitmq": 5672, "redis": 6379}

#: (key, value, headers) as a consumer sees a message.
Seen = tuple[str, bytes | None, list[tuple[str, str]]]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@dataclass
class Place:
    """Where one test's records go on one broker: topics (= subjects / routing keys / streams)
    all start with ``prefix``."""

    broker: str
    prefix: str
    url: str
    extra: dict[str, Any] = field(default_factory=dict)

    def topic(self, name: str = "t") -> str:
        return f"{self.prefix}.{name}"

    # -- harvester / pipeline settings ----------------------------------------------------------
    def target(self, url: str | None = None, **more: Any) -> dict[str, Any]:
        url = url or self.url
        if self.broker == "nats":
            return {"type": "nats", "servers": [url], "stream": self.extra["stream"], **more}
        if self.broker == "rabbitmq":
            return {"type": "rabbitmq", "url": url, "exchange": self.extra["exchange"], **more}
        return {"type": "redis", "url": url, **more}

    # -- reading back --------------------------------------------------------------------------
    def read(self, topic: str | None = None, expected: int = 0, timeout: float = 30) -> list[Seen]:
        """Every message stored for this place (or one topic), in the broker's order."""
        if self.broker == "nats":
            return run(_read_nats(self, topic, expected))
        if self.broker == "rabbitmq":
            return _read_rabbit(self, expected, timeout)
        return _read_redis(self, topic)

    def count(self) -> int:
        """How many messages the place holds now (cheap: the broker's own counter)."""
        if self.broker == "nats":
            return int(run(_nats_admin(lambda js: js.stream_info(self.extra["stream"]))).state.messages)
        if self.broker == "rabbitmq":

            async def depth(ch: Any) -> int:
                queue = await ch.declare_queue(self.extra["queue"], passive=True)
                return int(queue.declaration_result.message_count)

            return int(run(_rabbit(depth))) + len(self.extra.get("seen", []))
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return sum(int(client.xlen(k)) for k in client.scan_iter(match=f"{self.prefix}.*", count=1000))
        finally:
            client.close()

    def cleanup(self) -> None:
        if self.broker == "nats":
            run(_nats_admin(lambda js: js.delete_stream(self.extra["stream"])))
        elif self.broker == "rabbitmq":
            _rabbit_cleanup(self)
        else:
            import redis

            client = redis.Redis.from_url(self.url)
            for key in client.scan_iter(match=f"{self.prefix}.*", count=1000):
                client.delete(key)
            client.close()


def make_place(broker: str, *, duplicate_window: float = 120.0) -> Place:
    prefix = f"sluicetest{uuid.uuid4().hex[:10]}"
    if broker == "nats":
        stream = prefix.upper()

        async def create(js: Any) -> None:
            from nats.js.api import StreamConfig

            await js.add_stream(
                StreamConfig(name=stream, subjects=[f"{prefix}.>"], duplicate_window=duplicate_window)
            )

        run(_nats_admin(create))
        return Place(broker, prefix, NATS_URL, {"stream": stream})
    if broker == "rabbitmq":
        place = Place(broker, prefix, AMQP_URL, {"exchange": f"{prefix}.x", "queue": f"{prefix}.q"})
        _rabbit_setup(place)
        return place
    return Place(broker, prefix, REDIS_URL)


# -- NATS ------------------------------------------------------------------------------------------
async def _nats_admin(action: Callable[[Any], Any]) -> Any:
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        return await action(nc.jetstream())
    finally:
        await nc.close()


async def _read_nats(place: Place, topic: str | None, expected: int = 0) -> list[Seen]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    from sluiceway.brokers.nats import from_nats

    nc = await nats.connect(NATS_URL)
    out: list[Seen] = []
    try:
        js = nc.jetstream()
        info = await js.stream_info(place.extra["stream"])
        total = info.state.messages
        sub = await js.pull_subscribe(
            topic or f"{place.prefix}.>",
            durable=None,
            stream=place.extra["stream"],
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        # Read until a fetch finds nothing more; but a fetch that times out before the stream's
        # messages (or, for one subject, the caller's ``expected``) are all in is asked again, up
        # to a deadline: on a busy machine one second is not always enough.
        want = total if topic is None else expected
        deadline = time.monotonic() + 30
        while True:
            try:
                msgs = await sub.fetch(1000, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                if len(out) < want and time.monotonic() < deadline:
                    continue
                break
            for m in msgs:
                out.append(from_nats(m.headers, m.data))
            if topic is None and len(out) >= total:
                break
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


# -- RabbitMQ ----------------------------------------------------------------------------------------
async def _rabbit(action: Callable[[Any], Any]) -> Any:
    import aio_pika

    conn = await aio_pika.connect(AMQP_URL)
    try:
        return await action(await conn.channel())
    finally:
        await conn.close()


def _rabbit_setup(place: Place) -> None:
    async def setup(ch: Any) -> None:
        exchange = await ch.declare_exchange(place.extra["exchange"], "topic")
        queue = await ch.declare_queue(place.extra["queue"], durable=True)
        await queue.bind(exchange, routing_key="#")

    run(_rabbit(setup))


def _rabbit_cleanup(place: Place) -> None:
    async def cleanup(ch: Any) -> None:
        await ch.queue_delete(place.extra["queue"])
        await ch.exchange_delete(place.extra["exchange"])

    run(_rabbit(cleanup))


def _read_rabbit(place: Place, expected: int, timeout: float) -> list[Seen]:
    """Drain the place's queue in order (consumed: what was read is kept on the place)."""
    import time

    out: list[Seen] = place.extra.setdefault("seen", [])

    async def drain(ch: Any) -> None:
        queue = await ch.get_queue(place.extra["queue"], ensure=False)
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            message = await queue.get(no_ack=True, fail=False)
            if message is None:
                if len(out) >= expected and time.monotonic() - quiet_since > 1.0:
                    return
                await asyncio.sleep(0.05)
                continue
            quiet_since = time.monotonic()
            headers = dict(message.headers or {})
            key = headers.pop("Sluice-Key", "")
            tomb = headers.pop("Sluice-Tombstone", False)
            flat: list[tuple[str, str]] = []
            for k, v in headers.items():
                for item in v if isinstance(v, list) else [v]:
                    flat.append((k, item.decode() if isinstance(item, bytes) else str(item)))
            key = key.decode() if isinstance(key, bytes) else str(key)
            out.append((key, None if tomb else message.body, flat))

    run(_rabbit(drain))
    return list(out)


# -- Redis -------------------------------------------------------------------------------------------
def _read_redis(place: Place, topic: str | None) -> list[Seen]:
    import redis

    from sluiceway.brokers.redis import from_fields, raw_stream_replies

    client = raw_stream_replies(redis.Redis.from_url(place.url))
    streams = [topic.encode()] if topic else sorted(client.scan_iter(match=f"{place.prefix}.*", count=1000))
    out: list[Seen] = []
    for stream in streams:
        last = "-"
        while True:
            entries = client.execute_command("XRANGE", stream, last, "+", "COUNT", 5000)
            if not entries:
                break
            for _entry_id, fields in entries:
                out.append(from_fields(fields))
            last = "(" + entries[-1][0].decode()
    client.close()
    return out


def seqs(seen: list[Seen]) -> list[tuple[str, int]]:
    """(key, seq) of messages whose value is ``{"seq": n}``."""
    return [(key, json.loads(value)["seq"]) for key, value, _ in seen if value is not None]


# -- a TCP proxy the test can cut -----------------------------------------------------------------------
class CuttableProxy:
    """Forwards a loopback port to a broker. ``cut()`` closes every connection (dropping what was
    held) and refuses new ones (accepted, then closed at once) until ``restore()``.

    It can also part "handed to the client library" from "acknowledged by the broker": with
    ``delay`` every byte a client sends reaches the broker that much later, and ``hold()`` keeps
    them back until ``release()`` (or a ``cut()`` loses them). Replies pass at once. ``port``: the
    port to listen on (a Kafka broker must advertise the proxy's address to be reached through it).
    """

    def __init__(self, upstream_port: int, *, port: int = 0, delay: float = 0.0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.delay = delay
        self.held = False
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", port))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket, _Pipe, _Pipe]] = []
        self._cut = False
        self._closed = False
        self.cuts = 0
        self.refused = 0  # connections refused while cut
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, broker: str) -> str:
        return {
            "nats": f"nats://127.0.0.1:{self.port}",
            "rabbitmq": f"amqp://guest:guest@127.0.0.1:{self.port}/",
            "redis": f"redis://127.0.0.1:{self.port}/0",
            "kafka": f"127.0.0.1:{self.port}",
        }[broker]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    self.refused += 1
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    client.close()
                    continue
                upstream.settimeout(None)
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                up = _Pipe(self, client, upstream, delayed=True)
                down = _Pipe(self, upstream, client, delayed=False)
                self._conns.append((client, upstream, up, down))

    def hold(self) -> None:
        """Keep back what clients send from now on (connections stay open)."""
        self.held = True

    def release(self) -> None:
        """Send on, in order, what was held."""
        self.held = False

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self.cuts += 1
            conns, self._conns = self._conns, []
        for client, upstream, *pipes in conns:
            for pipe in pipes:
                pipe.drop()  # held or delayed: lost, as on a network that went away
            _hang_up(client)
            _hang_up(upstream)
        self.held = False

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._server.close()


class _Pipe:
    """One direction of one proxied connection: chunks read, each sent on once its time has come
    (``delay`` later, and not while held, when ``delayed``)."""

    def __init__(
        self, proxy: CuttableProxy, source: socket.socket, sink: socket.socket, *, delayed: bool
    ) -> None:
        self.proxy, self.source, self.sink, self.delayed = proxy, source, sink, delayed
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.ready = threading.Condition()
        self.ended = False
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.source.recv(65536)
                if not data:
                    break
                due = time.monotonic() + (self.proxy.delay if self.delayed else 0.0)
                with self.ready:
                    self.chunks.append((due, data))
                    self.ready.notify_all()
        except OSError:
            pass
        with self.ready:
            self.ended = True
            self.ready.notify_all()

    def _next(self) -> bytes | None:
        with self.ready:
            while True:
                held = self.delayed and self.proxy.held
                if self.chunks and not held and self.chunks[0][0] <= time.monotonic():
                    return self.chunks.popleft()[1]
                if self.ended and not self.chunks:
                    return None
                self.ready.wait(0.005)

    def _write(self) -> None:
        try:
            while (data := self._next()) is not None:
                self.sink.sendall(data)
        except OSError:
            pass
        _hang_up(self.sink)

    def drop(self) -> None:
        with self.ready:
            self.chunks.clear()


def _hang_up(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
