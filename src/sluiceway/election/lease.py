"""Leader election by a database lease: one row per election name (holder, epoch, version, expiry).

Expiry is decided by the database clock; the rules (when to renew, when to fence) are
:class:`~sluiceway.election.campaign.LeaseCampaign`'s. This module is the driver — a thread that
steps the campaign — and the SQL adapter of its :class:`~sluiceway.election.protocol.LeaseStore` port.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from sluiceway.clock import Clock
from sluiceway.db import Database, Dialect, QuerySet
from sluiceway.db.failures import grantee, whoami
from sluiceway.election.campaign import LeaseCampaign
from sluiceway.election.protocol import ElectionListener, LeaseView
from sluiceway.errors import Cause, DatabaseError, Permanent, StartupRefused

DEFAULT_LEASE_TABLE = "sluiceway_leases"


def lease_table(schema: str | None) -> str:
    """The lease table's name in ``schema`` (``election.schema``; None: where the role's
    unqualified tables go: PostgreSQL's search_path, MySQL's database).

    >>> lease_table(None), lease_table("sluice")
    ('sluiceway_leases', 'sluice.sluiceway_leases')
    """
    return DEFAULT_LEASE_TABLE if schema is None else f"{schema}.{DEFAULT_LEASE_TABLE}"


def init_leases(db: Database, table: str = DEFAULT_LEASE_TABLE) -> QuerySet:
    """Create the lease table if missing, and give one made by an older version ``acquired_at``.

    Looked for first and created only when missing: PostgreSQL checks CREATE on the schema even
    for a ``CREATE TABLE IF NOT EXISTS`` of a table that is there, so a role may use a lease table
    made for it by someone else in a schema it may not create in.
    """
    q = QuerySet("sluiceway.election", db.dialect, leases=table)
    columns = _columns(db, q, table)
    if not columns:
        db.execute(q["create_table"], what="create lease table")
        columns = _columns(db, q, table)
    if "acquired_at" not in columns:
        try:
            db.execute(q["add_acquired_at"], what="add acquired_at to the lease table")
        except DatabaseError:
            # Two processes upgrading the table at once: the loser's ALTER fails. Fine if it is there.
            if "acquired_at" not in _columns(db, q, table):
                raise
    return q


def _columns(db: Database, q: QuerySet, table: str) -> set[str]:
    schema, _, bare = table.rpartition(".")
    rows = db.fetchall(q["columns"], {"table": bare, "schema": schema or None}, what="lease table columns")
    return {str(r[0]).lower() for r in rows}


def check_leases(db: Database, table: str, name: str) -> None:
    """The lease election's start-up check, run before it campaigns: the lease table (created if
    missing, as the campaign's first step would), this election's row, and an update that
    changes nothing — all as the role the campaign runs as.

    A refusal is raised as :class:`~sluiceway.errors.StartupRefused` naming the role, the table
    and the GRANT that mends it (or the schema to create); anything else is raised as it is, for
    the caller to classify (a server out of reach is waited for).
    """
    user, current = whoami(db)
    schema, _, bare = table.rpartition(".")
    where = schema or current
    try:
        q = init_leases(db, table)
    except DatabaseError as exc:
        raise _refusal(exc, db.dialect, user, where, bare, creating=True) from exc
    try:
        db.execute(q["ensure_row"], {"name": name}, what="lease row")
        # Matches no row (no holder is '' at epoch -1), but needs the UPDATE privilege renewals need.
        db.execute(q["release"], {"name": name, "holder": "", "epoch": -1}, what="lease update")
    except DatabaseError as exc:
        raise _refusal(exc, db.dialect, user, where, bare, creating=False) from exc


def _refusal(
    exc: DatabaseError, dialect: Dialect, user: str | None, schema: str | None, bare: str, *, creating: bool
) -> BaseException:
    """``exc`` in the lease table's words when it is a refusal (a missing privilege or schema),
    else ``exc`` itself."""
    if dialect is Dialect.SQLITE:
        return exc  # no roles or schemas: the file's permissions, said by the generic fix
    mysql = dialect is Dialect.MYSQL
    kind = "database" if mysql else "schema"
    role = f"the {'user' if mysql else 'role'} {user!r}"
    to = grantee(user, dialect)
    qualified = f"{schema}.{bare}" if schema else bare
    if exc.cause is Cause.PRIVILEGE and creating:
        grant = f"GRANT CREATE ON {schema}.* TO {to}" if mysql else f"GRANT CREATE ON SCHEMA {schema} TO {to}"
        return StartupRefused(
            Permanent(
                Cause.PRIVILEGE,
                f"{role} may not create the lease table {bare} in {kind} {schema}: {exc.detail}",
                f"{grant}, or set election.schema to a {kind} it may write",
            )
        )
    if exc.cause is Cause.PRIVILEGE:
        return StartupRefused(
            Permanent(
                Cause.PRIVILEGE,
                f"{role} may not write the lease table {qualified}: {exc.detail}",
                f"GRANT SELECT, INSERT, UPDATE ON {qualified} TO {to}",
            )
        )
    if exc.cause is Cause.MISSING and exc.code in ("3F000", "1049"):
        create = f"CREATE DATABASE {schema}" if mysql else f"CREATE SCHEMA {schema} AUTHORIZATION {to}"
        return StartupRefused(
            Permanent(
                Cause.MISSING,
                f"the {kind} {schema} for the lease table does not exist: {exc.detail}",
                f"{create}, or set election.schema to one that exists",
            )
        )
    return exc


def inspect_lease(db: Database, name: str, table: str = DEFAULT_LEASE_TABLE) -> LeaseView | None:
    """The lease ``name`` as it stands, creating and changing nothing (for status views).

    ``None`` when there is no lease table or no row for ``name``; ``term`` is ``None`` on a table
    no harvester of this version has used yet.

    >>> inspect_lease(Database("sqlite:///:memory:"), "orders") is None
    True
    """
    q = QuerySet("sluiceway.election", db.dialect, leases=table)
    columns = _columns(db, q, table)
    if not columns:
        return None
    read = "read" if "acquired_at" in columns else "read_v1"
    row = db.fetchone(q[read], {"name": name}, what="read lease")
    return None if row is None else _view(row)


class SqlLeaseStore:
    """The lease table in SQLite, PostgreSQL or MySQL/MariaDB. One connection, opened on first
    use (so on the thread that uses it); the table and each name's row are created on first use."""

    def __init__(
        self, dsn: str, table: str = DEFAULT_LEASE_TABLE, *, busy_timeout: float | None = None
    ) -> None:
        # A renewal goes before this process's other writers of an SQLite file (a late renewal
        # costs the leadership, a late mark nothing), and waits for the file's lock no longer
        # than ``busy_timeout`` (a slice of the lease's term), so the campaign can try again.
        self.db = Database(dsn, urgent=True, busy_timeout=busy_timeout)
        self.table = table
        self._q: QuerySet | None = None
        self._rows: set[str] = set()

    def _queries(self) -> QuerySet:
        if self._q is None:
            self._q = init_leases(self.db, self.table)
        return self._q

    def _row(self, name: str) -> QuerySet:
        q = self._queries()
        if name not in self._rows:
            self.db.execute(q["ensure_row"], {"name": name}, what="lease row")
            self._rows.add(name)
        return q

    def acquire(self, name: str, holder: str, ttl: float) -> LeaseView | None:
        q = self._row(name)
        # Read back in the same transaction: the epoch and version we hold are the ones we wrote.
        with self.db.transaction():
            won = self.db.execute(
                q["acquire"], {"name": name, "holder": holder, "ttl": ttl}, what="acquire lease"
            )
            row = self.db.fetchone(q["read"], {"name": name}, what="read lease") if won == 1 else None
        return None if row is None else _view(row)

    def renew(self, name: str, holder: str, epoch: int, version: int, ttl: float) -> bool:
        params = {"name": name, "holder": holder, "epoch": epoch, "version": version, "ttl": ttl}
        return self.db.execute(self._row(name)["renew"], params, what="renew lease") == 1

    def release(self, name: str, holder: str, epoch: int) -> None:
        params = {"name": name, "holder": holder, "epoch": epoch}
        self.db.execute(self._row(name)["release"], params, what="release")

    def read(self, name: str) -> LeaseView | None:
        row = self.db.fetchone(self._queries()["read"], {"name": name}, what="read lease")
        return None if row is None else _view(row)

    def close(self) -> None:
        self.db.close()


