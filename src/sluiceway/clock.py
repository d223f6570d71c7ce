"""Local time, injected: state machines read it through a ``Clock`` so tests move it by hand.

Only intervals are measured with it (renewal deadlines, heartbeat windows). Whether a lease has
*expired* is always decided by the database's clock, never by this one.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Protocol, TypeVar

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_Number = TypeVar("_Number", int, float)
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(value: object) -> float:
    """Seconds from a Go-style duration (``500ms``, ``1m30s``) or a number of seconds.

    The one duration grammar: configuration files, ``sluice feed add --in`` and a feed
    processor's ``retry_in`` all read it. Raises ``ValueError`` (callers say where the value was).

    >>> duration_seconds("1m30s"), duration_seconds(2)
    (90.0, 2.0)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '500ms' or '5s', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        # Compared before float(), which overflows on a long enough integer.
        return float(_not_too_long(value))
    if isinstance(value, str):
        text = value.strip()
        if text == "0":
            return 0.0
        pos, total = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos == len(text) and pos > 0:
            return _not_too_long(total)
    raise ValueError(f"expected a duration like '500ms', '5s' or '1m30s', got {value!r}")


#: The longest duration accepted, in seconds: the longest a thread can wait (about 292 years).
LONGEST_DURATION = threading.TIMEOUT_MAX


def _not_too_long(seconds: _Number) -> _Number:
    if not seconds <= LONGEST_DURATION:  # NaN too
        raise ValueError(f"expected a duration of at most {LONGEST_DURATION:.0f} seconds (about 292 years)")
    return seconds


class Clock(Protocol):
    """Where a component reads local monotonic time (seconds)."""

    def monotonic(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()
