"""Change data capture errors: one branch of the ``SluicewayError`` tree."""

from __future__ import annotations

from sluiceway.errors import SluicewayError


class CdcError(SluicewayError):
    """The database cannot be captured as configured; the message names what and how to fix it.

    ``permanent``: waiting will not mend it (``sluiceway.db.classify`` reads it); the two that
    may pass — a slot another process reads, a lost replication connection — say False.
    """

    permanent = True


class SlotInUseError(CdcError):
    """Another process (a running pipeline or capture) reads the same replication slot."""

    permanent = False


class LostChangesError(CdcError):
    """A sink's checkpoint points before the slot's confirmed position: changes in between are gone."""


class StreamInterrupted(CdcError):
    """The replication connection was lost (the server restarted, a network cut): transient — the
    capture reconnects and resumes from what its target holds."""

    permanent = False


class DecodeError(CdcError):
    """A replication message did not have the layout of pgoutput protocol version 1 (a server
    speaking another version, or a corrupt message): permanent, never retried."""
