"""Spec errors name every problem, unknown keys first, each with a "did you mean" when one is close."""

from __future__ import annotations

from typing import Any

import pytest

from sluiceway.pipeline import PipelineSpec, SpecError


def _spec(**overrides: Any) -> dict[str, Any]:
    inner: dict[str, Any] = {
        "name": "orders",
        "source": {"type": "journal", "path": "./data/journal"},
        "sinks": [{"name": "lake", "type": "parquet", "path": "./data/lake"}],
        "checkpoint": "./data/cp",
    }
    inner.update(overrides)
    return {"pipeline": inner}


def _error(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as info:
        PipelineSpec.from_dict(data, source="orders.yaml", env={})
    return info.value


def test_a_misspelt_sink_key_is_named_first_with_a_suggestion() -> None:
    err = _error(_spec(sinks=[{"name": "lake", "type": "parquet", "paht": "./data/lake"}]))
    assert err.path == "pipeline.sinks[0].paht"
    assert str(err) == (
        "orders.yaml: pipeline.sinks[0].paht: unknown key (did you mean 'path'?); "
        "pipeline.sinks[0].path: required but missing"
    )


def test_sink_for_sinks_names_the_unknown_key() -> None:
    data = _spec()
    data["pipeline"]["sink"] = data["pipeline"].pop("sinks")
    err = _error(data)
    assert err.path == "pipeline.sink"
    assert str(err).startswith("orders.yaml: pipeline.sink: unknown key (did you mean 'sinks'?); ")
    assert "pipeline.sinks: required but missing" in str(err)
    assert "more problem" not in str(err)


def test_every_problem_is_listed_unknown_keys_first() -> None:
    err = _error(
        _spec(
            source={"type": "journal", "pth": "j"},
            trigger={"intreval": "1s"},
            sinks=[
                {"name": "lake", "type": "parquet", "path": "x", "retry": {"atempts": 2}},
                {"name": "db", "type": "postgres", "dsn": "host=x"},
            ],
        )
    )
    problems = str(err).removeprefix("orders.yaml: ").split("; ")
    assert problems == [
        "pipeline.source.pth: unknown key (did you mean 'path'?)",
        "pipeline.sinks[0].retry.atempts: unknown key (did you mean 'attempts'?)",
        "pipeline.trigger.intreval: unknown key (did you mean 'interval'?)",
        "pipeline.source.path: required but missing",
        "pipeline.sinks[1].table: required but missing",
    ]


@pytest.mark.parametrize(
    ("source", "sink", "bad", "guess"),
    [
        ({"type": "nats", "stream": "s", "ack_timout": 1}, None, "pipeline.source.ack_timout", "ack_timeout"),
        (None, {"name": "r", "type": "redis", "max_lenn": 3}, "pipeline.sinks[0].max_lenn", "max_len"),
        (None, {"name": "c", "type": "console", "limt": 1}, "pipeline.sinks[0].limt", "limit"),
        (
            None,
            {"name": "c", "type": "console", "dead_letter": {"type": "journal", "pat": "d"}},
            "pipeline.sinks[0].dead_letter.pat",
            "path",
        ),
    ],
)
def test_the_suggestion_comes_from_the_model_at_that_place(
    source: Any, sink: Any, bad: str, guess: str
) -> None:
    overrides: dict[str, Any] = {}
    if source:
        overrides["source"] = source
    if sink:
        overrides["sinks"] = [sink]
    err = _error(_spec(**overrides))
    assert err.path == bad
    assert f"unknown key (did you mean {guess!r}?)" in str(err)


def test_an_unknown_key_with_nothing_close_asks_to_check_it() -> None:
    err = _error(_spec(colour="blue"))
    assert str(err) == "orders.yaml: pipeline.colour: unknown key (check its spelling and indentation)"


def test_a_key_beside_pipeline_is_named() -> None:
    data = _spec()
    data["pipelines"] = {}
    err = _error(data)
    assert err.path == "pipelines"
    assert "unknown key" in str(err)
