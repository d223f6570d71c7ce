"""Operator actions on dead letters: list, retry, resolve (``sluice outbox dead …``).

A *parked* dead letter holds its key: no leader marks the key's later rows while it exists
(the mark query skips them), whichever leader buried it. The operator releases the key:

* **retry** — the record goes back into the outbox under its own id, at the head of its key
  (the key's later rows all have higher ids and were never purged), and the letter is deleted;
  the harvester publishes the key from there, in order. A letter that did not park its key
  (``deadLetter.parkKey: false``) goes back at the tail under a new id: its successors are
  already published.
* **resolve** — the record is discarded (the letter deleted) and the key released: its later
  records are published without it.

Each action is one transaction: the letter and the outbox change together, or not at all. A
second retry or resolve of the same letter finds nothing and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sluiceway.db import Database
from sluiceway.errors import SluicewayError
from sluiceway.outbox.table import OutboxLayout, queries


class DeadLetterNotFoundError(SluicewayError):
    """No dead letter with that id (never buried, or already retried or resolved)."""

    def __init__(self, record_id: int) -> None:
        self.record_id = record_id
        super().__init__(f"no dead letter {record_id} (already retried or resolved?)")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    topic: str
    key: str
    attempts: int
    parked: bool
    dead_time: datetime | str | None
    error: str


def list_dead_letters(
    db: Database, layout: OutboxLayout, *, after: int = 0, limit: int = 100
) -> list[DeadLetter]:
    """Dead letters with id above ``after``, oldest first, at most ``limit`` (page with ``after``)."""
    q = queries(db.dialect, layout)
    rows = db.fetchall(q["dead_list"], {"after": after, "limit": limit}, what="list dead letters")
    return [_letter(row) for row in rows]


def retry_dead_letter(db: Database, layout: OutboxLayout, record_id: int) -> bool:
    """Put the record back into the outbox and delete the letter. Returns whether it went back at
    the head of its key (a parked letter, under its own id) rather than the tail."""
    q = queries(db.dialect, layout)
    with db.transaction():
        parked = _parked(db, q, record_id)
        db.execute(
            q["dead_restore" if parked else "dead_requeue"], {"id": record_id}, what="retry dead letter"
        )
        db.execute(q["dead_delete"], {"id": record_id}, what="retry dead letter")
    return parked


def resolve_dead_letter(db: Database, layout: OutboxLayout, record_id: int) -> None:
    """Discard the record: delete the letter, releasing its key."""
    q = queries(db.dialect, layout)
    with db.transaction():
        _parked(db, q, record_id)
        db.execute(q["dead_delete"], {"id": record_id}, what="resolve dead letter")


def _parked(db: Database, q: Any, record_id: int) -> bool:
    row = db.fetchone(q["dead_get"], {"id": record_id}, what="read dead letter")
    if row is None:
        raise DeadLetterNotFoundError(record_id)
    return bool(row[0])


def _letter(row: tuple[Any, ...]) -> DeadLetter:
    return DeadLetter(
        id=int(row[0]),
        topic=str(row[1]),
        key=str(row[2]),
        attempts=int(row[3]),
        parked=bool(row[4]),
        dead_time=row[5],
        error=str(row[6]),
    )
