from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

from sluiceway.db import Dialect, dsn_warnings, load_queries, parse_blocks, parse_dsn, quote_identifier
from sluiceway.errors import InvalidIdentifierError, UnsupportedDsnError


@pytest.mark.parametrize(
    ("dsn", "dialect"),
    [
        (
            "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable",
            Dialect.POSTGRES,
        ),
        ("postgresql://postgres@127.0.0.1:5432/app", Dialect.POSTGRES),
        ("postgres://u:p@h/db", Dialect.POSTGRES),
        ("sqlite:///relative.db", Dialect.SQLITE),
        ("sqlite:////abs/path.db", Dialect.SQLITE),
        ("mysql://root:secret@127.0.0.1:3306/test", Dialect.MYSQL),
        ("mariadb://root@localhost/test", Dialect.MYSQL),
    ],
)
def test_dialect_follows_from_dsn(dsn: str, dialect: Dialect) -> None:
    assert parse_dsn(dsn).dialect is dialect


def test_sqlite_paths() -> None:
    assert parse_dsn("sqlite:///rel/app.db").target == "rel/app.db"
    assert parse_dsn("sqlite:////abs/app.db").target == "/abs/app.db"


def test_mysql_kwargs_and_redaction() -> None:
    src = parse_dsn("mysql://app:s3cret@db.local:3307/shop")
    kwargs = dict(src.mysql_kwargs)
    assert kwargs == {
        "host": "db.local",
        "port": 3307,
        "user": "app",
        "password": "s3cret",
        "database": "shop",
    }
    assert "s3cret" not in src.redacted()
    assert "secret" not in parse_dsn("host=h password=secret dbname=x").redacted()


@pytest.mark.parametrize(
    "dsn", ["", "   ", "oracle://x/y", "sqlite://app.db", "mysql://root@host/", "just words"]
)
def test_unsupported_dsn_is_a_clear_error(dsn: str) -> None:
    with pytest.raises(UnsupportedDsnError):
        parse_dsn(dsn)


def test_an_empty_value_followed_by_a_space_is_the_goharvest_dsn_trap() -> None:
    # goharvest's sample: libpq reads "dbname=app" as the password and connects to "postgres".
    (warning,) = dsn_warnings("host=localhost port=5432 user=postgres password= dbname=app sslmode=disable")
    assert warning.startswith("password= is empty but followed by a space")
    assert "takes the next setting, dbname=…, as the value of password" in warning
    assert "the database named after the user is used" in warning
    assert "write password='' or leave password out" in warning
    (warning,) = dsn_warnings("host=h user=  password=secret dbname=x")
    assert "password=…" in warning and "secret" not in warning  # never repeats a value
    assert "named after the user" not in warning


@pytest.mark.parametrize(
    "dsn",
    [
        "host=localhost user=postgres password='' dbname=app",  # the fix
        "host=localhost user=postgres dbname=app",  # the other fix
        "host=localhost user=postgres password=",  # empty at the end: nothing swallowed
        "host=localhost password = s3cret dbname=app",  # spaces around '=' with a real value
        "host=localhost password= 'quoted' dbname=app",
        "host=localhost options='-c a= b=c' dbname=app",  # inside quotes
        r"host=localhost password=a\ b=c dbname=app",  # an escaped space is part of the value
        "postgresql://postgres@localhost/app",  # URLs have no key=value settings
        "sqlite:///app.db",
        "mysql://root@127.0.0.1/app",
    ],
)
def test_dsns_without_the_trap_give_no_warning(dsn: str) -> None:
    assert dsn_warnings(dsn) == []


def test_mysql_error_masks_password() -> None:
    with pytest.raises(UnsupportedDsnError) as info:
        parse_dsn("mysql://root:hunter2@host/")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("name", ["outbox", "app.outbox", "_x1", "a" * 63])
def test_identifiers_quoted(name: str) -> None:
    assert quote_identifier(name, Dialect.POSTGRES).count('"') == 2 * len(name.split("."))
    assert quote_identifier(name, Dialect.MYSQL).startswith("`")


@pytest.mark.parametrize("name", ["", "1abc", "out-box", 'x"; DROP TABLE y; --', "a.b.c", "a" * 64, "sp ace"])
def test_bad_identifiers_rejected(name: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        quote_identifier(name, Dialect.SQLITE)


def test_parse_blocks() -> None:
    text = "-- header\n\n-- name: one\n-- why\nSELECT 1;\n\n-- name: two\nSELECT\n  2\n"
    assert parse_blocks(text) == {"one": "SELECT 1", "two": "SELECT\n  2"}
    with pytest.raises(ValueError, match="duplicate"):
        parse_blocks("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n")


#: Statements only some dialects need (MySQL has no UPDATE … RETURNING, no LIKE-with-columns).
DIALECT_EXTRAS = {
    Dialect.MYSQL: {"mark_update", "extend_dead_table"},
    # LISTEN/NOTIFY wake-ups: PostgreSQL only (the other dialects poll).
    Dialect.POSTGRES: {
        "create_notify_function",
        "drop_notify_trigger",
        "create_notify_trigger",
        "notify_trigger_exists",
        "listen_rows",
    },
}


def _sql_packages() -> list[str]:
    root = Path(str(importlib.resources.files("sluiceway")))
    return sorted(
        "sluiceway." + ".".join(p.parent.relative_to(root).parts)
        for p in root.rglob("sql")
        if p.is_dir() and (p / "postgres.sql").exists()
    )


def test_every_part_with_sql_is_found() -> None:
    assert "sluiceway.outbox" in _sql_packages()


#: Parts that exist for one dialect only: change data capture reads PostgreSQL's logical decoding;
#: the postgres sink writes to PostgreSQL.
POSTGRES_ONLY = {"sluiceway.cdc", "sluiceway.pipeline.sinks"}


@pytest.mark.parametrize("package", sorted(set(_sql_packages()) - POSTGRES_ONLY))
def test_every_dialect_defines_the_same_queries(package: str) -> None:
    names = {d: set(load_queries(package, d)) - DIALECT_EXTRAS.get(d, set()) for d in Dialect}
    assert names[Dialect.SQLITE] == names[Dialect.POSTGRES] == names[Dialect.MYSQL], names


@pytest.mark.parametrize("package", sorted(POSTGRES_ONLY))
def test_postgres_only_parts_have_no_other_dialect(package: str) -> None:
    root = Path(str(importlib.resources.files(package))) / "sql"
    assert sorted(p.name for p in root.glob("*.sql")) == ["postgres.sql"]
    assert load_queries(package, Dialect.POSTGRES)
