"""SQL identifiers that come from configuration: checked against a pattern, then quoted.

Values are always bound parameters; identifiers cannot be, so they are the one thing we
format into SQL text — and only after they pass :func:`check_identifier`.
"""

from __future__ import annotations

import hashlib
import re

from sluiceway.db.dsn import Dialect
from sluiceway.errors import InvalidIdentifierError

# A plain identifier, optionally schema-qualified (schema.table). 63 is Postgres' limit and
# also fits MySQL (64) and SQLite (unlimited).
_PART = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_PATTERN = re.compile(rf"^{_PART}(\.{_PART})?$")


def check_identifier(name: str, *, what: str = "table") -> str:
    if not isinstance(name, str) or not _PATTERN.match(name):
        raise InvalidIdentifierError(
            f"{name!r} is not a valid {what} name: use letters, digits and underscores "
            "(optionally schema.table), starting with a letter or underscore, at most 63 characters",
            path=what,
        )
    return name


def quote_identifier(name: str, dialect: Dialect, *, what: str = "table") -> str:
    """Validate ``name`` and quote each dotted part for ``dialect``."""
    check_identifier(name, what=what)
    quote = "`" if dialect is Dialect.MYSQL else '"'
    return ".".join(f"{quote}{part}{quote}" for part in name.split("."))


def bare_name(name: str) -> str:
    """The last part of a possibly schema-qualified name, for naming indexes."""
    return check_identifier(name).split(".")[-1]


#: The longest name PostgreSQL keeps (NAMEDATALEN - 1 bytes); it cuts longer ones silently.
MAX_NAME_BYTES = 63


def derived_name(name: str, *, fallback: str) -> str:
    """A name we derive (a channel, a trigger, a function): ``name`` while it fits PostgreSQL's
    63 bytes, else ``fallback`` plus a hash of ``name`` — never cut, so two long names cannot
    become one.

    >>> derived_name("feed_wakeup", fallback="sluiceway_feed_")
    'feed_wakeup'
    >>> len(derived_name("x" * 80, fallback="sluiceway_feed_"))
    39
    """
    if len(name.encode("utf-8")) <= MAX_NAME_BYTES:
        return name
    return f"{fallback}{hashlib.sha256(name.encode('utf-8')).hexdigest()[:24]}"
