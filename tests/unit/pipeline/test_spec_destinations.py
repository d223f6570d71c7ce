"""A spec whose sinks would write to one place is refused at load, naming both sinks and the place.

Two parquet sinks with one ``path`` ran, exit 0, and wrote every record twice. Only the spec is
loaded here: no Spark.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sluiceway.cli.main import app
from sluiceway.pipeline import PipelineSpec, SpecError


def _load(sinks: list[dict[str, Any]], checkpoint: str = "./data/cp") -> PipelineSpec:
    spec = {
        "pipeline": {
            "name": "orders",
            "source": {"type": "journal", "path": "./data/journal"},
            "sinks": sinks,
            "checkpoint": checkpoint,
        }
    }
    return PipelineSpec.from_dict(spec, source="orders.yaml", env={})


def _refused(sinks: list[dict[str, Any]], checkpoint: str = "./data/cp") -> str:
    with pytest.raises(SpecError) as info:
        _load(sinks, checkpoint)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_two_parquet_sinks_with_one_path_spelt_two_ways_are_refused() -> None:
    message = _refused(
        [
            {"name": "lake", "type": "parquet", "path": "./out"},
            {"name": "copy", "type": "parquet", "path": "out/"},
        ]
    )
    assert message == (
        "orders.yaml: pipeline.sinks[1].path: sinks 'lake' (./out) and 'copy' (out/) both write to "
        "the same directory: every record would be written twice; give each sink its own path"
    )


def test_an_absolute_and_a_relative_spelling_are_the_same_directory() -> None:
    absolute = os.path.join(os.getcwd(), "data", "lake")
    message = _refused(
        [
            {"name": "lake", "type": "csv", "path": "data/lake"},
            {"name": "copy", "type": "delta", "path": absolute},
        ]
    )
    assert f"sinks 'lake' (data/lake) and 'copy' ({absolute}) both write to the same directory" in message


@pytest.mark.parametrize(
    ("first", "second", "field", "words"),
    [
        (
            {"type": "json", "path": "./out"},
            {"type": "journal", "path": "./out"},
            "pipeline.sinks[1].path",
            "sinks 'a' and 'b' both write to ./out: every record would be written twice",
        ),
        (
            {"type": "delta", "path": "s3://bucket/orders/"},
            {"type": "delta", "path": "s3://bucket/orders"},
            "pipeline.sinks[1].path",
            "both write to the same location",
        ),
        (
            {"type": "iceberg", "table": "shop.orders", "catalog": {"type": "sql", "uri": "sqlite:///c.db"}},
            {"type": "iceberg", "table": "shop.orders", "catalog": {"type": "sql", "uri": "sqlite:///c.db"}},
            "pipeline.sinks[1].table",
            "sinks 'a' and 'b' both write to shop.orders (catalog sqlite:///c.db)",
        ),
        (
            {"type": "parquet", "path": "./out"},
            {"type": "json", "path": "./out/rejects"},
            "pipeline.sinks[1].path",
            "sink 'b' writes to ./out/rejects, inside sink 'a''s directory ./out",
        ),
        (
            {"type": "console", "dead_letter": {"type": "json", "path": "./dead"}},
            {"type": "json", "path": "dead"},
            "pipeline.sinks[1].path",
            "sinks 'a.dead_letter' (./dead) and 'b' (dead) both write to the same directory: "
            "their records would be mixed",
        ),
    ],
)
def test_sinks_that_share_a_place_are_refused(
    first: dict[str, Any], second: dict[str, Any], field: str, words: str
) -> None:
    message = _refused([{"name": "a", **first}, {"name": "b", **second}])
    assert message.startswith(f"orders.yaml: {field}: ")
    assert words in message


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("./data/cp", "sink 'lake' writes to the checkpoint directory ./data/cp"),
        ("./data", "sink 'lake' writes to ./data, which holds the checkpoint directory ./data/cp"),
        ("./data/cp/lake/files", "where the checkpoint directory ./data/cp keeps a sink's checkpoints"),
        ("./data/cp/_cdc", "where the checkpoint directory ./data/cp keeps a sink's checkpoints"),
    ],
)
def test_a_sink_writing_among_the_checkpoints_is_refused(path: str, words: str) -> None:
    message = _refused([{"name": "lake", "type": "parquet", "path": path}])
    assert message.startswith("orders.yaml: pipeline.sinks[0].path: ")
    assert words in message


def test_places_side_by_side_and_shared_topics_load() -> None:
    spec = _load(
        [
            {"name": "lake", "type": "parquet", "path": "./data/lake"},
            {"name": "lake-json", "type": "json", "path": "./data/lake-json"},
            {"name": "side", "type": "csv", "path": "./data/cp/beside"},  # no sink is called beside
            # Records of several sinks may meet in one topic or one upserted table, by design.
            {"name": "k1", "type": "kafka", "topic": "t", "config": {"bootstrap.servers": "b:9092"}},
            {"name": "k2", "type": "kafka", "topic": "t", "config": {"bootstrap.servers": "b:9092"}},
        ]
    )
    assert [s.name for s in spec.sinks] == ["lake", "lake-json", "side", "k1", "k2"]


def test_the_cli_says_it_in_one_line_and_exits_1(tmp_path: Path) -> None:
    spec = {
        "pipeline": {
            "name": "orders",
            "source": {"type": "journal", "path": str(tmp_path / "j")},
            "sinks": [
                {"name": "lake", "type": "parquet", "path": str(tmp_path / "out")},
                {"name": "copy", "type": "parquet", "path": str(tmp_path / "out") + "/"},
            ],
            "checkpoint": str(tmp_path / "cp"),
        }
    }
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(app, ["pipeline", "status", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert (
        len(lines) == 1 and "sinks 'lake' (" in lines[0] and "every record would be written twice" in lines[0]
    )
