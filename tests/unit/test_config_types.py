"""The configuration types both the harvester's config and pipeline specs are built from."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from sluiceway.config import Duration, SqlIdentifier, StrictModel, TableName, validate
from sluiceway.errors import ConfigError
from sluiceway.harvest.config import Limits
from sluiceway.pipeline.spec import TriggerSpec


class Example(StrictModel):
    timeout: Duration = 5.0
    backoff: Duration | None = Field(None, alias="backOff")
    table: TableName = "outbox"
    column: SqlIdentifier = "key"


def test_values_are_converted_and_defaults_kept() -> None:
    example = validate(
        Example, {"timeout": "1m30s", "backOff": "250ms", "table": "app.outbox", "column": "id"}
    )
    assert (example.timeout, example.backoff, example.table, example.column) == (
        90.0,
        0.25,
        "app.outbox",
        "id",
    )
    assert validate(Example, {"backoff": None}) == Example()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"timeout": "5x"}, "timeout: expected a duration like '500ms', '5s' or '1m30s', got '5x'"),
        ({"timeout": -1}, "timeout: must not be negative, got -1"),
        ({"timeout": None}, "timeout: expected a duration"),
        ({"table": "a;b"}, "table: 'a;b' is not a valid table name"),
        ({"column": "a b"}, "column: 'a b' is not a valid identifier name"),
        ({"colum": "a"}, "colum: unknown key"),
    ],
)
def test_problems_name_the_field(data: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=r"^invalid configuration: ") as caught:
        validate(Example, data)
    assert problem in str(caught.value)


def test_models_are_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        Example().timeout = 1.0  # type: ignore[misc]


def test_harvest_and_pipeline_read_durations_alike() -> None:
    assert Limits.model_validate({"heartbeatTimeout": "1500ms"}).heartbeat_timeout == 1.5
    assert TriggerSpec.model_validate({"interval": "1500ms"}).interval == 1.5
    for model, field in ((Limits, "heartbeatTimeout"), (TriggerSpec, "interval")):
        with pytest.raises(ValidationError, match="expected a duration like"):
            model.model_validate({field: "soon"})
