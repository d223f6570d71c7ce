"""Leader election behind one small protocol: Kafka (NELI) or a database lease.

For example::

    from sluiceway.election import DatabaseLease
    lease = DatabaseLease("sqlite:///app.db", "orders-harvester", ttl=5.0)
    lease.start(listener)   # leader_acquired(epoch) / leader_revoked() / leader_fenced()
    lease.is_leader()
"""

from sluiceway.election.campaign import LeaseCampaign, NeliCampaign
from sluiceway.election.lease import DatabaseLease, SqlLeaseStore, inspect_lease
from sluiceway.election.neli import KafkaElection
from sluiceway.election.protocol import ElectionListener, LeaderElection, LeaseStore, LeaseView

__all__ = [
    "DatabaseLease",
    "ElectionListener",
    "KafkaElection",
    "LeaderElection",
    "LeaseCampaign",
    "LeaseStore",
    "LeaseView",
    "NeliCampaign",
    "SqlLeaseStore",
    "inspect_lease",
]
