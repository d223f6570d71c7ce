"""Which closed segments retention expires: a pure decision over segment sizes and ages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentStat:
    base: int
    size: int
    sealed_us: int  # when the segment stopped taking appends (the next segment's creation time)


def select_expired(
    closed: Sequence[SegmentStat],
    total_bytes: int,
    *,
    retention_bytes: int | None,
    retention_age_us: int | None,
    now_us: int,
) -> list[int]:
    """Bases of the closed segments to delete, oldest first.

    ``closed`` is ordered oldest first and never includes the active segment, which is never
    expired. ``total_bytes`` is the size of all segments, the active one included. Only a prefix
    is ever expired, so the journal stays one contiguous range of offsets.
    """
    expired: list[int] = []
    for seg in closed:
        too_big = retention_bytes is not None and total_bytes > retention_bytes
        too_old = retention_age_us is not None and seg.sealed_us < now_us - retention_age_us
        if not (too_big or too_old):
            break
        expired.append(seg.base)
        total_bytes -= seg.size
    return expired
