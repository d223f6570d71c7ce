"""Named SQL blocks, one file per dialect.

Each part of sluiceway keeps its SQL in ``sql/<dialect>.sql`` beside its code, as blocks::

    -- name: mark
    -- Claims the oldest rows not owned by this leader (why: …).
    UPDATE {outbox} SET leader_id = %(leader_id)s WHERE …;

:func:`load_queries` parses a file into ``{name: sql}``. ``{placeholders}`` stand for
identifiers only; :func:`render` fills them with quoted, validated names. A unit test asserts
every dialect of a part defines the same names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from importlib import resources

from sluiceway.db.dsn import Dialect
from sluiceway.db.identifiers import quote_identifier

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_SLOT = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def parse_blocks(text: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end]
        lines = [ln for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";").strip()
        name = match.group(1)
        if name in blocks:
            raise ValueError(f"duplicate SQL block {name!r}")
        blocks[name] = sql
    return blocks


@cache
def load_queries(package: str, dialect: Dialect) -> dict[str, str]:
    """The named blocks of ``<package>/sql/<dialect>.sql``."""
    text = (
        resources.files(package).joinpath("sql").joinpath(f"{dialect.value}.sql").read_text(encoding="utf-8")
    )
    return parse_blocks(text)


def render(sql: str, dialect: Dialect, **identifiers: str) -> str:
    """Fill ``{slot}`` identifier placeholders with quoted names; every slot must be given."""

    def fill(match: re.Match[str]) -> str:
        slot = match.group(1)
        if slot.startswith("raw_"):
            # Derived names (index names) built by our own code from validated parts.
            return identifiers[slot]
        if slot not in identifiers:
            raise KeyError(f"SQL needs identifier {{{slot}}}")
        return quote_identifier(identifiers[slot], dialect)

    return _SLOT.sub(fill, sql)


class QuerySet:
    """The queries of one part for one dialect, rendered once for a fixed set of identifiers."""

    def __init__(self, package: str, dialect: Dialect, **identifiers: str) -> None:
        self.dialect = dialect
        self._sql = {
            name: render(sql, dialect, **identifiers) for name, sql in load_queries(package, dialect).items()
        }

    def __getitem__(self, name: str) -> str:
        return self._sql[name]

    def __contains__(self, name: object) -> bool:
        return name in self._sql

    def names(self) -> frozenset[str]:
        return frozenset(self._sql)


def pg_bigint_array(values: Iterable[int]) -> str:
    """A ``bigint[]`` parameter as PostgreSQL's array literal (``{1,2,3}``), cast in the SQL
    (``= ANY(%(ids)s::bigint[])``).

    psycopg dumps a list element by element in Python (for a purge of 500 ids, a tenth of the
    harvester's purge thread; for the feed's completion, 0.4 µs an item per array); ``str.join``
    does the same in C. Only for ints: nothing in them needs quoting.

    >>> pg_bigint_array([1, 2, 3])
    '{1,2,3}'
    """
    return "{" + ",".join(map(str, values)) + "}"
