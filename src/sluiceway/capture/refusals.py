"""Changes the destination refuses for good, and what the operator decided about them.

A change a destination can never take (a 5 MB row into NATS, whose payload limit is 1 MB; a
routing key no RabbitMQ queue is bound to, published ``mandatory``) would otherwise stop the
capture for good while its slot keeps WAL on the primary. The failure protocol the pipeline's sinks
have:

* by default the capture **stops** on it, and records the *stuck* change here — table, key,
  position, size, the destination's words — for ``sluice capture inspect``;
* ``sluice capture skip --lsn X`` (X: the stuck change's position, as ``inspect`` prints it: an
  LSN, or a binlog's ``binlog.000003:1234``)
  records a *skip*: the next term passes over exactly that change (its sequence id), counted;
* with ``deadLetter:`` configured the change goes there instead, with its refusal in headers,
  and the stream goes on, counted.

One small JSON file in the state directory, ``refusals.json``, replaced atomically: written by the
capture when it stops on a change or dead-letters one, and by ``skip``; read by ``inspect``,
``sluice status`` and the console. Nothing here is on the hot path.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluiceway.capture.mapping import INDEX_BITS
from sluiceway.cdc.errors import CdcError
from sluiceway.cdc.mysql.assemble import FILE_HEADER, split_position
from sluiceway.cdc.mysql.capture import describe_position, parse_position
from sluiceway.cdc.pgoutput import format_lsn, parse_lsn
from sluiceway.files import exclusive, write_json

FILE = "refusals.json"
#: How much of a refusal is kept (a broker's error text can be long).
MAX_REFUSAL = 2000


@dataclass(frozen=True)
class RefusedChange:
    """One change a destination refused: where it is in the stream and why it was refused."""

    #: Its sequence id (``sluice-id``): its transaction's position << 32 | its index there.
    sid: int
    table: str
    key: str
    topic: str
    #: Bytes of the message value (0 for a tombstone).
    size: int
    refusal: str
    #: When it was refused (seconds since the epoch).
    at: float = field(default_factory=time.time)
    #: Its transaction's position as the source writes it: an LSN (``0/1A2B3C8``) or a binlog's
    #: ``binlog.000003:1234`` ("": a file of an earlier version, an LSN).
    position: str = ""

    @property
    def lsn(self) -> int:
        """Its transaction's position (the ``pg.lsn`` header, ``source.lsn`` in the message)."""
        return self.sid >> INDEX_BITS

    @property
    def index(self) -> int:
        """Its place in its transaction (0 for the first change)."""
        return self.sid & ((1 << INDEX_BITS) - 1)

    @property
    def where(self) -> str:
        """Its transaction's position as ``inspect`` prints it and ``skip --lsn`` takes it."""
        return self.position or format_lsn(self.lsn)

    def describe(self) -> str:
        """One line: ``public.items key '7' at 0/1A2B3C8 (change 3 of its transaction), 5,242,880 bytes``."""
        place = f"change {self.index + 1} of its transaction"
        return f"{self.table} key {self.key!r} at {self.where} ({place}), {self.size:,} bytes"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lsn": self.where, "position": self.where}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RefusedChange:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class Refusals:
    """What ``refusals.json`` holds."""

    #: The change the capture stopped on (None: it is not stopped on one).
    stuck: RefusedChange | None = None
    #: Changes the operator chose to pass over, by sequence id, until the capture has passed them.
    skips: list[RefusedChange] = field(default_factory=list)
    #: Changes passed over so far, and sent to the dead letter destination so far.
    skipped: int = 0
    dead_lettered: int = 0
    #: The last change sent to the dead letter destination.
    last_dead_letter: RefusedChange | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "stuck": None if self.stuck is None else self.stuck.to_json(),
            "skips": [s.to_json() for s in self.skips],
            "skipped": self.skipped,
            "dead_lettered": self.dead_lettered,
            "last_dead_letter": None if self.last_dead_letter is None else self.last_dead_letter.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Refusals:
        def change(value: Any) -> RefusedChange | None:
            return None if value is None else RefusedChange.from_json(value)

        return cls(
            stuck=change(data.get("stuck")),
            skips=[RefusedChange.from_json(s) for s in data.get("skips", [])],
            skipped=int(data.get("skipped", 0)),
            dead_lettered=int(data.get("dead_lettered", 0)),
            last_dead_letter=change(data.get("last_dead_letter")),
        )


