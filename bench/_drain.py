"""One timed drain, in a process of its own: ``bench/harvest.py --versus`` runs it on this tree
and on an older one (``PYTHONPATH``), alternating, on the same rows and broker.

    python bench/_drain.py DSN BOOTSTRAP NAME MARK_RECORDS ROWS [HEADERS]

Prints the rate (records/s). Uses only what every version of the package has had: ``Harvest``,
``HarvestConfig.from_dict`` and ``timed_drain``. ``HEADERS`` (``on`` or ``off``) sets
``sequenceHeaders``; left out when not given (a tree from before them refuses the key).
"""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import timed_drain
from sluiceway.harvest import HarvestConfig


def main() -> None:
    dsn, bootstrap, name, mark, rows = sys.argv[1:6]
    harvest: dict[str, object] = {
        "name": name,
        "dataSource": dsn,
        "baseKafkaConfig": {"bootstrap.servers": bootstrap},
        "election": {"kind": "database"},
        "limits": {"markQueryRecords": int(mark), "minMetricsInterval": "60s"},
    }
    if len(sys.argv) > 6:
        harvest["sequenceHeaders"] = sys.argv[6] == "on"
    config = HarvestConfig.from_dict({"harvest": harvest})
    try:  # as the tree's own `sluice reap` does, where it does (trees before sluiceway.heap do not)
        from sluiceway.heap import tune_collector
    except ImportError:
        pass
    else:
        tune_collector()

    def left() -> int:
        with psycopg.connect(dsn) as conn:
            return int(conn.execute("SELECT count(*) FROM outbox").fetchone()[0])  # type: ignore[index]

    print(f"{timed_drain(config, int(rows), left):.1f}")


if __name__ == "__main__":
    main()
