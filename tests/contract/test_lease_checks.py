"""The lease election's start-up check and ``election.schema``, on the SQL stores.

* the lease table lives in the configured schema (PostgreSQL) or database (MariaDB), and the
  election works there;
* a role that may not create a table where the lease goes is told so, with the GRANT, before it
  campaigns — not retried every half second for ever (issue 37);
* a lease table made for the role by someone else is used as it is: the check looks before it
  creates (PostgreSQL checks CREATE on the schema even for CREATE TABLE IF NOT EXISTS).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sluiceway.db import Database
from sluiceway.election import DatabaseLease, SqlLeaseStore
from sluiceway.election.lease import lease_table
from sluiceway.errors import StartupRefused


def _schema_for(dialect: str, dsn: str) -> Iterator[str]:
    name = f"sluice_{uuid.uuid4().hex[:8]}"
    with Database(dsn) as db:
        db.execute(f"CREATE SCHEMA {name}" if dialect == "postgres" else f"CREATE DATABASE {name}")
        try:
            yield name
        finally:
            db.execute(f"DROP SCHEMA {name} CASCADE" if dialect == "postgres" else f"DROP DATABASE {name}")


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_the_lease_lives_in_the_configured_schema(dialect: str, request: pytest.FixtureRequest) -> None:
    dsn = str(request.getfixturevalue(f"{dialect}_dsn"))
    for schema in _schema_for(dialect, dsn):
        table = lease_table(schema)
        lease = DatabaseLease(dsn, "orders", ttl=1.0, table=table)
        lease.check()
        store = SqlLeaseStore(dsn, table)
        try:
            taken = store.acquire("orders", "a", 1.0)
            assert taken is not None and taken.epoch == 1
        finally:
            store.close()
        with Database(dsn) as db:
            rows = db.fetchall(f"SELECT name, holder FROM {schema}.sluiceway_leases")
        assert rows == [("orders", "a")]


@pytest.fixture
def plain_role(postgres_dsn: str) -> Iterator[tuple[str, str]]:
    """A login role with no privilege beyond PUBLIC's (PostgreSQL 15: no CREATE on public); its DSN."""
    name = f"sluice_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN")
    params = conninfo_to_dict(postgres_dsn)
    params["user"] = name
    try:
        yield name, make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {name} CASCADE")
            admin.execute(f"DROP ROLE {name}")


def test_a_role_that_may_not_create_the_lease_table_is_told_the_grant(plain_role: tuple[str, str]) -> None:
    name, dsn = plain_role
    with pytest.raises(StartupRefused) as caught:
        DatabaseLease(dsn, "orders").check()
    assert str(caught.value) == (
        f"the role '{name}' may not create the lease table sluiceway_leases in schema public: permission "
        f"denied for schema public — GRANT CREATE ON SCHEMA public TO {name}, or set election.schema to a "
        "schema it may write"
    )


def test_a_role_that_may_not_write_the_lease_table_is_told_the_grant(
    postgres_dsn: str, plain_role: tuple[str, str]
) -> None:
    name, dsn = plain_role
    schema = f"made_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {name}")
        DatabaseLease(postgres_dsn, "orders", table=lease_table(schema)).check()  # made by the admin
        admin.execute(f"GRANT SELECT ON {schema}.sluiceway_leases TO {name}")
    try:
        with pytest.raises(StartupRefused) as caught:
            DatabaseLease(dsn, "orders", table=lease_table(schema)).check()
        assert str(caught.value) == (
            f"the role '{name}' may not write the lease table {schema}.sluiceway_leases: permission "
            f"denied for table sluiceway_leases — GRANT SELECT, INSERT, UPDATE ON {schema}.sluiceway_leases "
            f"TO {name}"
        )
        # Granted so, the role uses the table made for it, in a schema where it may not create.
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"GRANT SELECT, INSERT, UPDATE ON {schema}.sluiceway_leases TO {name}")
        DatabaseLease(dsn, "orders", table=lease_table(schema)).check()
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def test_a_schema_that_does_not_exist_is_named_with_the_fix(postgres_dsn: str) -> None:
    with pytest.raises(StartupRefused) as caught:
        DatabaseLease(postgres_dsn, "orders", table=lease_table("no_such_schema")).check()
    user = conninfo_to_dict(postgres_dsn)["user"]
    assert str(caught.value) == (
        'the schema no_such_schema for the lease table does not exist: schema "no_such_schema" does '
        f"not exist — CREATE SCHEMA no_such_schema AUTHORIZATION {user}, or set election.schema to one "
        "that exists"
    )
