"""Configuration: YAML with ${ENV} interpolation, validated by pydantic at the edge."""

from sluiceway.config.loader import interpolate, load_file, load_yaml, parse_duration, validate
from sluiceway.config.types import (
    DataSourceString,
    Duration,
    KafkaSettings,
    SettingText,
    SqlIdentifier,
    StrictModel,
    TableName,
    TracingSettings,
)

__all__ = [
    "DataSourceString",
    "Duration",
    "KafkaSettings",
    "SettingText",
    "SqlIdentifier",
    "StrictModel",
    "TableName",
    "TracingSettings",
    "interpolate",
    "load_file",
    "load_yaml",
    "parse_duration",
    "validate",
]
