"""Finding the outbox on every database: which database a DSN actually reached, and the table there."""

from __future__ import annotations

import uuid

import pytest

from sluiceway.db import Database, Dialect, parse_dsn
from sluiceway.errors import ConfigError
from sluiceway.outbox import init_outbox
from sluiceway.outbox.table import locate_outbox


def expected_database(dsn: str) -> str:
    source = parse_dsn(dsn)
    if source.dialect is Dialect.SQLITE:
        return source.target  # the file (absolute in the test rig)
    if source.dialect is Dialect.MYSQL:
        return str(dict(source.mysql_kwargs)["database"])
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(source.target)["dbname"])


def test_locate_outbox_names_the_database_reached_and_reads_the_layout(any_dsn: str) -> None:
    table = f"outbox_{uuid.uuid4().hex[:8]}"
    with Database(any_dsn) as db:
        layout = init_outbox(db, table, partition_column=True)
        location = locate_outbox(db, table)
    assert location.database == expected_database(any_dsn)
    assert location.layout == layout


def test_a_missing_outbox_table_is_reported_with_the_database_reached(any_dsn: str) -> None:
    with Database(any_dsn) as db, pytest.raises(ConfigError) as info:
        locate_outbox(db, "no_such_outbox")
    assert info.value.path == "outboxTable"
    dialect = parse_dsn(any_dsn).dialect.value
    assert info.value.problem == (
        f"outbox table 'no_such_outbox' does not exist in {dialect} database "
        f"{expected_database(any_dsn)!r} (create it with `sluice outbox init`)"
    )
