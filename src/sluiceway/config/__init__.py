"""Configuration: YAML with ${ENV} interpolation, validated by pydantic at the edge."""

from sluiceway.config.loader import interpolate, load_file, load_yaml, parse_duration, validate

__all__ = ["interpolate", "load_file", "load_yaml", "parse_duration", "validate"]
