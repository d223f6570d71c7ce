"""A postgres-cdc pipeline into a Delta mirror sink (``columns: json``) on the session's local
Spark: a table is copied, then a writer inserts, updates, deletes and moves rows (a changed
primary key) while the pipeline runs continuously, and adds a column midway. Once the writer
stops and the pipeline catches up, the Delta table (read from its ``_delta_log`` with pyarrow,
not the sink's code) equals the PostgreSQL table row for row, the added column in its schema and
null for rows last written before it existed."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluiceway.pipeline import Pipeline, PipelineSpec
from sluiceway.testing import wait_until
from tests.support.lake import delta_log, read_delta

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NAMESPACE = "public.items"
COLUMNS = ("id", "name", "qty", "price", "active", "payload", "updated", "tag")
INITIAL = 300


def spec(tmp_path: Path, dsn: str) -> PipelineSpec:
    return PipelineSpec.from_dict(
        {
            "pipeline": {
                "name": "lakecdc",
                "source": {
                    "type": "postgres-cdc",
                    "dsn": dsn,
                    "tables": [NAMESPACE],
                    "slot": "lakecdc_slot",
                    "publication": "lakecdc_pub",
                    "snapshot": "initial",
                    "chunk_size": 100,
                    "max_records_per_batch": 200,
                },
                "sinks": [
                    {
                        "name": "mirror",
                        "type": "delta",
                        "path": str(tmp_path / "mirror"),
                        "mode": "mirror",
                        "columns": "json",
                    }
                ],
                "checkpoint": str(tmp_path / "cp"),
                "trigger": {"interval": 0.3},
            }
        }
    )


class Writer(threading.Thread):
    """Inserts, updates (some in multi-row transactions), deletes and primary-key moves on
    ``items`` at a steady pace; after ``alter_after`` operations it adds the column ``tag`` and
    from then on every row it writes carries one."""

    def __init__(self, dsn: str, *, ops: int, alter_after: int, pace: float = 0.015) -> None:
        super().__init__(daemon=True)
        self.dsn, self.total, self.alter_after, self.pace = dsn, ops, alter_after, pace
        self.rng = random.Random(11)
        self.ops = 0
        self.altered = threading.Event()
        self.written_after: set[int] = set()  # ids written (inserted, updated, moved to) after the ALTER
        self.error: BaseException | None = None
        self._next_id = 10_000

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while self.ops < self.total:
                    if self.ops == self.alter_after and not self.altered.is_set():
                        conn.execute("ALTER TABLE items ADD COLUMN tag text")
                        self.altered.set()
                    self._one(conn)
                    self.ops += 1
                    time.sleep(self.pace)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _ids(self, conn: psycopg.Connection[Any]) -> list[int]:
        return [r[0] for r in conn.execute("SELECT id FROM items").fetchall()]

    def _tag(self, ids: list[int]) -> str:
        if not self.altered.is_set():
            return ""
        self.written_after.update(ids)
        return f", tag = 't{self.ops}'"

    def _update(self, conn: psycopg.Connection[Any], row_id: int) -> None:
        rng = self.rng
        qty = rng.choice([None, rng.randint(-5, 500)])
        payload = "jsonb_set(coalesce(payload, '{}'), '{n}', to_jsonb(%s::int))"
        conn.execute(
            "UPDATE items SET qty = %s, price = %s, active = NOT active, updated = now(), "
            f"payload = {payload}{self._tag([row_id])} WHERE id = %s",
            (qty, round(rng.uniform(0, 999), 2), self.ops, row_id),
        )

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        rng, pick = self.rng, self.rng.random()
        ids = self._ids(conn)
        if pick < 0.35 or not ids:
            self._next_id += 1
            new = self._next_id
            values: dict[str, Any] = {
                "id": new,
                "name": f"new {new}",
                "qty": rng.randint(0, 50),
                "price": 1.5,
                "active": True,
                "payload": json.dumps({"w": self.ops}),
            }
            if self.altered.is_set():
                self.written_after.add(new)
                values["tag"] = f"t{self.ops}"
            names = ", ".join(values)
            marks = ", ".join(["%s"] * len(values))
            conn.execute(f"INSERT INTO items ({names}) VALUES ({marks})", tuple(values.values()))
        elif pick < 0.65:
            self._update(conn, rng.choice(ids))
        elif pick < 0.75:
            with conn.transaction():  # several keys, one of them twice, in one transaction
                chosen = rng.sample(ids, min(3, len(ids)))
                for row_id in [*chosen, chosen[0]]:
                    self._update(conn, row_id)
        elif pick < 0.92:
            conn.execute("DELETE FROM items WHERE id = %s", (rng.choice(ids),))
        else:
            # A changed primary key: the old key is deleted, the new one written.
            self._next_id += 1
            old, new = rng.choice(ids), self._next_id
            moved = f"UPDATE items SET id = %s, name = name || ' moved'{self._tag([new])} WHERE id = %s"
            conn.execute(moved, (new, old))


def pg_rows(dsn: str) -> dict[str, dict[str, Any]]:
    """The table's rows by record key, as ``row_to_json`` gives them (UTC timestamps)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        texts = conn.execute("SELECT row_to_json(i.*)::text FROM items i").fetchall()
    rows = [json.loads(t) for (t,) in texts]
    return {str(r["id"]): r for r in rows}


