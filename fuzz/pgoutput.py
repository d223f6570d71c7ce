"""Fuzz target: the pgoutput decoder (``sluiceway.cdc.pgoutput.decode``).

The input is one replication message as the server would send it. Contract: a decoded value of
one of the message types, or :class:`~sluiceway.cdc.errors.DecodeError` — the capture treats
that as permanent and stops with one line; any other exception would escape as a traceback.
"""

from __future__ import annotations

from sluiceway.cdc.errors import DecodeError
from sluiceway.cdc.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Other,
    Relation,
    Truncate,
    Update,
    decode,
)

MAX_LEN = 4096

_VALUE_TYPES = (str, type(None))


def _check_values(values: object) -> None:
    assert isinstance(values, list), values
    for value in values:
        assert value is UNCHANGED or isinstance(value, _VALUE_TYPES), value


def fuzz_one(data: bytes) -> None:
    try:
        out = decode(data)
    except DecodeError:
        return
    if isinstance(out, Insert):
        _check_values(out.new)
    elif isinstance(out, Update):
        _check_values(out.new)
        if out.old is not None:
            _check_values(out.old)
    elif isinstance(out, Delete):
        _check_values(out.old)
    elif isinstance(out, Message):
        assert isinstance(out.content, bytes) and isinstance(out.prefix, str)
    elif isinstance(out, Relation):
        assert all(isinstance(c.name, str) for c in out.columns)
    else:
        assert isinstance(out, Begin | Commit | Truncate | Other), out


def seeds() -> dict[str, bytes]:
    from tests.support import pgoutput as pg

    return {
        "begin": pg.begin(0x16B374D848, 731, at_us=1_700_000_000_000_000),
        "commit": pg.commit(0x16B374D848, 0x16B374D880),
        "relation": pg.relation(16384, "public", "orders", [("id", 20, True), ("note", 25, False)]),
        "insert": pg.insert(16384, ["1", None, "tab\t é"]),
        "update-key": pg.update(16384, ["2", "x"], old=["1", None], kind="K"),
        "update-unchanged": pg.update(16384, ["1", UNCHANGED]),
        "delete-full": pg.delete(16384, ["1", "x"], kind="O"),
        "truncate": pg.truncate(16384, 16390),
        "message": pg.message(0x16B374D848, "sluiceway", "L 3 public.orders", transactional=True),
        "origin": b"O" + (7).to_bytes(8, "big") + b"node-a\x00",
        "type": b"Y" + (1234).to_bytes(4, "big") + b"public\x00mood\x00",
        # Once findings (tests/unit/cdc/test_pgoutput_and_values.py).
        "empty": b"",
        "message-overrun": pg.message(42, "p", "H 3")[:-1],
        "delete-no-old-tuple": b"D\x00\x00\x00\x07X\x00\x00",
    }
