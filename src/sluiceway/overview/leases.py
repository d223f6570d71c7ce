"""A leader as the views show it: the database lease row its processes elect with, read without
taking or changing it (:func:`~sluiceway.election.lease.inspect_lease`)."""

from __future__ import annotations

from sluiceway.db import Database
from sluiceway.election.lease import DEFAULT_LEASE_TABLE, inspect_lease
from sluiceway.overview.report import Leader


def leader_of(db: Database, election: str, table: str = DEFAULT_LEASE_TABLE) -> Leader | None:
    """The holder of the lease ``election`` (its epoch, term and time left by the database's
    clock), or ``None`` when there is no lease table, no row, or nobody holds it."""
    lease = inspect_lease(db, election, table)
    if lease is None or lease.holder is None:
        return None
    return Leader(election, lease.holder, lease.epoch, lease.term, lease.remaining)
