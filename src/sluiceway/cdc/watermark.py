"""The copy's watermarks: typed values with one encoding (pure).

A watermark is a non-transactional logical decoding message under the slot's prefix, so it takes
its place in the stream between transactions. Its content is short text, kept as it was written
by earlier versions (a slot may hold watermarks written before an upgrade):

* ``L <chunk> <schema.table>`` — a chunk's window opens (its rows are about to be read);
* ``H <chunk>`` — the window closes: the chunk's rows take their place in the stream here;
* ``A <chunk>`` — the window closes without rows (its reader gave up, or died and was replaced);
* ``T <schema.table>`` — the table's copy is complete;
* ``P`` — a heartbeat: nothing but a position (lets the slot move on, marks a point to catch up to).

>>> Watermark.parse(Watermark.opened(3, "public.orders").encode())
Watermark(kind=<Mark.OPEN: 'L'>, chunk=3, namespace='public.orders')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sluiceway.errors import InvariantViolation


class Mark(enum.StrEnum):
    OPEN = "L"
    CLOSE = "H"
    ABANDON = "A"
    COMPLETE = "T"
    HEARTBEAT = "P"


@dataclass(frozen=True, slots=True)
class Watermark:
    kind: Mark
    chunk: int | None = None
    namespace: str | None = None

    @classmethod
    def opened(cls, chunk: int, namespace: str) -> Watermark:
        return cls(Mark.OPEN, chunk, namespace)

    @classmethod
    def closed(cls, chunk: int) -> Watermark:
        return cls(Mark.CLOSE, chunk)

    @classmethod
    def abandoned(cls, chunk: int) -> Watermark:
        return cls(Mark.ABANDON, chunk)

    @classmethod
    def completed(cls, namespace: str) -> Watermark:
        return cls(Mark.COMPLETE, namespace=namespace)

    @classmethod
    def heartbeat(cls) -> Watermark:
        return cls(Mark.HEARTBEAT)

    @property
    def closes(self) -> bool:
        """An ``H`` or an ``A``: the end of a chunk's window."""
        return self.kind in (Mark.CLOSE, Mark.ABANDON)

    def encode(self) -> str:
        parts = [self.kind.value]
        if self.chunk is not None:
            parts.append(str(self.chunk))
        if self.namespace is not None:
            parts.append(self.namespace)
        return " ".join(parts)

    @classmethod
    def parse(cls, content: bytes | str) -> Watermark:
        """The watermark ``content`` encodes; :class:`InvariantViolation` if it is none of ours."""
        text = content.decode() if isinstance(content, bytes | bytearray) else content
        kind_text, _, rest = text.partition(" ")
        try:
            kind = Mark(kind_text)
            if kind is Mark.OPEN:
                chunk, _, namespace = rest.partition(" ")
                if not namespace:
                    raise ValueError("no table")
                return cls(kind, int(chunk), namespace)
            if kind in (Mark.CLOSE, Mark.ABANDON):
                return cls(kind, int(rest))
            if kind is Mark.COMPLETE:
                if not rest:
                    raise ValueError("no table")
                return cls(kind, namespace=rest)
            return cls(kind)
        except ValueError as exc:
            raise InvariantViolation(f"not a copy watermark: {text!r} ({exc})") from None


def prefix(slot: str) -> str:
    """The logical message prefix of a slot's watermarks (other slots' are passed over)."""
    return f"sluice-cdc:{slot}"