def delta_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The Delta table's rows of ``items`` by key: the table's own columns (the record columns
    left out), the jsonb column parsed back from its JSON text."""
    if not (path / "_delta_log").is_dir():
        return {}
    out = {}
    for row in read_delta(path):
        assert row["namespace"] == NAMESPACE
        assert row["key"] not in out, f"key {row['key']} twice in the mirror"
        values = {c: row.get(c) for c in COLUMNS}
        if isinstance(values["payload"], str):
            values["payload"] = json.loads(values["payload"])
        out[row["key"]] = values
    return out


def as_expected(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: {c: r.get(c) for c in COLUMNS} for k, r in rows.items()}


def test_cdc_into_a_delta_mirror_follows_inserts_updates_deletes_and_an_added_column(
    sluice_spark: Any, cdc_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, qty int, price numeric(10, 2), "
            "active boolean NOT NULL DEFAULT true, payload jsonb, updated timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(
            "INSERT INTO items (id, name, qty, price, active, payload) "
            "SELECT g, 'item ' || g, CASE WHEN g %% 10 = 0 THEN NULL ELSE g END, g * 0.25, g %% 2 = 0, "
            "jsonb_build_object('g', g, 'tags', jsonb_build_array('a', g)) FROM generate_series(1, %s) g",
            (INITIAL,),
        )
    pipeline_spec = spec(tmp_path, cdc_dsn)
    table = tmp_path / "mirror"
    pipeline = Pipeline(pipeline_spec, sluice_spark)
    runs: dict[str, Any] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runs.update(pipeline.run(handle_signals=False))
        except BaseException as exc:  # reported below
            failure.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    writer = Writer(cdc_dsn, ops=400, alter_after=200)
    runner.start()
    try:

        def running() -> bool:
            assert runner.is_alive(), f"the pipeline ended: {runs or failure}"
            return "mirror" in pipeline.queries

        wait_until(running, timeout=60, message="the pipeline to start")
        copied = as_expected(pg_rows(cdc_dsn))

        def copy_in() -> bool:
            assert runner.is_alive(), f"the pipeline ended: {runs or failure}"
            return delta_rows(table) == copied

        # The copy reaches the table first; then the writes, while the pipeline keeps running.
        wait_until(copy_in, timeout=60, interval=0.3, message="the copied table in the Delta mirror")
        writer.start()
        writer.join(60)
        assert not writer.is_alive() and writer.error is None, writer.error
        assert writer.ops == 400 and writer.written_after

        expected = as_expected(pg_rows(cdc_dsn))

        def caught_up() -> bool:
            assert runner.is_alive(), f"the pipeline ended: {runs or failure}"
            return delta_rows(table) == expected

        try:
            wait_until(caught_up, timeout=45, interval=0.5, message="the Delta mirror to equal the table")
        except TimeoutError:
            got = delta_rows(table)
            missing = sorted(expected.keys() - got.keys())[:10]
            extra = sorted(got.keys() - expected.keys())[:10]
            both = expected.keys() & got.keys()
            differ = [(k, got[k], expected[k]) for k in both if got[k] != expected[k]][:3]
            pytest.fail(f"mirror differs: missing {missing}, extra {extra}, different {differ}")
    finally:
        pipeline.request_stop()
        runner.join(60)
    assert not failure, failure
    assert runs["mirror"].state in ("stopped", "finished"), runs

    # Row for row, every column (compared above); and the added column is in the table's schema,
    # null for each row last written before the ALTER and set for each written after it.
    got = delta_rows(table)
    assert len(got) == len(expected) > INITIAL // 2
    _files, _txns, commits = delta_log(table)
    metadata = [a["metaData"] for c in commits for a in c["actions"] if "metaData" in a]
    schema = json.loads(metadata[-1]["schemaString"])
    fields = {f["name"]: f for f in schema["fields"]}
    assert fields["tag"]["type"] == "string" and fields["tag"]["nullable"] is True
    before = [k for k in got if int(k) not in writer.written_after]
    after = [k for k in got if int(k) in writer.written_after]
    assert before and after
    assert all(got[k]["tag"] is None for k in before)
    assert all(got[k]["tag"] is not None for k in after)
    # The copy and the changes both reached the table: original rows, updated and untouched ones.
    assert any(int(k) <= INITIAL for k in got) and any(int(k) > INITIAL for k in got)
