"""The barrier (``perKeyInFlight`` 1, the default path) is the windows' N = 1 case, written lean:
driven by the same random run of an engine — marks, acknowledgements, failures, burials,
abandoned sends, refreshes — both shapes must answer every call alike."""

from __future__ import annotations

import random

import pytest

from sluiceway.harvest.dispatch import Barrier, Dispatcher, Windows, _Window
from sluiceway.outbox.record import MarkedRecord


def test_dispatcher_makes_the_shape_that_fits() -> None:
    assert type(Dispatcher(10)) is Barrier and type(Dispatcher(10, per_key=1)) is Barrier
    assert type(Dispatcher(10, per_key=2)) is Windows


def state(d: Dispatcher) -> tuple[object, ...]:
    # Keys with records in their window (the windows may keep an empty one for a key whose pending
    # records a refresh drops: harmless, and not a difference).
    windowed = {k for k, w in d._windows.items() if not isinstance(w, _Window) or w.entries}
    return d.in_flight, d.pending, d.force_remark, windowed, frozenset(d.fenced_keys), d.tick


@pytest.mark.parametrize("seed", range(60))
def test_the_barrier_answers_as_windows_of_one(seed: int) -> None:
    rng = random.Random(seed)
    lean, general = Barrier(rng.choice((2, 4, 16))), Windows(0, per_key=1)
    general.max_in_flight = lean.max_in_flight
    shapes = (lean, general)
    outbox: dict[int, MarkedRecord] = {}  # unpurged rows
    marked_under: dict[int, int] = {}  # row id -> generation it was last marked under
    sent: list[MarkedRecord] = []  # dispatched, no report yet
    next_id = 1

    def both(call: str, *args: object, **kwargs: object) -> object:
        out = [getattr(d, call)(*args, **kwargs) for d in shapes]
        assert out[0] == out[1], (call, out)
        assert state(lean) == state(general), call
        return out[0]

    for _ in range(400):
        op = rng.random()
        if op < 0.25:  # the application writes rows
            for _ in range(rng.randint(1, 5)):
                outbox[next_id] = MarkedRecord(next_id, None, "t", rng.choice("abcde"), b"v", (), None)
                next_id += 1
        elif op < 0.5 and not lean.force_remark:  # mark: rows not marked under this generation
            generation, tick = lean.generation, lean.tick
            rows = [r for i, r in sorted(outbox.items()) if marked_under.get(i) != generation]
            rows = rows[: rng.randint(1, 6)]
            for r in rows:
                marked_under[r.id] = generation
            rng.shuffle(rows)  # RETURNING has no order
            sends, _ = both("admit", [r._replace(leader_id=f"L{generation}") for r in rows], generation, tick)
            sent.extend(sends)  # type: ignore[arg-type]
        elif op < 0.8 and sent:  # delivery reports for some of what is in flight
            rng.shuffle(sent)
            reported, sent[:] = sent[: rng.randint(1, len(sent))], sent[len(sent) // 2 :]
            sent[:] = [r for r in sent if r not in reported]
            failed = [r for r in reported if rng.random() < 0.15]
            ok = [r for r in reported if r not in failed]
            plan = both("acknowledge", ok, failed)
            for r in plan.purge:  # type: ignore[attr-defined]
                del outbox[r.id]
            sent.extend(both("settle", plan.purge))  # type: ignore[attr-defined, arg-type]
            for failure in plan.failures:  # type: ignore[attr-defined]
                buried = rng.random() < 0.4
                if buried:
                    del outbox[failure.record.id]
                sent.extend(both("close_failure", failure, settled=buried))  # type: ignore[arg-type]
        elif op < 0.85 and sent:  # a send queue closed under some records
            rng.shuffle(sent)
            gone, sent[:] = sent[:1], sent[1:]
            both("abandon", gone)
        elif lean.force_remark or op > 0.97:  # the marker takes a fresh leader id
            both("refresh")
