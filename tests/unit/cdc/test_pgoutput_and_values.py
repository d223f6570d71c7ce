"""pgoutput decoding and the text → JSON mapping, without a server (the server-side half of the
mapping is checked against PostgreSQL itself in tests/integration/cdc)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluiceway.cdc.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DecodeError,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    decode,
    format_lsn,
    parse_lsn,
)
from sluiceway.cdc.values import (
    STRING,
    TEXT_FORM,
    Kind,
    PgType,
    TypeRow,
    composite_key,
    parse_array,
    resolve,
    row_key,
    to_json,
)
from tests.support import pgoutput as pg


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_text_round_trips(value: int) -> None:
    assert parse_lsn(format_lsn(value)) == value


def test_lsn_notation_is_postgresqls() -> None:
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn("0/16B3748") == 0x16B3748
    with pytest.raises(ValueError, match="not an LSN"):
        parse_lsn("12345")


def test_every_message_kind_decodes() -> None:
    rel = decode(pg.relation(7, "public", "orders", [("id", 20, True), ("note", 25, False)], identity="f"))
    assert rel == Relation(7, "public", "orders", "f", rel.columns)  # type: ignore[union-attr]
    assert isinstance(rel, Relation) and [c.name for c in rel.columns] == ["id", "note"]
    assert rel.columns[0].key and not rel.columns[1].key and rel.namespace == "public.orders"
    assert decode(pg.begin(500, 9, at_us=1_700_000_000_000_000)) == Begin(500, 1_700_000_000_000_000, 9)
    assert decode(pg.commit(600, 650)) == Commit(600, 650, pg.PG_EPOCH_US)
    assert decode(pg.insert(7, ["1", None])) == Insert(7, ["1", None])
    assert decode(pg.update(7, ["1", UNCHANGED])) == Update(7, "", None, ["1", UNCHANGED])
    assert decode(pg.update(7, ["2", "x"], old=["1", None], kind="K")) == Update(
        7, "K", ["1", None], ["2", "x"]
    )
    assert decode(pg.delete(7, ["1", "x"], kind="O")) == Delete(7, "O", ["1", "x"])
    assert decode(pg.truncate(7, 8)) == Truncate((7, 8), False, False)
    assert decode(pg.message(42, "p", "H 3")) == Message(False, 42, "p", b"H 3")


def test_text_values_keep_every_character() -> None:
    text = 'tab\t nl\n quote" é 😀'
    assert decode(pg.insert(1, [text])) == Insert(1, [text])


def test_a_malformed_message_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(DecodeError, match="malformed 'I'"):
        decode(pg.insert(1, ["abc"])[:-2])
    with pytest.raises(DecodeError, match="unknown pgoutput message"):
        decode(b"Zjunk")


# --- values ----------------------------------------------------------------------------------------
NUMBER, BOOL, JSONT = PgType(Kind.NUMBER), PgType(Kind.BOOL), PgType(Kind.JSON)
TS, TSTZ, DATE = PgType(Kind.TIMESTAMP), PgType(Kind.TIMESTAMPTZ), PgType(Kind.DATE)


@pytest.mark.parametrize(
    ("text", "pg_type", "expected"),
    [
        ("42", NUMBER, 42),
        ("-1.50", NUMBER, -1.5),
        ("123456789012345678901234567890", NUMBER, 123456789012345678901234567890),
        ("NaN", NUMBER, "NaN"),
        ("-Infinity", NUMBER, "-Infinity"),
        ("t", BOOL, True),
        ("f", BOOL, False),
        ('{"a": [1, null]}', JSONT, {"a": [1, None]}),
        ("2024-02-29 23:59:59.123456", TS, "2024-02-29T23:59:59.123456"),
        ("infinity", TS, "infinity"),
        ("2024-05-01 10:00:00+00", TSTZ, "2024-05-01T10:00:00+00:00"),
        ("2024-05-01 10:00:00+05:30", TSTZ, "2024-05-01T10:00:00+05:30"),
        ("2024-05-01", DATE, "2024-05-01"),
        ('quote " back\\ nl\n', STRING, 'quote " back\\ nl\n'),
        (None, NUMBER, None),
    ],
)
def test_values_become_the_json_postgresql_would_make(
    text: str | None, pg_type: PgType, expected: object
) -> None:
    assert json.loads(to_json(text, pg_type)) == expected


def test_arrays_nest_and_convert_their_elements() -> None:
    ints = PgType(Kind.ARRAY, NUMBER)
    assert json.loads(to_json("{{1,2},{3,NULL}}", ints)) == [[1, 2], [3, None]]
    assert json.loads(to_json("[0:1]={5,6}", ints)) == [5, 6]
    texts = PgType(Kind.ARRAY, STRING)
    assert json.loads(to_json('{"a b","NULL",NULL,"c,d","e\\"f",g}', texts)) == [
        "a b",
        "NULL",
        None,
        "c,d",
        'e"f',
        "g",
    ]
    assert json.loads(to_json("{}", texts)) == []
    boxes = PgType(Kind.ARRAY, STRING, delimiter=";")
    assert json.loads(to_json("{(1,1),(0,0);(2,2),(1,1)}", boxes)) == ["(1,1),(0,0)", "(2,2),(1,1)"]


def test_parse_array_rejects_what_is_not_an_array() -> None:
    with pytest.raises(ValueError, match="not an array literal"):
        parse_array("1,2")


def test_type_resolution_follows_domains_and_arrays_and_keeps_user_types_as_text() -> None:
    rows = {
        16500: TypeRow(16500, "d", "N", 0, ",", 23),  # a domain over int4
        16501: TypeRow(16501, "b", "A", 16500, ",", 0),  # an array of that domain
        16502: TypeRow(16502, "e", "E", 0, ",", 0),  # an enum
        16503: TypeRow(16503, "b", "A", 16502, ",", 0),  # an array of the enum
        16504: TypeRow(16504, "c", "C", 0, ",", 0),  # a composite
        1007: TypeRow(1007, "b", "A", 23, ",", 0),  # int4[]
        23: TypeRow(23, "b", "N", 0, ",", 0),
    }
    assert resolve(16500, rows) == NUMBER
    assert resolve(16501, rows) == PgType(Kind.ARRAY, NUMBER)
    assert resolve(16502, rows) == TEXT_FORM
    assert resolve(16503, rows) == TEXT_FORM  # an array of text forms stays one text form
    assert resolve(16504, rows) == TEXT_FORM
    assert resolve(1007, rows) == PgType(Kind.ARRAY, NUMBER)
    assert resolve(25, {}) == STRING


def test_composite_keys_are_compact_json_arrays_of_the_columns_json() -> None:
    assert composite_key(["1", '"a b"']) == '[1,"a b"]'
    assert composite_key(["1.50", "true"]) == "[1.50,true]"  # as the text form makes it, in both phases
    assert row_key([1.5, "x", None]) == '[1.5,"x",null]'


def test_a_decode_error_is_in_the_sluiceway_tree() -> None:
    from sluiceway.cdc.errors import CdcError
    from sluiceway.errors import SluicewayError

    assert issubclass(DecodeError, CdcError) and issubclass(DecodeError, SluicewayError)


# Found by fuzzing (fuzz/pgoutput.py): each input once escaped as another exception, or decoded
# into a value the protocol cannot send.
@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "empty pgoutput message"),  # was IndexError
        (pg.message(42, "p", "H 3")[:-1], "content runs past the end"),  # was a truncated content
        (b"M\x00" + bytes(8) + b"p\x00" + b"\xff\xff\xff\xfe" + b"xy", "content runs past the end"),
        (b"D\x00\x00\x00\x07X\x00\x00", "delete without an old tuple"),  # was Delete(old_kind="X")
    ],
)
def test_fuzz_findings_are_decode_errors(data: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        decode(data)
