"""Publishing to a broker from a background asyncio loop: per-key order, a window, retries.

Callers on any thread ``submit(message, done)``; ``done(outcome)`` is called exactly once per
message, from the loop's thread, with an :class:`Ack` or a :class:`BrokerError`.

Order. At most one message per key awaits its acknowledgement; a key's next message waits in the
key's queue until its predecessor is done (acknowledged, or given up). A retried message is
therefore never overtaken by its key's successor: the broker sees ``1 2 2 3`` at worst, never
``1 2 1 3``. (The harvester submits one record per key at a time anyway — its barrier — so for it
the queue is always empty; a pipeline sink submits whole batches and relies on it.)

Pipelining. Across keys, up to ``max_in_flight`` messages await acknowledgements at once; the
messages ready at one moment go to the client as one call (one NATS flush, one Redis pipeline,
one burst of RabbitMQ publishes on one channel).

Failures. A retriable error (connection lost, no acknowledgement within ``ack_timeout``) sends the
message again after a backoff (doubling from ``backoff`` to ``max_backoff``), reconnecting first,
until ``delivery_timeout`` has passed since it was submitted; then it fails. A permanent error
fails it at once. While the broker stays away, one warning is logged when the trouble starts and
then at most one per ``WARN_INTERVAL`` (with the count held back), and one line when publishing
works again: a broker down for an hour is a few hundred lines, not one per retry per batch.

Leadership. Before every attempt ``may_send()`` is asked: a harvester that is no longer the
leader starts no new attempt (its successor may already be publishing the same keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluiceway.brokers.message import Ack, BrokerClient, Message
from sluiceway.clock import Clock, SystemClock
from sluiceway.config.brokers import BrokerSettings
from sluiceway.errors import BrokerError
from sluiceway.outage import WARN_INTERVAL as WARN_INTERVAL  # re-exported: its home until now
from sluiceway.outage import WarningThrottle as WarningThrottle

log = logging.getLogger("sluiceway.brokers")

Outcome = Ack | BrokerError
Done = Callable[[Outcome], None]


@dataclass(slots=True, eq=False)
class _Item:
    message: Message
    done: Done
    submitted: float
    attempts: int = 0
    last_error: BrokerError | None = field(default=None)


class Sender:
    """Publishes through one :class:`BrokerClient` from a loop thread of its own. ``clock``
    measures the delivery timeout (a test moves it by hand).

    For example::

        from sluiceway.brokers import open_client
        from sluiceway.config.brokers import RedisSettings
        settings = RedisSettings(url="redis://127.0.0.1:6379/0")
        sender = Sender(open_client(settings), settings)
        sender.submit(Message("orders", "o-1", b"{}"), lambda outcome: print(outcome))
        sender.flush(5.0)  # messages not done yet
        # Ack(position=..., duplicate=False)
        # 0
        sender.close()
    """

    def __init__(
        self,
        client: BrokerClient,
        settings: BrokerSettings,
        *,
        may_send: Callable[[], bool] = lambda: True,
        stop_key_on_failure: bool = False,
        retry_refused: bool = True,
        continue_after_refusal: bool = False,
        name: str = "",
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.clock: Clock = clock or SystemClock()
        #: A failed message fails the messages queued behind it for the same key too (a sink that
        #: hands over whole batches: nothing of a key may be published after its failed record).
        self.stop_key_on_failure = stop_key_on_failure
        #: A message the broker refused by a rule of its set-up (``BrokerError.refused``) is tried
        #: again like a lost one (the harvester: the set-up may be fixed meanwhile), or fails at once.
        self.retry_refused = retry_refused
        #: With ``stop_key_on_failure``: a key's later messages still go after one that failed
        #: for good (permanent or refused) — its sender handles that one (``sluice capture``'s
        #: dead letters) — and fail unsent only after a failure that may be passing.
        self.continue_after_refusal = continue_after_refusal
        self.broker = client.broker
        self.settings = settings
        self.may_send = may_send
        self._loop = asyncio.new_event_loop()
        # Submissions cross threads through a deque (appends are atomic) and one scheduled wake-up.
        self._incoming: deque[_Item] = deque()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        # Submitted, done not yet called; a plain lock (the hot path takes it twice per message)
        # and an event that flush() waits on.
        self._outstanding = 0
        self._count_lock = threading.Lock()
        self._drained = threading.Event()
        self._drained.set()
        self._closing = False
        # Loop-side state (touched only on the loop thread). A key's head — the one message of it
        # in the window or waiting for a slot — is in _heads; only a key with more messages
        # queued has a deque in _behind (most keys never do: no deque made per message).
        self._heads: dict[str, _Item] = {}
        self._behind: dict[str, deque[_Item]] = {}
        self._ready: deque[_Item] = deque()  # heads waiting for a window slot
        self._launch_soon = False  # a _launch is scheduled for this turn of the loop
        # submit_ordered's batches, and the one task that sends them in turn.
        self._ordered: deque[tuple[list[Message], Callable[[list[Outcome]], None]]] = deque()
        self._ordered_task: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop_event: asyncio.Event | None = None
        self._connect_lock: asyncio.Lock
        self._warnings = WarningThrottle(log, clock=self.clock.monotonic)
        self._thread = threading.Thread(
            target=self._run_loop, name=f"sluice-{self.broker}{'-' + name if name else ''}", daemon=True
        )
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------
    def submit(self, message: Message, done: Done) -> None:
        self.submit_many([(message, done)])

    def submit_many(self, submissions: list[tuple[Message, Done]]) -> None:
        """:meth:`submit` for several messages, in order, at the cost of one: one count, one
        hand-over to the loop, one wake-up."""
        if not submissions:
            return
        if self._closing:
            topic = submissions[0][0].topic
            raise BrokerError(self.broker, "publish", "the publisher is closed", target=topic)
        with self._count_lock:
            self._outstanding += len(submissions)
            if self._drained.is_set():
                self._drained.clear()
        now = self.clock.monotonic()
        self._incoming.extend([_Item(message, done, now) for message, done in submissions])
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._drain)

    def submit_ordered(self, messages: list[Message], done: Callable[[list[Outcome]], None]) -> None:
        """``messages`` as one attempt of their own, after every ordered batch submitted before it
        is done (one at a time, so one connection carries them), their outcomes reported together
        (acknowledgements without a position: the caller counts them).

        For a client whose broker applies a connection's messages in the order they were sent
        (``client.in_order``: Redis) a key's messages then stay in order with no per-key
        bookkeeping, which costs more than the publishing itself at a hundred thousand messages a
        second. Nothing is retried: a failed message is reported, and the caller sends again from
        where it can trust (``sluice capture`` ends its term). Not for keys also sent by
        :meth:`submit`.
        """
        if not messages:
            done([])
            return
        if self._closing:
            raise BrokerError(self.broker, "publish", "the publisher is closed", target=messages[0].topic)
        with self._count_lock:
            self._outstanding += len(messages)
            if self._drained.is_set():
                self._drained.clear()
        self._loop.call_soon_threadsafe(self._queue_ordered, messages, done)

    def flush(self, timeout: float) -> int:
        """Wait until every submitted message is done; return how many are not."""
        self._drained.wait(timeout)
        return self._outstanding

    def close(self, timeout: float = 5.0) -> None:
        """Let outstanding messages finish for up to ``timeout`` s, then fail the rest (their
        ``done`` is called with an error) and disconnect."""
        if self._closing:
            return
        self.flush(timeout)
        self._closing = True
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            future.result(timeout + 5)
        except Exception:
            log.warning("%s: closing the client failed", self.broker, exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # -- loop thread -----------------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop_event = asyncio.Event()
        self._connect_lock = asyncio.Lock()
        self._loop.run_forever()

    def _drain(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        incoming, heads, ready = self._incoming, self._heads, self._ready
        while incoming:
            item = incoming.popleft()
            key = item.message.key
            if key in heads:  # behind the key's message in flight
                behind = self._behind.get(key)
                if behind is None:
                    self._behind[key] = deque((item,))
                else:
                    behind.append(item)
            else:
                heads[key] = item
                ready.append(item)
        self._launch()

    def _queue_ordered(self, messages: list[Message], done: Callable[[list[Outcome]], None]) -> None:
        self._ordered.append((messages, done))
        if self._ordered_task is None:
            self._ordered_task = self._loop.create_task(self._deliver_ordered())
            self._tasks.add(self._ordered_task)

    async def _deliver_ordered(self) -> None:
        """The ordered batches in turn (see :meth:`submit_ordered`): whatever queued up while an
        attempt was out goes as the next attempt, together (up to ``max_in_flight`` messages), so
        the round trips are shared as a group commit shares its flush."""
        limit = self.settings.max_in_flight
        taken: list[tuple[list[Message], Callable[[list[Outcome]], None]]] = []
        try:
            while self._ordered:
                taken = [self._ordered.popleft()]
                size = len(taken[0][0])
                while self._ordered and size + len(self._ordered[0][0]) <= limit:
                    size += len(self._ordered[0][0])
                    taken.append(self._ordered.popleft())
                messages = [m for batch, _ in taken for m in batch]
                if self._closing:
                    why = "the publisher closed"
                elif not self.may_send():
                    why = "no longer the leader: not sent"
                else:
                    why = ""
                if why:
                    outcomes: list[Outcome] = [
                        BrokerError(self.broker, "publish", why, target=m.topic) for m in messages
                    ]
                else:
                    outcomes = await self._attempt(messages, positions=False)  # counted, not placed
                at, reporting = 0, taken
                taken = []
                for batch, done in reporting:
                    self._report_ordered(batch, done, outcomes[at : at + len(batch)])
                    at += len(batch)
        except asyncio.CancelledError:
            # The attempt cut short and what waited behind it: each batch reported once, failed.
            for messages, done in [*taken, *self._ordered]:
                closed = BrokerError(self.broker, "publish", "the publisher closed", target=messages[0].topic)
                self._report_ordered(messages, done, [closed] * len(messages))
            self._ordered.clear()
            raise
        finally:
            if self._ordered_task is not None:
                self._tasks.discard(self._ordered_task)
            self._ordered_task = None

    def _report_ordered(
        self, messages: list[Message], done: Callable[[list[Outcome]], None], outcomes: list[Outcome]
    ) -> None:
        try:
            done(outcomes)
        except Exception:
            log.exception("%s: a delivery callback raised", self.broker)
        failed = next((o for o in outcomes if o.__class__ is not Ack), None)
        if failed is not None:
            self._warnings.warn("%s: %s", self.broker, failed)
        self._completed(len(messages))

    def _launch(self) -> None:
        """Start one attempt for as many ready messages as the window allows."""
        self._launch_soon = False
        room = self.settings.max_in_flight - self._in_flight
        if room <= 0 or not self._ready or self._closing:
            return
        batch: list[_Item] = []
        while self._ready and len(batch) < room:
            batch.append(self._ready.popleft())
        self._in_flight += len(batch)
        task = self._loop.create_task(self._deliver(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, batch: list[_Item]) -> None:
        backoff = self.settings.backoff
        try:
            while batch:
                if self._closing:
                    self._give_up(batch, "the publisher closed before the broker acknowledged")
                    return
                if not self.may_send():
                    self._give_up(batch, "no longer the leader: not sent again")
                    return
                outcomes = await self._attempt([item.message for item in batch])
                retry: list[_Item] = []
                now = self.clock.monotonic()
                finish, done = self._finish, 0
                for item, outcome in zip(batch, outcomes, strict=True):
                    item.attempts += 1
                    if isinstance(outcome, Ack):
                        done += finish(item, outcome)
                    elif (
                        outcome.retriable
                        and (self.retry_refused or not outcome.refused)
                        and now - item.submitted < self.settings.delivery_timeout
                    ):
                        item.last_error = outcome
                        retry.append(item)
                    else:
                        done += finish(item, outcome)
                self._completed(done)
                if retry:
                    self._warnings.warn(
                        "%s: %d of %d messages not acknowledged (%s); retrying in %.2fs",
                        self.broker,
                        len(retry),
                        len(batch),
                        retry[0].last_error,
                        backoff,
                    )
                elif any(isinstance(outcome, Ack) for outcome in outcomes):
                    self._warnings.resolved("%s: messages acknowledged again", self.broker)
                batch = retry  # before pausing: a cancellation must only fail what is left
                if batch:
                    await self._pause(backoff)
                    backoff = min(backoff * 2, self.settings.max_backoff)
        except asyncio.CancelledError:
            self._give_up(batch, "the publisher closed before the broker acknowledged")
            raise
        except Exception as exc:  # a bug in an adapter: fail the messages rather than hang them
            log.exception("%s: publishing failed unexpectedly", self.broker)
            self._give_up(batch, f"unexpected error: {type(exc).__name__}: {exc}")

    async def _attempt(self, messages: list[Message], *, positions: bool = True) -> list[Outcome]:
        try:
            # One connection attempt at a time: concurrent attempts would each replace the other's.
            async with self._connect_lock:
                await self.client.connect()
        except BrokerError as exc:
            return [exc] * len(messages)
        return await self.client.publish(messages, positions=positions)

    async def _pause(self, seconds: float) -> None:
        assert self._stop_event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    def _give_up(self, batch: list[_Item], why: str) -> None:
        done = 0
        for item in batch:
            last = f" (last error: {item.last_error.problem})" if item.last_error else ""
            done += self._finish(
                item,
                BrokerError(self.broker, "publish", why + last, target=item.message.topic, retriable=True),
            )
        self._completed(done)

    def _finish(self, item: _Item, outcome: Outcome) -> int:
        """``item`` is done: report it, and let its key's next message go (or, after a failure with
        ``stop_key_on_failure``, fail those behind it too). Returns how many messages were reported:
        the caller passes the sum to :meth:`_completed`."""
        self._in_flight -= 1
        key = item.message.key
        behind = self._behind.get(key)
        reported = 1
        if behind is None:
            del self._heads[key]
        elif (
            self.stop_key_on_failure
            and not isinstance(outcome, Ack)
            and not (self.continue_after_refusal and (outcome.permanent or outcome.refused))
        ):
            # None of these was attempted (only a key's head is), so none is in the window.
            del self._heads[key], self._behind[key]
            assert isinstance(outcome, BrokerError)
            error = BrokerError(
                self.broker,
                "publish",
                f"not sent: an earlier message of key {key!r} failed ({outcome.problem})",
                target=item.message.topic,
            )
            self._report(item, outcome)  # the cause first, then what it held back
            for later in behind:
                self._report(later, error)
            return reported + len(behind)
        else:
            nxt = self._heads[key] = behind.popleft()
            if not behind:
                del self._behind[key]
            self._ready.append(nxt)
        if self._ready and not self._launch_soon:
            # Coalesce: everything that becomes ready in this turn of the loop goes out together.
            self._launch_soon = True
            self._loop.call_soon(self._launch)
        self._report(item, outcome)
        return reported

    def _report(self, item: _Item, outcome: Outcome) -> None:
        try:
            item.done(outcome)
        except Exception:
            log.exception("%s: a delivery callback raised", self.broker)

    def _completed(self, count: int) -> None:
        """``count`` more messages reported: one update of the outstanding count for them all."""
        if count:
            with self._count_lock:
                self._outstanding -= count
                if self._outstanding == 0:
                    self._drained.set()

    async def _shutdown(self) -> None:
        assert self._stop_event is not None
        self._stop_event.set()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # Messages still queued (never attempted, or behind a key's head) fail too: done exactly
        # once each.
        self._drain()
        leftovers = [*self._heads.values(), *(item for queue in self._behind.values() for item in queue)]
        self._heads.clear()
        self._behind.clear()
        self._ready.clear()
        closed = [
            BrokerError(self.broker, "publish", "the publisher closed", target=i.message.topic)
            for i in leftovers
        ]
        for item, error in zip(leftovers, closed, strict=True):
            self._report(item, error)
        self._completed(len(leftovers))
        try:
            await self.client.close()
        except BrokerError as exc:
            log.debug("%s: close: %s", self.broker, exc)
        # What the client library left running (readers, flushers, pingers) ends with the loop, as
        # asyncio.run() would end it: cancelled and awaited, not garbage-collected half-way.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._loop.shutdown_asyncgens()
