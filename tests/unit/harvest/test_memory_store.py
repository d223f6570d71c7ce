"""The in-memory OutboxStore's fault injection: what the engine's failure tests rely on.

(What the fake answers when nothing fails is held to the SQL store by
``tests/contract/test_outbox_store.py``.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from sluiceway.errors import DatabaseError
from sluiceway.outbox.memory import MemoryOutboxStore
from sluiceway.outbox.record import OutboxRecord

LEADER = str(uuid.uuid4())

# verb → (the call, whether it took effect)
CALLS: dict[str, tuple[Callable[[MemoryOutboxStore], object], Callable[[MemoryOutboxStore], bool]]] = {
    "mark": (lambda s: s.mark(LEADER, 10), lambda s: s.rows[1].leader_id == LEADER),
    "purge": (lambda s: s.purge([1]), lambda s: 1 not in s.rows),
    "reset": (lambda s: s.reset(1, LEADER), lambda s: s.rows[1].leader_id is None),
    "bury": (lambda s: s.bury(s.rows[1], "boom", 1), lambda s: 1 in s.dead),
}


@pytest.mark.parametrize("verb", sorted(CALLS))
@pytest.mark.parametrize("applied", [False, True])
def test_an_injected_failure_raises_after_applying_only_when_asked(verb: str, applied: bool) -> None:
    call, took_effect = CALLS[verb]
    store = MemoryOutboxStore()
    store.stash(OutboxRecord("t", "k", "v"))
    if verb != "mark":
        store.mark(LEADER, 10)
    store.fail_next(verb, applied=applied)
    with pytest.raises(DatabaseError, match="injected"):
        call(store)
    assert took_effect(store) is applied
    assert store.calls[verb] == 1


def test_injected_failures_are_used_up_in_order() -> None:
    store = MemoryOutboxStore()
    store.stash(OutboxRecord("t", "k", "v"))
    store.fail_next("mark", times=2)
    for _ in range(2):
        with pytest.raises(DatabaseError):
            store.mark(LEADER, 10)
    assert [r.id for r in store.mark(LEADER, 10)] == [1]