class RefusalLog:
    """``<state dir>/refusals.json``: read by anyone, changed under a lock by the capture and by
    ``sluice capture skip`` (a skip never races a capture that is recording a stuck change)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / FILE
        self._lock = Path(state_dir) / f"{FILE}.lock"

    def read(self) -> Refusals:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Refusals()
        try:
            return Refusals.from_json(json.loads(text))
        except (ValueError, TypeError, KeyError) as exc:
            raise CdcError(f"{self.path} is not a refusals file ({exc}): remove it") from None

    def _change(self, edit: Any) -> Refusals:
        with exclusive(self._lock):
            refusals = self.read()
            edit(refusals)
            write_json(self.path, refusals.to_json(), durable=True)
            return refusals

    # -- the capture --------------------------------------------------------------------------
    def stopped_on(self, change: RefusedChange) -> None:
        def edit(refusals: Refusals) -> None:
            refusals.stuck = change

        self._change(edit)

    def dead_lettered(self, change: RefusedChange) -> None:
        def edit(refusals: Refusals) -> None:
            refusals.dead_lettered += 1
            refusals.last_dead_letter = change
            if refusals.stuck is not None and refusals.stuck.sid == change.sid:
                refusals.stuck = None

        self._change(edit)

    def passed(self, skipped: int, durable: int) -> None:
        """``skipped`` more changes were passed over; skips (and a stuck change) behind the
        ``durable`` position are done with."""

        def edit(refusals: Refusals) -> None:
            refusals.skipped += skipped
            refusals.skips = [s for s in refusals.skips if s.lsn > durable]
            if refusals.stuck is not None and refusals.stuck.lsn <= durable:
                refusals.stuck = None  # its transaction was delivered whole after all

        if skipped or self.path.exists():
            self._change(edit)

    # -- the operator ---------------------------------------------------------------------------
    def skip(self, lsn: str, *, binlog: bool = False) -> RefusedChange:
        """Record that the stuck change at ``lsn`` (an LSN, or for a ``binlog`` capture
        ``binlog.000003:1234``) is to be passed over; it is no longer stuck. Raises
        :class:`CdcError` when nothing is stuck or ``lsn`` is not the stuck change's."""
        try:
            wanted = parse_position(lsn) if binlog else parse_lsn(lsn.strip())
        except ValueError:
            form = "binlog.000003:1234" if binlog else "X/Y in hex"
            raise CdcError(f"--lsn {lsn!r} is not a position ({form}, as inspect prints it)") from None
        shown = " ".join(lsn.split()) if binlog else format_lsn(wanted)
        chosen: list[RefusedChange] = []

        def edit(refusals: Refusals) -> None:
            stuck = refusals.stuck
            if stuck is None:
                raise CdcError(
                    "no change is stuck: the capture has not stopped on a change its destination refuses "
                    f"(nothing recorded in {self.path})"
                )
            if stuck.lsn != wanted:
                raise CdcError(
                    f"the stuck change is at {stuck.where} ({stuck.table} key {stuck.key!r}), "
                    f"not {shown}: nothing skipped (sluice capture inspect shows it)"
                )
            refusals.skips.append(stuck)
            refusals.stuck = None
            chosen.append(stuck)

        self._change(edit)
        return chosen[0]


def refused(record: Any, topic: str, error: str) -> RefusedChange:
    """A :class:`RefusedChange` for a capture record (a ``MarkedRecord``) the destination refused."""
    headers = dict(record.headers)
    table = headers.get("pg.table") or _table_of(record.value) or topic
    size = len(record.value) if record.value is not None else 0
    lsn = record.id >> INDEX_BITS
    file = headers.get(FILE_HEADER)  # a binlog's change: its position in the binlog's own terms
    where = format_lsn(lsn) if file is None else describe_position(lsn, {split_position(lsn)[0]: file})
    return RefusedChange(record.id, table, record.key, topic, size, error[:MAX_REFUSAL], position=where)


def _table_of(value: bytes | None) -> str | None:
    """The ``source.table`` of a capture message (read only on this rare path)."""
    if value is None:
        return None
    at = value.rfind(b'"source":{"table":')
    if at < 0:
        return None
    try:
        source = json.loads(value[at + len(b'"source":') : -1])
    except ValueError:
        return None
    table = source.get("table") if isinstance(source, dict) else None
    return table if isinstance(table, str) else None
