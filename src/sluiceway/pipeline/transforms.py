"""Transforms: per-record Python functions, vectorised Arrow/pandas functions, Spark SQL.

* ``python: module:function`` — ``function(record) -> Record | dict | None | list``: ``None``
  drops the record, a list fans it out (the new records keep their place, so per-key order
  holds). Runs over Arrow batches on the executors (``mapInArrow``).
* ``arrow: module:function`` — ``function(pyarrow.RecordBatch) -> RecordBatch | Table | None``.
* ``pandas: module:function`` — ``function(pandas.DataFrame) -> DataFrame | None``.
* ``sql: "SELECT … FROM input"`` — Spark SQL over the stream so far, named ``input``.

The mappers are small picklable objects that import the user's function on the worker, so
nothing unpicklable is captured (Spark Connect runs them on the server).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from sluiceway.pipeline.errors import SpecError
from sluiceway.pipeline.record import Record, coerce_record, records_from_arrow, records_to_arrow

_CACHE: dict[str, Callable[..., Any]] = {}


def load_callable(ref: str, *, path: str = "transforms") -> Callable[..., Any]:
    """Import ``module:function``; a missing module or name is a :class:`SpecError` at ``path``."""
    if ref in _CACHE:
        return _CACHE[ref]
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r}: {exc}", path=path) from None
    fn: Callable[..., Any] | None = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise SpecError(f"{module_name!r} has no function {attr!r}", path=path)
    _CACHE[ref] = fn
    return fn


def apply_record_function(
    fn: Callable[[Record], Any], batch: pa.RecordBatch, schema: pa.Schema | None = None
) -> pa.RecordBatch:
    """Run a per-record function over one batch; the result keeps input order."""
    out: list[Record] = []
    for record in records_from_arrow(batch):
        result = fn(record)
        if result is None:
            continue
        if isinstance(result, list | tuple):
            out.extend(coerce_record(r) for r in result if r is not None)
        else:
            out.append(coerce_record(result))
    return records_to_arrow(out, schema or batch.schema)


def as_batches(result: Any, schema: pa.Schema) -> Iterable[pa.RecordBatch]:
    """Normalise what a vectorised Arrow function returned into batches of ``schema``."""
    if result is None:
        return []
    if isinstance(result, pa.Table):
        batches: list[pa.RecordBatch] = result.cast(schema).to_batches()
        return batches
    if isinstance(result, pa.RecordBatch):
        return [result if result.schema.equals(schema) else result.cast(schema)]
    raise TypeError(
        f"an arrow transform must return a RecordBatch, a Table or None, got {type(result).__name__}"
    )


class RecordMapper:
    """``mapInArrow`` function for a per-record Python transform."""

    def __init__(self, ref: str, schema: pa.Schema | None = None) -> None:
        self.ref = ref
        self.schema = schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = load_callable(self.ref)
        for batch in batches:
            out = apply_record_function(fn, batch, self.schema)
            if out.num_rows:
                yield out


class ArrowMapper:
    def __init__(self, ref: str, schema: pa.Schema) -> None:
        self.ref = ref
        self.schema = schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = load_callable(self.ref)
        for batch in batches:
            yield from as_batches(fn(batch), self.schema)


class PandasMapper:
    def __init__(self, ref: str) -> None:
        self.ref = ref

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        fn = load_callable(self.ref)
        for frame in frames:
            out = fn(frame)
            if out is not None:
                yield out


_WITH = re.compile(r"^\s*WITH\s", re.IGNORECASE)


def bind_input(sql: str, view: str) -> str:
    """Make ``input`` in the user's query mean ``view`` (a CTE, so the text stays theirs)."""
    cte = f"input AS (SELECT * FROM {view})"
    if _WITH.match(sql):
        return _WITH.sub(f"WITH {cte}, ", sql, count=1)
    return f"WITH {cte} {sql}"


def apply_transforms(spark: Any, df: Any, transforms: list[Any], *, view_prefix: str) -> Any:
    """Chain the spec's transforms onto a (streaming) DataFrame."""
    from pyspark.sql.pandas.types import to_arrow_schema

    for i, t in enumerate(transforms):
        where = f"transforms[{i}]"
        kind = t.kind
        if kind == "sql":
            view = f"{view_prefix}_{i}"
            df.createOrReplaceTempView(view)
            df = spark.sql(bind_input(t.sql, view))
            continue
        load_callable(t.ref, path=f"{where}.{kind}")  # fail early, naming the field
        schema = _ddl_schema(spark, t.schema_, where) if t.schema_ else df.schema
        if kind == "python":
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
            df = df.mapInArrow(RecordMapper(t.ref, arrow_schema), schema)
        elif kind == "arrow":
            df = df.mapInArrow(ArrowMapper(t.ref, to_arrow_schema(schema, timezone="UTC")), schema)
        else:
            df = df.mapInPandas(PandasMapper(t.ref), schema)
    return df


def _ddl_schema(spark: Any, ddl: str, where: str) -> Any:
    from pyspark.sql.types import StructType

    try:
        schema = spark.createDataFrame([], ddl).schema
    except Exception as exc:
        raise SpecError(f"not a valid Spark DDL schema: {exc}", path=f"{where}.schema") from None
    assert isinstance(schema, StructType)
    return schema
