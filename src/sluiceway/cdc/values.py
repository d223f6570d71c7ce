"""PostgreSQL column values → JSON, the same way in both phases of change data capture: pure.

A copied row is turned into JSON by the server (``row_to_json``); a streamed change arrives as
each column's *text* output (pgoutput) and is turned into JSON here. Both follow PostgreSQL's
own ``to_json`` rules, so a row reads the same whichever phase delivered it (a test checks
every type below against the server):

===========================================  =====================================================
PostgreSQL type                              JSON value
===========================================  =====================================================
smallint, integer, bigint, oid, real,        number (``NaN`` and ``±Infinity`` as strings)
double precision, numeric
boolean                                      ``true`` / ``false``
json, jsonb                                  the document itself
timestamp                                    ``"2024-05-01T12:00:00.5"``
timestamp with time zone                     ``"2024-05-01T12:00:00.5+00:00"`` (always UTC)
date                                         ``"2024-05-01"``
arrays of the above                          JSON arrays (nested for several dimensions)
bytea                                        ``"\\x0102ff"`` (hex, as PostgreSQL prints it)
text, varchar, uuid, time, interval, enums,  their text form as a string
composites, ranges, extension types, …
NULL                                         ``null``
===========================================  =====================================================

Sessions that read changes pin ``TimeZone=UTC``, ``DateStyle=ISO`` and ``IntervalStyle=postgres``
so the text forms above do not depend on server defaults.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from json.encoder import encode_basestring
from typing import Any

#: First OID of user-defined objects: types at or above it get their text form, as strings.
FIRST_USER_OID = 16384


class Kind(Enum):
    NUMBER = "number"
    BOOL = "bool"
    JSON = "json"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    DATE = "date"
    STRING = "string"
    ARRAY = "array"


_BUILTIN: dict[int, Kind] = {
    20: Kind.NUMBER,  # int8
    21: Kind.NUMBER,  # int2
    23: Kind.NUMBER,  # int4
    26: Kind.NUMBER,  # oid
    700: Kind.NUMBER,  # float4
    701: Kind.NUMBER,  # float8
    1700: Kind.NUMBER,  # numeric
    16: Kind.BOOL,
    114: Kind.JSON,
    3802: Kind.JSON,
    1114: Kind.TIMESTAMP,
    1184: Kind.TIMESTAMPTZ,
    1082: Kind.DATE,
}


@dataclass(frozen=True, slots=True)
class PgType:
    """How one column type maps to JSON. ``as_text``: the copy selects ``column::text`` (types
    whose ``to_json`` is not their text form as a string, e.g. composites, become strings in
    both phases)."""

    kind: Kind
    element: PgType | None = None
    delimiter: str = ","
    as_text: bool = False


STRING = PgType(Kind.STRING)
TEXT_FORM = PgType(Kind.STRING, as_text=True)


@dataclass(frozen=True, slots=True)
class TypeRow:
    """A ``pg_type`` row, as much as the mapping needs."""

    oid: int
    typtype: str
    category: str
    element: int
    delimiter: str
    base: int


def resolve(oid: int, rows: dict[int, TypeRow]) -> PgType:
    """The JSON mapping of type ``oid`` (``rows``: its ``pg_type`` row and those it refers to)."""
    row = rows.get(oid)
    if row is None:
        return _BUILTIN_TYPES.get(oid, TEXT_FORM if oid >= FIRST_USER_OID else STRING)
    if row.typtype == "d" and row.base:
        return resolve(row.base, rows)
    if row.category == "A" and row.element:
        element = resolve(row.element, rows)
        if element.as_text:
            return TEXT_FORM  # to_json would not give the element's text form: keep the array's
        delim = rows[row.element].delimiter if row.element in rows else ","
        return PgType(Kind.ARRAY, element, delim)
    if oid in _BUILTIN:
        return _BUILTIN_TYPES[oid]
    if oid >= FIRST_USER_OID or row.typtype == "c":
        return TEXT_FORM
    return STRING


_BUILTIN_TYPES = {oid: PgType(kind) for oid, kind in _BUILTIN.items()}

_NOT_NUMBERS = frozenset({"NaN", "Infinity", "-Infinity"})
_TZ = re.compile(r"([+-]\d\d)(:\d\d)?(:\d\d)?( BC)?$")


def to_json(text: str | None, pg: PgType) -> str:
    """The JSON text of one value given in PostgreSQL's text output (``None``: SQL NULL)."""
    if text is None:
        return "null"
    kind = pg.kind
    if kind is Kind.STRING:
        return str(encode_basestring(text))
    if kind is Kind.NUMBER:
        return text if text not in _NOT_NUMBERS else f'"{text}"'
    if kind is Kind.BOOL:
        return "true" if text == "t" else "false"
    if kind is Kind.JSON:
        return text
    if kind is Kind.TIMESTAMP:
        return f'"{_xsd(text)}"'
    if kind is Kind.TIMESTAMPTZ:
        return f'"{_xsd_tz(text)}"'
    if kind is Kind.DATE:
        return f'"{text}"'
    assert pg.element is not None
    return _array_json(parse_array(text, pg.delimiter), pg.element)


def _xsd(text: str) -> str:
    # ISO '2024-05-01 12:00:00' → XSD '2024-05-01T12:00:00' (what to_json prints); 'infinity' stays.
    return text.replace(" ", "T", 1)


def _xsd_tz(text: str) -> str:
    text = _xsd(text)
    match = _TZ.search(text)
    if match is None:
        return text
    hours, minutes, seconds, era = match.groups()
    return text[: match.start()] + hours + (minutes or ":00") + (seconds or "") + (era or "")


def _array_json(value: list[Any], element: PgType) -> str:
    parts = [
        _array_json(item, element) if isinstance(item, list) else to_json(item, element) for item in value
    ]
    return "[" + ",".join(parts) + "]"


def parse_array(text: str, delimiter: str = ",") -> list[Any]:
    """PostgreSQL's array text output (``{1,2}``, ``{{a,"b c"},{NULL,d}}``, ``[0:1]={x,y}``) →
    nested lists of element texts (``None`` for NULL)."""
    if text.startswith("["):  # explicit bounds: '[0:1]={…}' — to_json ignores them too
        text = text[text.index("=") + 1 :]
    pos = 0

    def parse() -> list[Any]:
        nonlocal pos
        if text[pos] != "{":
            raise ValueError(f"not an array literal: {text!r}")
        pos += 1
        items: list[Any] = []
        if text[pos] == "}":
            pos += 1
            return items
        while True:
            char = text[pos]
            if char == "{":
                items.append(parse())
            elif char == '"':
                pos += 1
                out = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    out.append(text[pos])
                    pos += 1
                pos += 1
                items.append("".join(out))
            else:
                end = pos
                while text[end] != delimiter and text[end] != "}":
                    end += 1
                raw = text[pos:end].strip()
                items.append(None if raw.upper() == "NULL" else raw)
                pos = end
            if text[pos] == delimiter:
                pos += 1
                continue
            if text[pos] == "}":
                pos += 1
                return items
            raise ValueError(f"malformed array literal: {text!r}")

    return parse()


def composite_key(json_values: list[str]) -> str:
    """The key of a row identified by several key columns: a compact JSON array of their values,
    each as :func:`to_json` makes it from the column's text (so both phases agree to the byte)."""
    return "[" + ",".join(json_values) + "]"


def row_key(values: list[object]) -> str:
    """The key of a row of a table without a primary key: every column's value as a compact JSON
    array, normalised (the copy reads the row as the server's JSON, the stream as text forms)."""
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)
