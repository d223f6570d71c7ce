"""Deciding what survives a crash: pure functions over the bytes of the last segment.

Only the last (active) segment can have a torn tail: closed segments were made durable before
the next one was created. The writer publishes in ``HEAD`` how far the active segment was
known durable (only after its synchronous write returned), so after a crash:

* bytes beyond the last valid COMMIT *and* beyond that durable position are a torn write of
  an append that was never acknowledged — truncated;
* an invalid batch *before* the durable position is damage to acknowledged data — reported,
  never silently truncated (that would lose committed records and reassign their offsets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluiceway.journal.format import SegmentHeader
from sluiceway.journal.parse import Incomplete, Invalid, ParsedBatch, parse_batch


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    valid_end: int  # truncate the segment file to this length
    head: int  # next offset to assign
    registers: dict[str, str]
    batches: int  # committed batches found in the segment
    damaged: list[tuple[int, str]] = field(default_factory=list)  # kept batches whose records fail CRC


class DamagedSegment(Exception):
    """Acknowledged data in the segment is damaged at ``position``."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(reason)


def plan_recovery(buf: bytes, header: SegmentHeader, durable_pos: int | None) -> RecoveryPlan:
    """Scan ``buf`` (the whole last segment) and say where its committed data ends.

    ``durable_pos`` is the position HEAD says was durable in this segment, or ``None`` when
    unknown (no HEAD, or the journal runs with ``fsync=False``): everything invalid then counts
    as a torn tail.
    """
    pos = header.data_start
    head = header.base
    registers = dict(header.registers)
    damaged: list[tuple[int, str]] = []
    batches = 0
    while pos < len(buf):
        parsed = parse_batch(buf, pos)
        reason: str
        if isinstance(parsed, ParsedBatch):
            if parsed.first != head:
                reason = f"batch starts at offset {parsed.first}, expected {head}"
            elif parsed.records_ok(buf):
                head = parsed.end
                registers.update(parsed.registers)
                pos = parsed.next_pos
                batches += 1
                continue
            elif durable_pos is not None and parsed.next_pos <= durable_pos:
                # Acknowledged, structurally intact, payload damaged: keep it so offsets stay
                # assigned and the rest of the segment stays readable; reads of it will fail.
                damaged.append((pos, "records checksum mismatch"))
                head = parsed.end
                registers.update(parsed.registers)
                pos = parsed.next_pos
                batches += 1
                continue
            else:
                reason = "records checksum mismatch"
        elif isinstance(parsed, Incomplete):
            reason = "truncated batch"
        else:
            assert isinstance(parsed, Invalid)
            reason = parsed.reason
        if durable_pos is not None and pos < durable_pos:
            raise DamagedSegment(pos, reason)
        break
    return RecoveryPlan(valid_end=pos, head=head, registers=registers, batches=batches, damaged=damaged)


def scan_committed(buf: bytes, header: SegmentHeader, limit: int | None = None) -> RecoveryPlan:
    """Where committed data ends, reading only (no durable position: stops at the first invalid batch)."""
    data = buf if limit is None else buf[:limit]
    return plan_recovery(data, header, None)
