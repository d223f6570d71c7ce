"""Types every configuration model shares: the strict base model, durations, SQL identifiers,
librdkafka settings.

Used as field annotations, so each rule is written once and validated the same way in the
harvester's ``reaper.yaml`` and in pipeline specs::

    class Example(StrictModel):
        timeout: Duration = 5.0              # "500ms", "1m30s" or seconds
        table: TableName = "outbox"          # checked against the identifier pattern
        dsn: DataSourceString                # a DSN sluiceway can parse
        kafka: KafkaSettings                 # librdkafka's; 5000 and true load as "5000", "true"
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from sluiceway.config.loader import parse_duration
from sluiceway.db.dsn import parse_dsn
from sluiceway.db.identifiers import check_identifier
from sluiceway.errors import ConfigError

T = TypeVar("T")


class StrictModel(BaseModel):
    """Frozen once validated; an unknown key is an error; fields by name or by alias."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _reported(check: Callable[[Any], T]) -> Callable[[Any], T]:
    """Our checks raise ConfigError; pydantic reports a ValueError as the field's problem."""

    def validate(value: Any) -> T:
        try:
            return check(value)
        except ConfigError as exc:
            raise ValueError(exc.problem) from None

    return validate


#: Seconds, given as a Go-style duration (``500ms``, ``1m30s``) or a number; never negative.
Duration = Annotated[float, BeforeValidator(_reported(parse_duration)), Field(ge=0)]
#: The spelling of "wait for ever" where a start-up wait is configured.
FOREVER = "forever"


def parse_startup_timeout(value: Any) -> float:
    """A start-up wait (``startupTimeout``, ``--startup-timeout``): a duration, or ``forever``
    (``math.inf``) for orchestrators that start things in any order.

    >>> parse_startup_timeout("30s"), parse_startup_timeout("forever"), parse_startup_timeout(0)
    (30.0, inf, 0.0)
    """
    if isinstance(value, str) and value.strip().lower() == FOREVER:
        return math.inf
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return value  # a loaded configuration validated again
    try:
        return parse_duration(value)
    except ConfigError:
        raise ConfigError(f"expected a duration like '30s' or '2m', or {FOREVER}; got {value!r}") from None


#: How long a daemon waits at start-up for a database or broker out of reach: a duration or
#: ``forever``; past it, one line and exit 1.
StartupTimeout = Annotated[float, BeforeValidator(_reported(parse_startup_timeout)), Field(ge=0)]
#: A table name from configuration (optionally ``schema.table``), safe to quote into SQL.
TableName = Annotated[str, AfterValidator(_reported(check_identifier))]


def _schema_name(value: str) -> str:
    check_identifier(value, what="schema")
    if "." in value:
        raise ConfigError(f"{value!r} is not a valid schema name: one name, without a dot")
    return value


#: A schema (MySQL/MariaDB: a database) from configuration, one name, safe to quote into SQL.
SchemaName = Annotated[str, AfterValidator(_reported(_schema_name))]
#: Any other SQL identifier from configuration (a column, say), safe to quote into SQL.
SqlIdentifier = Annotated[str, AfterValidator(_reported(partial(check_identifier, what="identifier")))]


def _data_source(value: str) -> str:
    parse_dsn(value)
    return value


#: A data source string (libpq / postgresql://, sqlite:///…, mysql://…), checked when loaded.
DataSourceString = Annotated[str, AfterValidator(_reported(_data_source))]


def _setting_text(value: Any) -> str:
    """A client library's setting as the text it parses: YAML's numbers and true/false written out."""
    if isinstance(value, bool):  # before int: a bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"expected text, a number or true/false, got {value!r}")
        # 5000.0 → "5000": an integer setting's text must parse as an integer.
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    shown = "nothing" if value is None else f"a {type(value).__name__}"
    raise ValueError(f"expected text, a number or true/false, got {shown}")


#: The value of a setting a client library takes as text (librdkafka, Spark, pyiceberg,
#: delta-rs). YAML makes ``message.timeout.ms: 5000`` a number and ``enable.idempotence: true`` a
#: boolean; both are accepted and kept as the text the library parses (``"5000"``, ``"true"``).
SettingText = Annotated[str, BeforeValidator(_setting_text)]
#: librdkafka settings (``bootstrap.servers``, ``linger.ms``…), one rule for every Kafka client:
#: the harvester's ``baseKafkaConfig``/``producerKafkaConfig``, the capture's ``kafka``, a
#: pipeline Kafka source's or sink's ``config``.
KafkaSettings = dict[str, SettingText]


class TracingSettings(StrictModel):
    """``tracing:`` in a process's configuration (docs/operations.md, "Tracing"): spans exported
    over OTLP as the ``OTEL_*`` environment variables say (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``). Off by default; needs the ``otel`` extra."""

    enabled: bool = False
