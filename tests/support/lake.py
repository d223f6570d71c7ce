"""Reading Delta and Iceberg tables in tests with readers other than the sinks' own code: a
Delta table from its ``_delta_log`` (the JSON commits, replayed by hand: add and remove actions,
``txn``) and the Parquet files it lists, read with pyarrow; an Iceberg table through pyiceberg's
scan, and its data files listed by the manifests read with pyarrow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq


def delta_log(path: Path) -> tuple[list[str], dict[str, int], list[dict[str, Any]]]:
    """The live files, the ``txn`` versions per app, and every commit's actions, from the JSON log
    (no checkpoint files are expected in the tables the tests make)."""
    live: dict[str, dict[str, Any]] = {}
    txns: dict[str, int] = {}
    commits = []
    log_dir = path / "_delta_log"
    for name in sorted(n for n in os.listdir(log_dir) if n.endswith(".json")):
        actions = [json.loads(line) for line in (log_dir / name).read_text().splitlines() if line.strip()]
        commits.append({"version": int(name.split(".")[0]), "actions": actions})
        for action in actions:
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
            elif "txn" in action:
                txns[action["txn"]["appId"]] = action["txn"]["version"]
    return sorted(live), txns, commits


def read_delta(path: Path) -> list[dict[str, Any]]:
    """Every row of the table's current version, with partition values from the log."""
    files, _txns, commits = delta_log(path)
    adds = {a["add"]["path"]: a["add"] for c in commits for a in c["actions"] if "add" in a}
    rows: list[dict[str, Any]] = []
    for name in files:
        table = pq.read_table(path / unquote(name))
        part = adds[name].get("partitionValues") or {}
        for row in table.to_pylist():
            row.update(part)
            rows.append(row)
    return rows


def read_iceberg(catalog: dict[str, str], identifier: str) -> list[dict[str, Any]]:
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    table = load_catalog(props.pop("name", "sluice"), **props).load_table(identifier)
    result: pa.Table = table.scan().to_arrow()
    return result.to_pylist()


def iceberg_snapshots(catalog: dict[str, str], identifier: str) -> list[dict[str, str]]:
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    table = load_catalog(props.pop("name", "sluice"), **props).load_table(identifier)
    out = []
    for snap in table.metadata.snapshots:
        summary = snap.summary
        out.append(dict(summary.additional_properties) if summary is not None else {})
    return out