def _view(row: tuple[Any, ...]) -> LeaseView:
    holder, epoch, version, remaining, *term = row
    seconds = None if not term or term[0] is None else max(0.0, float(term[0]))
    return LeaseView(holder, int(epoch), int(version), float(remaining), seconds)


class DatabaseLease:
    """Campaigns for, holds and renews one named lease. Implements ``LeaderElection``."""

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        ttl: float = 5.0,
        table: str = DEFAULT_LEASE_TABLE,
        safety: float = 0.8,
        holder: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        self.dsn = dsn
        self.name = name
        self.ttl = ttl
        self.table = table
        self.safety = safety
        self.holder = holder or f"{uuid.uuid4()}"
        self.clock = clock
        self._campaign: LeaseCampaign | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) term; 0 before the first."""
        return 0 if self._campaign is None else self._campaign.epoch

    # -- LeaderElection --------------------------------------------------------------------
    def start(self, listener: ElectionListener) -> None:
        self._campaign = LeaseCampaign(
            SqlLeaseStore(self.dsn, self.table, busy_timeout=self.ttl * self.safety / 4),
            listener,
            name=self.name,
            holder=self.holder,
            ttl=self.ttl,
            safety=self.safety,
            clock=self.clock,
        )
        self._thread = threading.Thread(
            target=self._run, args=(self._campaign,), name=f"sluice-lease-{self.name}", daemon=True
        )
        self._thread.start()

    def is_leader(self) -> bool:
        return self._campaign is not None and self._campaign.is_leader()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl + 5)

    def _run(self, campaign: LeaseCampaign) -> None:
        try:
            while not self._stop.is_set():
                self._stop.wait(campaign.step())
            campaign.resign()
        finally:
            campaign.store.close()

    def check(self, timeout: float = 10.0) -> None:
        """The start-up check (before :meth:`start`): see :func:`check_leases`. ``timeout``
        bounds the connection attempt."""
        with Database(self.dsn, connect_timeout=timeout) as db:
            check_leases(db, self.table, self.name)

    # -- inspection -------------------------------------------------------------------------
    @staticmethod
    def view(dsn: str, name: str, table: str = DEFAULT_LEASE_TABLE) -> LeaseView | None:
        store = SqlLeaseStore(dsn, table)
        try:
            return store.read(name)
        finally:
            store.close()
