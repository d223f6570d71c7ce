"""The cyclic garbage collector's settings for a long-running sluiceway process.

``sluice reap``, ``sluice capture`` and ``sluice feed worker`` move records through queues a
batch at a time, so the number of live container objects swings by thousands many times a
second. With CPython's default thresholds (700 net new objects per young collection, ten young
collections per middle one) that swing starts a young collection every few hundred records and
a full collection every second or so; a full one walks every object the process holds (the
configuration models, the imported modules: about 50,000 objects) and takes about 30 ms, holding
the GIL, so every other thread of the process waits. Measured on a 200,000-record drain of the
harvester: about 0.8 s of 7.5 s in the collector, 18 full collections.

:func:`tune_collector` does what long-running Python services do about it (Instagram's
``gc.freeze``, raised thresholds): what start-up made is moved out of the collector's sight —
it lives as long as the process — and a young collection waits for 50,000 net new objects, so
the queues' swings no longer reach it. Cycles are still collected, later: a process that leaks
cycles still frees them. It is process-wide, so the library never calls it for you: the CLI
calls it once it has started, and an application that embeds a :class:`~sluiceway.Harvest` or
a :class:`~sluiceway.feed.FeedWorker` in a process of its own may call it too.
"""

from __future__ import annotations

import gc

#: Net new container objects between two young collections (CPython's default is 700).
YOUNG_THRESHOLD = 50_000


def tune_collector() -> None:
    """Freeze what exists now and raise the young generation's threshold (process-wide)."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
