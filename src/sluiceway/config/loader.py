"""Reading configuration at the edge: YAML + ``${ENV}`` interpolation → validated pydantic models.

Errors name the field path (``harvest.limits.sendBuffer``) and what was expected; unknown keys
are reported, never silently ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from sluiceway.clock import duration_seconds
from sluiceway.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

#: Bounds on a configuration file's shape (:func:`check_shape`): real files are a few levels
#: deep and hold hundreds of values.
MAX_DEPTH = 64
MAX_NODES = 100_000


def interpolate(value: Any, env: Mapping[str, str] | None = None, path: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed YAML tree."""
    env = os.environ if env is None else env
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"environment variable ${{{name}}} is not set (and has no :-default)", path=path
            )

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def parse_duration(value: Any, *, path: str = "") -> float:
    """Seconds from a Go-style duration (``500ms``, ``1m30s``) or a number of seconds.

    At most :data:`~sluiceway.clock.LONGEST_DURATION`: a longer one (``.inf``, 400 digits) cannot
    be waited on.
    """
    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise ConfigError(str(exc), path=path) from None


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """A pydantic error location as the user wrote it: ``harvest.target.servers.0``.

    pydantic puts the chosen member of a tagged union into the location (``target.nats.server``):
    a step that is the value of its mapping's ``type``, not one of its keys, is left out.
    """
    parts: list[str] = []
    node = data
    for step in loc:
        if isinstance(step, str) and step.startswith("function-"):
            continue  # a validator's step, not a field
        if isinstance(node, dict) and isinstance(step, str) and step not in node and node.get("type") == step:
            continue
        parts.append(str(step))
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            node = None
    return ".".join(parts)


def _unquoted(text: object) -> str:
    """pydantic's ``'nats', 'rabbitmq'`` as ``nats, rabbitmq``."""
    return str(text).replace("'", "")


def format_validation_error(exc: ValidationError, source: str = "", data: Any = None) -> ConfigError:
    problems = []
    first_path = ""
    for err in exc.errors():
        loc = _field_path(err["loc"], data)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            # "Input tag 'nat' found using 'type' does not match any of the expected tags" said as
            # a user would: the key is the discriminator, the problem its value.
            ctx = err.get("ctx") or {}
            noun = next((part for part in reversed(loc.split(".")) if not part.isdigit()), "")
            loc = f"{loc}.{_unquoted(ctx.get('discriminator', 'type'))}" if loc else "type"
            if err["type"] == "union_tag_invalid":
                msg = (
                    f"unknown {noun} type {ctx.get('tag')!r}; "
                    f"expected one of {_unquoted(ctx.get('expected_tags', ''))}"
                )
            else:
                msg = "required but missing"
            first_path = first_path or loc
            problems.append(f"{loc}: {msg}")
            continue
        first_path = first_path or loc
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not a recognised setting; check its spelling and indentation)"
        elif err["type"] == "missing":
            msg = "required but missing"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            if "input" in err and err["type"] not in ("value_error",):
                msg += f" (got {err['input']!r})"
        problems.append(f"{loc}: {msg}" if loc else msg)
    text = problems[0] if len(problems) == 1 else "; ".join(problems)
    err_obj = ConfigError(f"invalid configuration: {text}", source=source)
    err_obj.path = first_path
    return err_obj


def load_yaml(path: str | Path) -> Any:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file: {exc.strerror}", source=str(p)) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column} ({exc.reason})",
            source=str(p),
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {describe_yaml_error(exc, text)}", source=str(p)) from exc
    except RecursionError:
        # PyYAML composes nested collections recursively: a few hundred levels exhaust the stack.
        raise ConfigError(
            f"not valid YAML: nested more than {MAX_DEPTH} levels deep", source=str(p)
        ) from None
    except (ValueError, OverflowError) as exc:
        # PyYAML's constructors convert scalars with Python's own int() and datetime(), whose
        # errors it does not wrap: an integer of over 4300 digits, a date like 2024-13-45.
        raise ConfigError(f"not valid YAML: {' '.join(str(exc).split())}", source=str(p)) from None
    check_shape(data, source=str(p))
    return data


def check_shape(data: Any, *, source: str = "") -> None:
    """Refuse a parsed tree nested deeper than :data:`MAX_DEPTH` or holding more than
    :data:`MAX_NODES` values, counting a YAML alias once per use.

    ``interpolate`` and validation copy what an alias refers to at every use, so a file of a few
    hundred bytes whose aliases refer to aliases ("billion laughs") would otherwise take minutes
    and gigabytes, and an alias inside its own anchor (``&a [*a]``) would recurse forever.

    >>> check_shape(yaml.safe_load("a: &a [*a]"))
    Traceback (most recent call last):
    ...
    sluiceway.errors.ConfigError: nested more than 64 levels deep
    """
    pending: list[tuple[Any, int]] = [(data, 1)]
    seen = 0
    while pending:
        node, depth = pending.pop()
        seen += 1
        if seen > MAX_NODES:
            raise ConfigError(f"more than {MAX_NODES} values (an alias counts once per use)", source=source)
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", source=source)
        if isinstance(node, dict):
            pending.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            pending.extend((value, depth + 1) for value in node)


def describe_yaml_error(exc: yaml.YAMLError, text: str) -> str:
    r"""PyYAML's error in one line, with line and column, naming no ``<unicode string>``.

    >>> try:
    ...     yaml.safe_load("dataSource: [oops\n")
    ... except yaml.YAMLError as exc:
    ...     print(describe_yaml_error(exc, "dataSource: [oops\n"))
    line 2, column 1: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 1, column 13: dataSource: [oops)
    """  # noqa: E501
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    lines = text.splitlines()

    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    def quoted(mark: Any) -> str:
        return lines[mark.line].strip() if 0 <= mark.line < len(lines) else ""

    problem = exc.problem or "cannot parse"
    where = f"{at(exc.problem_mark)}: " if exc.problem_mark is not None else ""
    if exc.context and exc.context_mark is not None:
        near = quoted(exc.context_mark)
        return f"{where}{problem} ({exc.context} at {at(exc.context_mark)}{': ' + near if near else ''})"
    near = quoted(exc.problem_mark) if exc.problem_mark is not None else ""
    context = f"{exc.context}: " if exc.context else ""
    return f"{where}{context}{problem}{' (in: ' + near + ')' if near else ''}"


def validate(model: type[M], data: Any, *, source: str = "", env: Mapping[str, str] | None = None) -> M:
    """Interpolate environment variables into ``data`` and validate it as ``model``."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    try:
        data = interpolate(data, env)
        return model.model_validate(data)
    except ConfigError as exc:
        exc.source = exc.source or source
        raise ConfigError(exc.problem, path=exc.path, source=source) from None
    except ValidationError as exc:
        raise format_validation_error(exc, source, data) from None


def load_file(model: type[M], path: str | Path, *, env: Mapping[str, str] | None = None) -> M:
    return validate(model, load_yaml(path), source=str(path), env=env)
