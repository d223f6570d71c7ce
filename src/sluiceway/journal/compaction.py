"""Compaction of closed segments: keep the latest record per key below the consumers' horizon.

A record may be dropped when every named consumer has read past it (``offset < horizon``) and a
later record with the same key — ``(namespace, key)`` — exists. Kept records keep their offsets.
A batch that lost no record is copied byte for byte, in whichever format it was written; a
batch that lost records is re-encoded from its (verified) records as a format-2 BATCH frame
with a fresh checksum, flagged ``COMPACTED`` because its offsets now have gaps — so compacting
a segment of format 1 can leave it holding both formats. The active segment is never
compacted. Tombstones are kept like any other latest record.

The selection is pure (``latest_offsets``, ``select_removals``, ``compact_segment_bytes``) and
unit-tested; :mod:`sluiceway.journal.maintenance` does the file replacement (temporary file,
fsync, rename).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluiceway.journal.encode import encode_batch, encode_records
from sluiceway.journal.format import FLAG_COMPACTED, SegmentHeader, encode_pairs
from sluiceway.journal.parse import Incomplete, Invalid, ParsedBatch, iter_keys, iter_records, parse_batch

Key = tuple[bytes, bytes]


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What :meth:`Journal.compact` did."""

    horizon: int  # records below this offset were candidates
    segments_rewritten: int
    records_removed: int
    bytes_before: int
    bytes_after: int
    segments_expired: int


def compaction_horizon(consumer_offsets: Mapping[str, int], explicit: int | None) -> int:
    """The offset below which every named consumer has read (lowered by ``explicit`` if given).

    With no named consumers and no explicit horizon nothing is known to be consumed, so the
    horizon is 0 and nothing is removed.
    """
    candidates = list(consumer_offsets.values())
    if explicit is not None:
        candidates.append(explicit)
    return max(0, min(candidates)) if candidates else 0


def latest_offsets(entries: Iterable[tuple[int, bytes, bytes]]) -> dict[Key, int]:
    """The highest offset of each ``(namespace, key)``."""
    latest: dict[Key, int] = {}
    for offset, ns, key in entries:
        k = (ns, key)
        if latest.get(k, -1) < offset:
            latest[k] = offset
    return latest


def select_removals(
    entries: Iterable[tuple[int, bytes, bytes]], latest: Mapping[Key, int], horizon: int
) -> set[int]:
    """Offsets among ``entries`` that compaction may drop."""
    return {off for off, ns, key in entries if off < horizon and latest.get((ns, key), off) > off}


def segment_batches(buf: bytes, header: SegmentHeader) -> list[ParsedBatch]:
    """Every batch of a closed segment, verified; ``ValueError`` if any is damaged."""
    out: list[ParsedBatch] = []
    pos = header.data_start
    while pos < len(buf):
        parsed = parse_batch(buf, pos)
        if isinstance(parsed, Incomplete | Invalid):
            reason = parsed.reason if isinstance(parsed, Invalid) else "truncated batch"
            raise ValueError(f"byte {pos}: {reason}")
        if not parsed.records_ok(buf):
            raise ValueError(f"byte {pos}: records checksum mismatch")
        out.append(parsed)
        pos = parsed.next_pos
    return out


def compact_segment_bytes(buf: bytes, batches: Iterable[ParsedBatch], drop: set[int]) -> tuple[bytes, int]:
    """The batches of a segment (everything after its header) without the records in ``drop``.

    Returns ``(body, records removed)``. A batch left with no records and no register updates
    disappears; its offsets become a gap that readers step over.
    """
    parts: list[bytes] = []
    removed = 0
    for batch in batches:
        gone = sum(1 for offset, _ns, _key in iter_keys(buf, batch) if offset in drop)
        if not gone:
            parts.append(buf[batch.pos : batch.next_pos])
            continue
        removed += gone
        kept = [r for r in iter_records(buf, batch, batch.first, batch.end) if r.offset not in drop]
        if not kept and not batch.registers:
            continue
        records = encode_records(
            [r.key.encode() for r in kept],
            [r.value for r in kept],
            [r.namespace.encode() for r in kept],
            [encode_pairs(r.headers) for r in kept],
            [r.timestamp_us for r in kept],
            offsets=[r.offset - batch.first for r in kept],
        )
        parts.extend(
            encode_batch(
                records,
                batch.first,
                batch.commit_time_us,
                batch.registers,
                end=batch.end,
                flags=batch.flags | FLAG_COMPACTED,
            )
        )
    return b"".join(parts), removed
