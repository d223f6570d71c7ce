"""Delta Lake and Iceberg sinks on the local session: append and mirror, `--once` twice exact, a
batch replayed after its table commit commits nothing, schema evolution, and the tables read back
by readers other than the sinks' own code (tests/support/lake.py)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sluiceway.pipeline import Pipeline, PipelineSpec
from tests.support.journal import make_journal
from tests.support.lake import delta_log, iceberg_snapshots, read_delta, read_iceberg

pytestmark = pytest.mark.spark


def catalog(tmp_path: Path) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }


def records(n: int, *, keys: int) -> list[tuple[str, str, bytes | None]]:
    """Changes over ``keys`` keys: every seventh a delete (a tombstone), the rest JSON rows."""
    out: list[tuple[str, str, bytes | None]] = []
    for i in range(n):
        key = f"k{i % keys}"
        value = None if i % 7 == 6 else json.dumps({"id": i % keys, "n": i, "name": f"r{i}"}).encode()
        out.append(("orders" if i % 2 else "items", key, value))
    return out


def expected_mirror(recs: list[tuple[str, str, bytes | None]]) -> dict[tuple[str, str], dict[str, Any]]:
    state: dict[tuple[str, str], dict[str, Any]] = {}
    for ns, key, value in recs:
        if value is None:
            state.pop((ns, key), None)
        else:
            state[(ns, key)] = json.loads(value)
    return state


def spec(tmp_path: Path, journal: Path, cat: dict[str, str]) -> PipelineSpec:
    return PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "lake",
                "source": {"type": "journal", "path": str(journal), "max_records_per_batch": 400},
                "sinks": [
                    {
                        "name": "dappend",
                        "type": "delta",
                        "path": str(tmp_path / "dappend"),
                        "partition_by": ["namespace"],
                    },
                    {
                        "name": "djson",
                        "type": "delta",
                        "path": str(tmp_path / "djson"),
                        "columns": "json",
                        "optimize_every": 2,
                    },
                    {
                        "name": "dmirror",
                        "type": "delta",
                        "path": str(tmp_path / "dmirror"),
                        "mode": "mirror",
                        "columns": "json",
                    },
                    {
                        "name": "iappend",
                        "type": "iceberg",
                        "catalog": cat,
                        "table": "lake.appended",
                        "partition_by": ["namespace"],
                    },
                    {
                        "name": "imirror",
                        "type": "iceberg",
                        "catalog": cat,
                        "table": "lake.mirrored",
                        "mode": "mirror",
                        "columns": "json",
                    },
                ],
                "checkpoint": str(tmp_path / "cp"),
            }
        }
    )


def test_append_and_mirror_into_delta_and_iceberg_exactly_once(sluice_spark: Any, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    first = records(1000, keys=120)
    make_journal(journal, first)
    cat = catalog(tmp_path)
    pipeline_spec = spec(tmp_path, journal, cat)
    runs = Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    assert {name: run.state for name, run in runs.items()} == dict.fromkeys(runs, "finished")

    second = [
        (ns, key, json.dumps({"id": 1, "n": 5000 + i, "name": "x", "extra": i}).encode())
        for i, (ns, key, _) in enumerate(records(300, keys=40))
    ]
    make_journal(journal, second)
    Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)  # nothing new: nothing written
    everything = first + second

    # Append: every record once, by offset; the record's own columns.
    appended = read_delta(tmp_path / "dappend")
    assert sorted(r["offset"] for r in appended) == list(range(len(everything)))
    assert Counter((r["namespace"], r["key"], r["value"]) for r in appended) == Counter(everything)
    assert pl.read_delta(str(tmp_path / "dappend")).get_column("offset").sort().to_list() == list(
        range(len(everything))
    )  # and Polars, another Delta reader, sees the same table
    iceberg_rows = read_iceberg(cat, "lake.appended")
    assert sorted(r["offset"] for r in iceberg_rows) == list(range(len(everything)))

    # columns: json — the value unpacked; a field that appears later becomes a nullable column.
    unpacked = read_delta(tmp_path / "djson")
    assert len(unpacked) == len(everything)
    by_offset = {r["offset"]: r for r in unpacked}
    assert by_offset[3]["name"] == "r3" and by_offset[3].get("extra") is None
    assert by_offset[1000 + 7]["extra"] == 7

    _files, _txns, commits = delta_log(tmp_path / "djson")
    operations = [a["commitInfo"]["operation"] for c in commits for a in c["actions"] if "commitInfo" in a]
    assert "OPTIMIZE" in operations  # compacted every second batch; the rows above are unchanged

    # Mirror: the last state of every key, deletes applied, in both formats.
    want = expected_mirror(everything)
    for got in (read_delta(tmp_path / "dmirror"), read_iceberg(cat, "lake.mirrored")):
        state = {(r["namespace"], r["key"]): {k: r.get(k) for k in ("id", "n", "name")} for r in got}
        assert len(got) == len(state)
        assert state == {k: {f: v.get(f) for f in ("id", "n", "name")} for k, v in want.items()}

    # One table commit per batch, each carrying its marker.
    _files, txns, commits = delta_log(tmp_path / "dappend")
    assert len(txns) == 1 and next(iter(txns.values())) == len(commits) - 1
    markers = [s for s in iceberg_snapshots(cat, "lake.appended") if "sluice.batch" in s]
    assert [int(s["sluice.batch"]) for s in markers] == list(range(len(markers)))


def test_a_batch_replayed_after_its_table_commit_commits_nothing(
    sluice_spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The crash between the table's commit and Spark's: Spark's record of the last batch is
    removed, so Spark runs that batch again; the markers make it a no-op in every sink."""
    journal = tmp_path / "journal"
    recs = records(600, keys=50)
    make_journal(journal, recs)
    cat = catalog(tmp_path)
    pipeline_spec = spec(tmp_path, journal, cat)
    Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    before = {
        "dappend": len(read_delta(tmp_path / "dappend")),
        "iappend": len(read_iceberg(cat, "lake.appended")),
        "dlog": len(delta_log(tmp_path / "dappend")[2]),
    }
    for sink in ("dappend", "djson", "dmirror", "iappend", "imirror"):
        commits = sorted(
            (tmp_path / "cp" / sink).rglob("commits/*"), key=lambda p: int(p.name) if p.name.isdigit() else -1
        )
        last = [p for p in commits if p.name.isdigit()][-1]
        last.unlink()  # Spark forgets it committed the batch: it runs it again
        state_file = tmp_path / "cp" / sink / "sluice" / "state.json"
        state = json.loads(state_file.read_text())
        assert state["batch"] == int(last.name)
        state["done"] = False  # and the sink's own record of it is lost with the crash too
        state_file.write_text(json.dumps(state))
    with caplog.at_level(logging.INFO, logger="sluiceway.pipeline.sink"):
        Pipeline(pipeline_spec, sluice_spark).run(once=True, handle_signals=False)
    replayed = [r.getMessage() for r in caplog.records if "is in the table already" in r.getMessage()]
    assert any("sink dappend: batch 1 " in m for m in replayed), replayed  # Spark did run it again
    assert any("sink iappend: batch 1 " in m for m in replayed), replayed
    assert len(read_delta(tmp_path / "dappend")) == before["dappend"] == len(recs)
    assert len(read_iceberg(cat, "lake.appended")) == before["iappend"]
    assert len(delta_log(tmp_path / "dappend")[2]) == before["dlog"]
