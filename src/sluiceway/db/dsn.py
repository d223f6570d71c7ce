"""Data source strings: which dialect they name and how to open them.

Accepted forms (the dialect follows from the string):

* PostgreSQL: a libpq key/value string (``host=… dbname=…``) or a ``postgresql://`` / ``postgres://`` URL;
* SQLite: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``sqlite:///:memory:``;
* MySQL / MariaDB: ``mysql://user:pass@host:port/db`` (``mariadb://`` is accepted too).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from sluiceway.errors import UnsupportedDsnError


class Dialect(enum.StrEnum):
    POSTGRES = "postgres"
    SQLITE = "sqlite"
    MYSQL = "mysql"


@dataclass(frozen=True, slots=True)
class DataSource:
    """A parsed data source: the dialect plus what its driver needs to connect."""

    dialect: Dialect
    raw: str
    #: libpq string/URL for Postgres, file path for SQLite, keyword arguments for PyMySQL.
    target: str
    mysql_kwargs: tuple[tuple[str, object], ...] = ()

    def redacted(self) -> str:
        """The DSN with any password masked, fit for logs and error messages."""
        masked = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", self.raw)
        return re.sub(r"(password\s*=\s*)\S*", r"\1***", masked)


_LIBPQ_KEY = re.compile(r"^\s*[a-z_]+\s*=", re.IGNORECASE)


def parse_dsn(dsn: str) -> DataSource:
    """Parse ``dsn`` into a :class:`DataSource`; raise :class:`UnsupportedDsnError` when unrecognised.

    >>> parse_dsn("sqlite:///app.db").dialect
    <Dialect.SQLITE: 'sqlite'>
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise UnsupportedDsnError("empty data source; expected a postgresql://, sqlite:/// or mysql:// DSN")
    text = dsn.strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("postgresql", "postgres") or (not scheme and _LIBPQ_KEY.match(text)):
        return DataSource(Dialect.POSTGRES, text, text)
    if scheme == "sqlite":
        rest = text[len("sqlite://") :]
        if not rest.startswith("/") or rest == "/":
            raise UnsupportedDsnError(f"SQLite DSN {text!r} must look like sqlite:///path/to/file.db")
        path = rest[1:]
        if path.startswith("/") is False and path == ":memory:":
            return DataSource(Dialect.SQLITE, text, ":memory:")
        return DataSource(Dialect.SQLITE, text, unquote(path))
    if scheme in ("mysql", "mariadb", "mysql+pymysql", "mariadb+pymysql"):
        parts = urlsplit(text)
        database = parts.path.lstrip("/")
        if not database:
            raise UnsupportedDsnError(
                f"MySQL DSN {_mask(text)!r} names no database (mysql://user:pass@host:port/db)"
            )
        kwargs: dict[str, object] = {
            "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 3306,
            "user": unquote(parts.username or "root"),
            "password": unquote(parts.password or ""),
            "database": unquote(database),
        }
        for key, values in parse_qs(parts.query).items():
            kwargs[key] = values[-1]
        return DataSource(Dialect.MYSQL, text, database, tuple(sorted(kwargs.items())))
    raise UnsupportedDsnError(
        f"unsupported data source {_mask(text)!r}: expected a libpq string or postgresql:// URL, "
        "sqlite:///path.db, or mysql://user:pass@host:port/db"
    )


def _mask(text: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", text)
