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


def dsn_warnings(dsn: str) -> list[str]:
    """What in ``dsn`` parses but is probably not what its author meant, one sentence each.

    The trap caught here is in goharvest's own sample, ``… user=postgres password= dbname=app``:
    libpq skips the spaces after ``=``, so ``password`` gets ``dbname=app`` as its value and no
    database is named — the connection goes to the database named after the user.

    >>> print(dsn_warnings("host=db password= dbname=app")[0].split(":")[0])
    password= is empty but followed by a space
    >>> dsn_warnings("host=db password='' dbname=app")
    []
    """
    text = dsn.strip()
    if "://" in text or not _LIBPQ_KEY.match(text):
        return []  # URLs and the other dialects' DSNs have no key=value settings
    warnings = []
    for key, value, spaced in _libpq_settings(text):
        swallowed = _LIBPQ_KEY.match(value)
        if spaced and swallowed:
            lost = swallowed.group(0).rstrip("=").strip()
            consequence = " (the database named after the user is used)" if lost == "dbname" else ""
            warnings.append(
                f"{key}= is empty but followed by a space: libpq skips the space and takes the next "
                f"setting, {lost}=…, as the value of {key}, so {lost} is not set{consequence}; "
                f"write {key}='' or leave {key} out"
            )
    return warnings


def _libpq_settings(text: str) -> list[tuple[str, str, bool]]:
    """``(key, value, spaced)`` as libpq reads a key=value string: values unquoted and unescaped;
    ``spaced`` when spaces came between ``=`` and an unquoted value."""
    settings = []
    pos, end = 0, len(text)
    while pos < end:
        while pos < end and text[pos].isspace():
            pos += 1
        start = pos
        while pos < end and text[pos] != "=" and not text[pos].isspace():
            pos += 1
        key = text[start:pos]
        while pos < end and text[pos].isspace():
            pos += 1
        if not key or pos >= end or text[pos] != "=":
            break  # malformed: libpq itself will say so when connecting
        pos += 1
        value_at = pos
        while pos < end and text[pos].isspace():
            pos += 1
        spaced = pos > value_at
        quoted = pos < end and text[pos] == "'"
        pos += 1 if quoted else 0
        chars = []
        while pos < end and (text[pos] != "'" if quoted else not text[pos].isspace()):
            if text[pos] == "\\" and pos + 1 < end:
                pos += 1  # a backslash escapes the next character
            chars.append(text[pos])
            pos += 1
        pos += 1 if quoted else 0
        settings.append((key, "".join(chars), spaced and not quoted))
    return settings
