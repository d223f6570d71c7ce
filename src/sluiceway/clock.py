"""Local time, injected: state machines read it through a ``Clock`` so tests move it by hand.

Only intervals are measured with it (renewal deadlines, heartbeat windows). Whether a lease has
*expired* is always decided by the database's clock, never by this one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where a component reads local monotonic time (seconds)."""

    def monotonic(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()
