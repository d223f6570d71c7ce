"""Small example transforms (used by the demo, the docs and the tests).

Name them in a spec as ``python: sluiceway.pipeline.examples:upper_key`` and so on.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.pipeline.record import Record


def upper_key(record: Record) -> Record:
    """record → record: the key in upper case."""
    return record.replace(key=record.key.upper())


def drop_deletes(record: Record) -> Record | None:
    """record → None drops it: tombstones do not go on."""
    return None if record.op == "delete" else record


def audit_copy(record: Record) -> list[Record]:
    """record → list: the record, and a copy in the ``audit`` namespace."""
    return [record, record.replace(namespace="audit", headers=[*record.headers, ("audit", "1")])]


def tag_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Arrow, vectorised: add a ``seen=arrow`` header to every record."""
    headers = [[*(h or []), {"key": "seen", "value": "arrow"}] for h in batch.column("headers").to_pylist()]
    i = batch.schema.get_field_index("headers")
    return batch.set_column(i, batch.schema.field(i), pa.array(headers, batch.schema.field(i).type))


def lower_namespace(frame: Any) -> Any:
    """pandas, vectorised: namespaces in lower case."""
    frame["namespace"] = frame["namespace"].str.lower()
    return frame


def value_length(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Arrow, vectorised, changing the shape: declare ``schema:`` in the spec."""
    lengths = pc.binary_length(batch.column("value")).cast(pa.int64())
    return pa.RecordBatch.from_arrays(
        [batch.column("offset"), batch.column("key"), lengths], names=["offset", "key", "length"]
    )
