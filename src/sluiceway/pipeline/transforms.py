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

from sluiceway.pipeline.errors import SpecError, TransformFailed, explain
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
        missing = getattr(exc, "name", None)
        hint = (
            " (run from the directory that holds it, or add that directory to PYTHONPATH)"
            if missing and module_name.split(".")[0] == missing.split(".")[0]
            else ""
        )
        raise SpecError(f"cannot import {module_name!r}: {exc}{hint}", path=path) from None
    fn: Callable[..., Any] | None = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise SpecError(f"{module_name!r} has no function {attr!r}", path=path)
    _CACHE[ref] = fn
    return fn


def apply_record_function(
    fn: Callable[[Record], Any], batch: pa.RecordBatch, schema: pa.Schema | None = None, *, label: str = ""
) -> pa.RecordBatch:
    """Run a per-record function over one batch; the result keeps input order.

    The function's own error becomes :class:`TransformFailed` naming the transform (``label``),
    the record's offset and key, and the error's own last line (``KeyError: 'total'``)."""
    out: list[Record] = []
    for record in records_from_arrow(batch):
        try:
            result = fn(record)
        except Exception as exc:
            where = f"the record at offset {record.offset} (key {record.key!r})"
            raise TransformFailed(f"{label or 'transform'} failed on {where}: {_said(exc)}") from exc
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


def _said(exc: BaseException) -> str:
    """An error as its traceback's last line says it, and where it was raised in the user's code:
    ``KeyError: 'total' (at myapp/transforms.py:12, in enrich)``."""
    import os
    import traceback

    text = " ".join(str(exc).split())
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if len(frames) > 1:  # the first frame is ours (the call); the last is where it was raised
        last = frames[-1]
        rel = os.path.relpath(last.filename)
        where = last.filename if rel.startswith("..") else rel
        said += f" (at {where}:{last.lineno}, in {last.name})"
    return said


def _first_offset(batch: Any) -> int | None:
    """The first offset of an Arrow batch or a pandas frame, if it has any rows and offsets."""
    try:
        if isinstance(batch, pa.RecordBatch):
            return None if batch.num_rows == 0 else int(batch.column("offset")[0].as_py())
        return None if batch.empty else int(batch["offset"].iloc[0])
    except (KeyError, TypeError, ValueError):  # a batch without offsets: say less
        return None


def _batch_failed(label: str, batch: Any, exc: BaseException) -> TransformFailed:
    """A vectorised transform's error, naming the transform and the batch's first offset."""
    first = _first_offset(batch)
    at = f"the batch from offset {first}" if first is not None else "a batch"
    return TransformFailed(f"{label} failed on {at}: {_said(exc)}")


class RecordMapper:
    """``mapInArrow`` function for a per-record Python transform."""

    def __init__(self, ref: str, schema: pa.Schema | None = None, label: str = "") -> None:
        self.ref = ref
        self.schema = schema
        self.label = label or f"python: {ref}"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = load_callable(self.ref)
        for batch in batches:
            out = apply_record_function(fn, batch, self.schema, label=self.label)
            if out.num_rows:
                yield out


class ArrowMapper:
    def __init__(self, ref: str, schema: pa.Schema, label: str = "") -> None:
        self.ref = ref
        self.schema = schema
        self.label = label or f"arrow: {ref}"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fn = load_callable(self.ref)
        for batch in batches:
            try:
                out = as_batches(fn(batch), self.schema)
            except Exception as exc:
                raise _batch_failed(self.label, batch, exc) from exc
            yield from out


class PandasMapper:
    def __init__(self, ref: str, label: str = "") -> None:
        self.ref = ref
        self.label = label or f"pandas: {ref}"

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        fn = load_callable(self.ref)
        for frame in frames:
            try:
                out = fn(frame)
            except Exception as exc:
                raise _batch_failed(self.label, frame, exc) from exc
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
            try:
                # Analysed here, before the first batch: a column or table that does not exist
                # is one line naming the transform, not Spark's plan.
                df = spark.sql(bind_input(t.sql, view))
            except Exception as exc:
                if not type(exc).__module__.startswith("pyspark"):
                    raise
                raise SpecError(explain(exc), path=f"{where}.sql") from None
            continue
        load_callable(t.ref, path=f"{where}.{kind}")  # fail early, naming the field
        schema = _ddl_schema(spark, t.schema_, where) if t.schema_ else df.schema
        label = f"{where} ({kind}: {t.ref})"
        if kind == "python":
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
            df = df.mapInArrow(RecordMapper(t.ref, arrow_schema, label), schema)
        elif kind == "arrow":
            df = df.mapInArrow(ArrowMapper(t.ref, to_arrow_schema(schema, timezone="UTC"), label), schema)
        else:
            df = df.mapInPandas(PandasMapper(t.ref, label), schema)
    return df


def _ddl_schema(spark: Any, ddl: str, where: str) -> Any:
    from pyspark.sql.types import StructType

    try:
        schema = spark.createDataFrame([], ddl).schema
    except Exception as exc:
        raise SpecError(f"not a valid Spark DDL schema: {exc}", path=f"{where}.schema") from None
    assert isinstance(schema, StructType)
    return schema
