"""A reaper process for chaos tests: the real Harvest, optionally with a fault-injecting publisher.

Usage: python -m tests.support.faulty_reaper CONFIG.yaml [FAULT_RATE] [SEED]
Events go to stderr, one per line, so the test can tell who leads.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Callable

from sluiceway.errors import PublishError
from sluiceway.harvest import Harvest, HarvestConfig
from sluiceway.harvest.ports import Delivery, Publisher
from sluiceway.outbox.record import MarkedRecord

#: The line a faulty reaper writes to stderr (its log) for every acknowledgement it pretends to lose.
ACK_LOST = "FAULT ack-lost"


class PoisonError(PublishError):
    permanent = True


class FaultyPublisher:
    """Wraps a real publisher; fails ``rate`` of sends in three ways: refused before sending,
    sent but reported failed (a lost ack: the broker has it, we think not), or dropped and
    reported failed."""

    def __init__(self, inner: Publisher, rate: float, seed: int) -> None:
        self.inner = inner
        self.inline = bool(getattr(inner, "inline", False))  # send where the real one would be sent
        self.rate = rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        # SLUICE_CHAOS_POISON=KEY:SEQ:FLAGFILE: that record is refused for good while FLAGFILE exists.
        key, _, rest = os.environ.get("SLUICE_CHAOS_POISON", "").partition(":")
        seq, _, self.poison_flag = rest.partition(":")
        self.poison = (key, b'{"seq": %d}' % int(seq)) if key else None

    def send(self, record: MarkedRecord, on_done: Callable[[Delivery], None]) -> None:
        if self.poison == (record.key, record.value) and os.path.exists(self.poison_flag):
            raise PoisonError("injected fault: poison record")
        with self.lock:
            roll = self.rng.random()
            mode = self.rng.randrange(3)
        if roll >= self.rate:
            self.inner.send(record, on_done)
            return
        if mode == 0:
            raise PublishError("injected fault: refused")
        if mode == 1:
            # Counted by the chaos tests: each lost ack may put one extra copy on the topic. One
            # write (print's text and newline are two), so send threads' lines never merge.
            sys.stderr.write(ACK_LOST + "\n")
            sys.stderr.flush()
            self.inner.send(record, lambda d: on_done(Delivery(record, error="injected fault: ack lost")))
            return
        on_done(Delivery(record, error="injected fault: dropped"))

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def close(self) -> None:
        self.inner.close()


def main() -> None:
    path = sys.argv[1]
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    config = HarvestConfig.from_file(path)
    harvest = Harvest(config)
    if rate > 0 or os.environ.get("SLUICE_CHAOS_POISON"):
        base = harvest._publisher_factory
        harvest._publisher_factory = lambda epoch: FaultyPublisher(base(epoch), rate, seed + epoch)
    harvest.set_event_handler(
        lambda e: (
            print(f"EVENT {type(e).__name__} {e}", file=sys.stderr, flush=True)
            if type(e).__name__ != "MeterRead"
            else None
        )
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    harvest.start()
    print("EVENT Started", file=sys.stderr, flush=True)
    while not done.is_set() and not harvest.wait(0.2):
        pass
    harvest.stop()
    print("EVENT Stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
