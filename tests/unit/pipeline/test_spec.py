"""The pipeline spec: the issue's example parses; every kind of mistake names its field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluiceway.pipeline import PipelineSpec, SpecError

EXAMPLE = """
pipeline:
  name: orders
  source: {type: journal, path: ./data/journal}
  namespace: "^orders\\\\."
  transforms:
    - python: myapp.transforms:enrich
    - sql: "SELECT *, upper(key) AS k2 FROM input"
  sinks:
    - {name: lake, type: parquet, path: ./data/lake, namespace: "^orders\\\\.created$"}
    - {name: bus, type: kafka, topic: orders-out, config: {bootstrap.servers: "${KAFKA}"}}
    - {name: db, type: postgres, dsn: "${PG}", table: orders_view, key: key}
  checkpoint: ./data/checkpoints
  trigger: {interval: 1s}
"""


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE))


def test_the_issue_example_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA", "127.0.0.1:9092")
    monkeypatch.setenv("PG", "host=db")
    path = tmp_path / "orders.yaml"
    path.write_text(EXAMPLE)
    spec = PipelineSpec.from_yaml(path)
    assert spec.name == "orders"
    assert spec.namespace == r"^orders\."
    assert [t.kind for t in spec.transforms] == ["python", "sql"]
    assert [s.name for s in spec.sinks] == ["lake", "bus", "db"]
    assert spec.sink("bus").config == {"bootstrap.servers": "127.0.0.1:9092"}  # type: ignore[union-attr]
    assert spec.sink("db").key == "key"  # type: ignore[union-attr]
    assert spec.trigger.interval == 1.0
    assert spec.checkpoint_dir("db") == Path("./data/checkpoints/db")


def test_builder_validates_like_yaml() -> None:
    spec = (
        PipelineSpec.builder("b")
        .source("kafka", topic=["a", "b"], config={"bootstrap.servers": "x:1"})
        .transform(pandas="m:f", schema="key STRING")
        .sink("out", "console", limit=5)
        .checkpoint("/tmp/cp")
        .trigger("250ms")
        .build()
    )
    assert spec.source.topics == ["a", "b"]  # type: ignore[union-attr]
    assert spec.transforms[0].schema_ == "key STRING"
    assert spec.trigger.interval == 0.25
    with pytest.raises(SpecError, match=r"sinks: .*at least 1"):
        PipelineSpec.builder("b").source("journal", path="j").checkpoint("c").build()


def _err(mutate: Any) -> SpecError:
    data = copy.deepcopy(example())
    mutate(data["pipeline"])
    with pytest.raises(SpecError) as info:
        PipelineSpec.from_dict(data, source="orders.yaml", env={"KAFKA": "k:1", "PG": "host=x"})
    return info.value


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda p: p["sinks"][2].pop("table"), "pipeline.sinks[2].table", "required"),
        (lambda p: p["sinks"][1].update(type="kafkaz"), "pipeline.sinks[1].type", "unknown type 'kafkaz'"),
        (lambda p: p["sinks"][0].update(namespace="(("), "pipeline.sinks[0].namespace", "regular expression"),
        (lambda p: p.update(namespace="[z-a]"), "pipeline.namespace", "regular expression"),
        (lambda p: p["transforms"][0].update(sql="SELECT 1"), "pipeline.transforms[0]", "exactly one"),
        (
            lambda p: p["transforms"].append({"arrow": "no-colon"}),
            "pipeline.transforms[2].arrow",
            "module:function",
        ),
        (lambda p: p["sinks"][1].update(name="lake"), "pipeline.sinks[1].name", "used by another sink"),
        (lambda p: p["sinks"][1].update(name="bad name"), "pipeline.sinks[1].name", "letters, digits"),
        (lambda p: p.update(trigger={"interval": "fast"}), "pipeline.trigger.interval", "duration"),
        (
            lambda p: p["sinks"][0].update(retry={"attempts": 0}),
            "pipeline.sinks[0].retry.attempts",
            "greater than or equal to 1",
        ),
        (lambda p: p["source"].pop("type"), "pipeline.source.type", "needs a 'type'"),
        (lambda p: p["sinks"][0].update(colour=1), "pipeline.sinks[0].colour", "unknown key"),
        (
            lambda p: p["sinks"][0].update(dead_letter={"type": "journal"}),
            "pipeline.sinks[0].dead_letter.path",
            "required",
        ),
        (lambda p: p["sinks"][1].update(config={}), "pipeline.sinks[1].config", "bootstrap.servers"),
        (lambda p: p["sinks"][2].update(table="orders; drop"), "pipeline.sinks[2].table", "not a valid"),
        (lambda p: p.pop("checkpoint"), "pipeline.checkpoint", "required"),
        (
            lambda p: p.update(source={"type": "outbox", "dsn": "sqlite:///x.db"}),
            "pipeline.sinks",
            "exactly one sink",
        ),
    ],
)
def test_a_bad_spec_names_the_field(mutate: Any, path: str, words: str) -> None:
    err = _err(mutate)
    assert err.path == path
    assert words in str(err)
    assert str(err).startswith("orders.yaml: ")


def test_missing_environment_variable_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"pipeline\.sinks\[1\]\.config\.bootstrap\.servers.*KAFKA"):
        PipelineSpec.from_dict(example(), env={"PG": "x"})


def test_unknown_sink_name() -> None:
    spec = PipelineSpec.from_dict(example(), env={"KAFKA": "k:1", "PG": "x"})
    with pytest.raises(SpecError, match="no sink named 'nope'"):
        spec.sink("nope")


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        PipelineSpec.from_yaml(path)
    with pytest.raises(SpecError, match="cannot read"):
        PipelineSpec.from_yaml(tmp_path / "missing.yaml")


def test_every_sink_kind_has_one_row_naming_its_own_spec() -> None:
    """The kinds table (``SINK_KINDS``) and the spec's union name the same kinds, each once, and
    each row's spec class is the one whose ``type`` names it."""
    from typing import get_args

    from sluiceway.pipeline.sinks.kinds import SINK_KINDS, Path
    from sluiceway.pipeline.spec import SinkSpec

    union = get_args(get_args(SinkSpec)[0])
    by_kind = {kind: model for model in union for kind in get_args(model.model_fields["type"].annotation)}
    assert sorted(by_kind) == sorted(SINK_KINDS)
    assert all(SINK_KINDS[kind].spec is model for kind, model in by_kind.items())
    assert {k for k, row in SINK_KINDS.items() if row.path is Path.FILES} == {"parquet", "json", "csv"}
    assert {k for k, row in SINK_KINDS.items() if row.check is None} == {"console"}
