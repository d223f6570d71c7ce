"""MariaDB/MySQL column values → JSON, the same way in both phases: pure.

The copy reads rows through PyMySQL and the binlog reader decodes row events into the same Python
types, so one encoder serves both and a row reads the same whichever phase delivered it (a test
checks each type below through both phases):

==========================================  ======================================================
MariaDB/MySQL type                          JSON value
==========================================  ======================================================
TINYINT … BIGINT, FLOAT, DOUBLE, DECIMAL    number (``NaN``/``±Infinity`` as strings)
DATETIME, TIMESTAMP                         ``"2024-05-01T12:00:00.5"`` (TIMESTAMP in UTC: the
                                            capture's sessions pin ``time_zone = '+00:00'``)
DATE                                        ``"2024-05-01"``
TIME                                        ``"12:00:01"`` / ``"-01:30:00.25"``
BINARY, VARBINARY, BLOB                     ``"\\x0102ff"`` (hex, as PostgreSQL's bytea)
CHAR, VARCHAR, TEXT, ENUM, JSON (MariaDB)   the text as a string
SET                                         the members, comma-separated, as a string
NULL                                        ``null``
==========================================  ======================================================
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any


def json_value(value: Any) -> str:
    """One value as JSON text (see the table above)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return encode_basestring(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else _NONFINITE[str(value)]
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else encode_basestring(str(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return '"\\\\x' + bytes(value).hex() + '"'
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return '"' + _trim(value.isoformat()) + '"'
    if isinstance(value, dt.date):
        return '"' + value.isoformat() + '"'
    if isinstance(value, dt.timedelta):
        return '"' + time_text(value) + '"'
    if isinstance(value, set | frozenset):
        return encode_basestring(",".join(sorted(value)))
    if isinstance(value, dict | list):  # MySQL's binary JSON, decoded by the binlog reader
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return encode_basestring(str(value))


def _trim(text: str) -> str:
    """``…12:00:00.500000`` → ``…12:00:00.5`` (as PostgreSQL's JSON prints fractions)."""
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def time_text(value: dt.timedelta) -> str:
    """A TIME value as MySQL prints it (hours may pass 24; negative values have a sign)."""
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{sign}{hour:02d}:{minute:02d}:{second:02d}"
    return text + f".{fraction:06d}".rstrip("0") if fraction else text


def parse_time(text: str) -> dt.timedelta:
    """A TIME value as the server prints it (``-01:30:00.25``), as the binlog reader decodes it.
    (PyMySQL's own conversion gets a negative value with a fraction wrong.)"""
    sign = -1 if text.startswith("-") else 1
    hours, minutes, seconds = text.lstrip("-").split(":")
    whole, _, fraction = seconds.partition(".")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    total = ((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + micros
    return dt.timedelta(microseconds=sign * total)


def binlog_time(value: dt.timedelta) -> dt.timedelta:
    """A negative TIME with a fraction as python-mysql-replication decodes it, put right.

    The binlog packs a TIME's whole and fractional parts as one two's-complement number; the
    library negates the whole part alone, so ``-01:30:00.25`` comes out as ``-01:30:00.75``:
    the whole seconds are right and the fraction is its complement (checked for every fsp against
    the server's own text, tests/integration/cdc/test_mysql_values.py)."""
    micros = value // dt.timedelta(microseconds=1)
    if micros >= 0 or not (-micros) % 1_000_000:
        return value
    whole, fraction = divmod(-micros, 1_000_000)
    return -dt.timedelta(microseconds=whole * 1_000_000 + (1_000_000 - fraction))


def row_json(columns: Sequence[str], row: Mapping[str, Any]) -> bytes:
    """A row as one JSON object, its columns in table order."""
    return ("{" + ",".join([_name(c) + json_value(row.get(c)) for c in columns]) + "}").encode()


_NAMES: dict[str, str] = {}


def _name(column: str) -> str:
    """``"column":``, made once per column name."""
    found = _NAMES.get(column)
    if found is None:
        found = _NAMES[column] = encode_basestring(column) + ":"
    return found


def key_text(values: Sequence[Any]) -> str:
    """A record's key: one column's value as text (a string as itself, other values as their
    JSON without quotes), several columns as a compact JSON array — the PostgreSQL capture's rule."""
    if len(values) == 1:
        text = json_value(values[0])
        return str(json.loads(text)) if text.startswith('"') else text
    return "[" + ",".join(json_value(v) for v in values) + "]"


_NONFINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}
