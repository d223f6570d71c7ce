"""The Sender's rules with a scripted in-memory broker client: per-key order across retries, the
window, the delivery timeout, permanent errors, leadership, closing. No network."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest

from sluiceway.brokers import Ack, Message, Sender
from sluiceway.config.brokers import BrokerSettings
from sluiceway.errors import BrokerError

Script = Callable[[Message, int], Ack | BrokerError]


class FakeClient:
    """Answers each attempt through ``script(message, attempt_number)``; records every attempt."""

    broker = "fake"

    def __init__(self, script: Script, delay: float = 0.001) -> None:
        self.script = script
        self.delay = delay
        self.attempts: list[Message] = []
        self.tries: dict[str, int] = defaultdict(int)
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_keys: set[str] = set()
        self.overlap: list[str] = []  # keys attempted while an earlier message of theirs was unacked
        self.lock = threading.Lock()
        self.connects = 0

    async def connect(self) -> None:
        self.connects += 1

    async def check(self) -> None:
        await self.connect()

    async def publish(
        self, messages: Sequence[Message], *, positions: bool = True
    ) -> list[Ack | BrokerError]:
        for m in messages:
            if m.key in self.in_flight_keys:
                self.overlap.append(m.key)
            self.in_flight_keys.add(m.key)
            self.attempts.append(m)
        self.in_flight += len(messages)
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        out = []
        for m in messages:
            self.tries[m.msg_id] += 1
            out.append(self.script(m, self.tries[m.msg_id]))
            self.in_flight_keys.discard(m.key)
        self.in_flight -= len(messages)
        return out

    async def close(self) -> None:
        pass


def settings(**kw: object) -> BrokerSettings:
    base = {"backoff": 0.001, "max_backoff": 0.01, "delivery_timeout": 5.0, "max_in_flight": 1000}
    return BrokerSettings.model_validate({**base, **kw})


def messages(keys: int, per_key: int) -> list[Message]:
    return [
        Message("t", f"k{k}", str(s).encode(), (), f"k{k}/{s}")
        for s in range(1, per_key + 1)
        for k in range(keys)
    ]


def submit_all(sender: Sender, msgs: list[Message]) -> dict[str, Ack | BrokerError]:
    outcomes: dict[str, Ack | BrokerError] = {}
    lock = threading.Lock()

    def done_for(m: Message) -> Callable[[Ack | BrokerError], None]:
        def done(outcome: Ack | BrokerError) -> None:
            with lock:
                assert m.msg_id not in outcomes, f"done called twice for {m.msg_id}"
                outcomes[m.msg_id] = outcome

        return done

    for m in msgs:
        sender.submit(m, done_for(m))
    return outcomes


def flaky(every: int) -> Script:
    """Every ``every``-th message fails its first attempt (a lost acknowledgement)."""

    def script(m: Message, attempt: int) -> Ack | BrokerError:
        seq = int(m.msg_id.split("/")[1])
        if seq % every == 0 and attempt == 1:
            return BrokerError("fake", "publish", "connection lost", retriable=True)
        return Ack()

    return script


def test_retries_never_let_a_key_overtake_itself() -> None:
    client = FakeClient(flaky(3))
    sender = Sender(client, settings())
    outcomes = submit_all(sender, messages(keys=20, per_key=30))
    assert sender.flush(10) == 0
    sender.close()
    assert all(isinstance(o, Ack) for o in outcomes.values())
    assert client.overlap == []  # never two messages of a key awaiting acknowledgement
    by_key: dict[str, list[int]] = defaultdict(list)
    for m in client.attempts:
        by_key[m.key].append(int(m.msg_id.split("/")[1]))
    for key, seqs in by_key.items():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        assert collapsed == list(range(1, 31)), key  # 1 2 3 3 4…: a retry is an immediate repeat
        assert len(seqs) == 30 + 10  # every third sent twice


def test_window_bounds_messages_awaiting_acknowledgement() -> None:
    client = FakeClient(lambda m, a: Ack(), delay=0.005)
    sender = Sender(client, settings(max_in_flight=7))
    submit_all(sender, messages(keys=50, per_key=4))
    assert sender.flush(10) == 0
    sender.close()
    assert 1 < client.max_in_flight <= 7


class FakeClock:
    """Local time moved by hand (``sluiceway.clock.Clock``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_delivery_timeout_fails_a_message_the_broker_never_acknowledges() -> None:
    clock = FakeClock()
    never = BrokerError("fake", "publish", "no acknowledgement in time", retriable=True)

    def script(m: Message, attempt: int) -> Ack | BrokerError:
        if m.key != "k0":
            return Ack()
        if attempt == 3:
            clock.now = 30.0  # the third attempt outlasts the delivery timeout
        return never

    client = FakeClient(script, delay=0)
    sender = Sender(client, settings(delivery_timeout=30.0, backoff=0, max_backoff=0), clock=clock)
    outcomes = submit_all(sender, messages(keys=2, per_key=1))
    assert sender.flush(5) == 0
    sender.close()
    assert isinstance(outcomes["k1/1"], Ack)
    failed = outcomes["k0/1"]
    assert isinstance(failed, BrokerError) and not failed.permanent
    assert client.tries["k0/1"] == 3  # retried while within the timeout, failed at once past it


def test_permanent_error_fails_at_once() -> None:
    too_big = BrokerError("fake", "publish", "maximum payload exceeded", permanent=True)
    client = FakeClient(lambda m, a: too_big)
    sender = Sender(client, settings())
    outcomes = submit_all(sender, messages(keys=1, per_key=1))
    assert sender.flush(5) == 0
    sender.close()
    assert outcomes["k0/1"] is too_big
    assert client.tries["k0/1"] == 1


def test_no_attempt_once_no_longer_the_leader() -> None:
    leading = threading.Event()
    client = FakeClient(lambda m, a: Ack())
    sender = Sender(client, settings(), may_send=leading.is_set)
    outcomes = submit_all(sender, messages(keys=3, per_key=1))
    assert sender.flush(5) == 0
    sender.close()
    assert client.attempts == []
    assert all(isinstance(o, BrokerError) and "leader" in o.problem for o in outcomes.values())


def test_a_failed_message_stops_its_key_when_asked() -> None:
    dead = BrokerError("fake", "publish", "refused", permanent=True)
    client = FakeClient(lambda m, a: dead if m.msg_id == "k0/2" else Ack())
    sender = Sender(client, settings(), stop_key_on_failure=True)
    outcomes = submit_all(sender, messages(keys=2, per_key=4))
    assert sender.flush(5) == 0
    sender.close()
    assert [m.msg_id for m in client.attempts if m.key == "k0"] == ["k0/1", "k0/2"]
    assert all(isinstance(outcomes[f"k0/{s}"], BrokerError) for s in (2, 3, 4))
    assert all(isinstance(outcomes[f"k1/{s}"], Ack) for s in (1, 2, 3, 4))


def test_close_fails_what_is_left_exactly_once() -> None:
    gate = threading.Event()

    def script(m: Message, attempt: int) -> Ack | BrokerError:
        return Ack() if gate.is_set() else BrokerError("fake", "publish", "down", retriable=True)

    client = FakeClient(script)
    sender = Sender(client, settings(delivery_timeout=60))
    outcomes = submit_all(sender, messages(keys=3, per_key=3))
    sender.close(timeout=0.2)
    assert len(outcomes) == 9  # every message done, each once (submit_all asserts "once")
    assert all(isinstance(o, BrokerError) for o in outcomes.values())
    with pytest.raises(BrokerError):
        sender.submit(Message("t", "k", b""), lambda o: None)


def test_warning_throttle_writes_one_line_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sluiceway.brokers.sender import WarningThrottle

    now = [0.0]
    throttle = WarningThrottle(logging.getLogger("test.throttle"), 10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.throttle")
    throttle.resolved("never in trouble")  # nothing to say
    for now[0] in (0.0, 1.0, 2.0, 9.9, 10.0, 12.0):
        throttle.warn("nats: down (%s)", "refused")
    throttle.resolved("nats: back")
    throttle.warn("nats: down again")  # a new trouble: at once, whatever the interval
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "nats: down (refused)"),
        ("WARNING", "nats: down (refused) (3 more such warnings held back)"),
        ("INFO", "nats: back (1 more warnings held back since the last one)"),
        ("WARNING", "nats: down again"),
    ]
