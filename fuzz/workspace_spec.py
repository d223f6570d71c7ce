"""Fuzz target: the workspace file loader (``Workspace.from_file``, ``sluice.yaml``).

The input is the file's bytes. Contract: a valid workspace, or
:class:`~sluiceway.errors.ConfigError` naming the file and key (the loader wraps YAML and
pydantic errors into it, ``config/loader.py``).
"""

from __future__ import annotations

from fuzz._common import YAML_FINDINGS, as_file
from sluiceway.errors import ConfigError
from sluiceway.overview.workspace import Workspace

MAX_LEN = 4096


def fuzz_one(data: bytes) -> None:
    try:
        workspace = Workspace.from_file(as_file(data))
    except ConfigError:
        return
    for outbox in workspace.outboxes:
        assert workspace.outbox(outbox.name).name == outbox.name
    for journal in workspace.journals:
        assert workspace.journal(journal.name).name == journal.name
    for feed in workspace.feeds:
        assert workspace.feed(feed.name).name == feed.name


def seeds() -> dict[str, bytes]:
    return {
        "everything": b"""outboxes:  [{name: shop, dsn: "${PG:-postgresql://app@db/app}", table: outbox}]
journals:  [{name: bus, path: ./data/journal}]
pipelines: [./orders.yaml]
feeds:     [{name: work, dsn: "sqlite:///work.db"}]
checks:    {outbox_oldest_age: 5m, pipeline_lag: 10000, expired_leases: 0}
""",
        "operations": b"""journals: [{name: bus, path: ./data/journal}]
feeds:    [{name: work, dsn: "sqlite:///work.db"}]
""",
        "detailed": b"""outboxes:
  - name: orders
    dsn: mysql://app@127.0.0.1:3306/app
    table: app.outbox
    election: null
    lease_table: sluice_lease
checks:
  outbox_oldest_age: 1m30s
  cdc_lag_bytes: 1073741824
  dead_letters: 0
  journal_consumer_lag: null
""",
        **YAML_FINDINGS,
    }
