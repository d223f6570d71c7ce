"""One relation as the change stream last described it: how its rows become a key and a JSON
value, value by value. The reference the column-wise decoder (:mod:`sluiceway.cdc.columnar`) is
held to, and its fallback for the rows that one does not cover."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sluiceway.cdc.columnar import RowResult
from sluiceway.cdc.model import TableInfo
from sluiceway.cdc.pgoutput import UNCHANGED, Delete, Insert, Relation, Update, decode
from sluiceway.cdc.values import Kind, PgType, composite_key, row_key, to_json
from sluiceway.errors import InvariantViolation


class RelationDecoder:
    """A relation version: its JSON mapping and key positions; decodes one change value by value
    (the reference the column-wise decoder is held to, and its fallback)."""

    __slots__ = ("full_row", "key_pos", "key_positions", "names", "namespace", "prefixes", "types")

    def __init__(self, rel: Relation, info: TableInfo, types: Mapping[int, PgType]) -> None:
        self.namespace = rel.namespace
        self.names = [c.name for c in rel.columns]
        self.prefixes = [to_json(name, NAME) + ":" for name in self.names]
        self.types = [types[c.type_oid] for c in rel.columns]
        self.full_row = info.key_columns is None
        #: Key positions for the column-wise decoder; ``None``: the key is the whole row (value by value).
        self.key_positions: list[int] | None = None
        if info.key_columns is None:
            self.key_pos = list(range(len(rel.columns)))
        else:
            position = {name: i for i, name in enumerate(self.names)}
            missing = [c for c in info.key_columns if c not in position]
            if missing:
                raise InvariantViolation(f"{self.namespace}: key column(s) {missing} missing from the stream")
            self.key_pos = [position[c] for c in info.key_columns]
            self.key_positions = self.key_pos

    def key(self, values: Sequence[object]) -> str | None:
        """The record key; ``None`` when ``values`` (an old ``K`` tuple) does not hold it."""
        if self.full_row:
            return row_key([json.loads(to_json(_text(values[i]), self.types[i])) for i in self.key_pos])
        texts = [values[i] for i in self.key_pos]
        if any(not isinstance(t, str) for t in texts):
            return None
        if len(texts) == 1:
            return str(texts[0])
        return composite_key(
            [to_json(str(t), self.types[i]) for t, i in zip(texts, self.key_pos, strict=True)]
        )

    def value(self, new: Sequence[object], old: Sequence[object] | None) -> tuple[bytes, list[str]]:
        """The row as a JSON object; and the names of unchanged TOASTed columns left out of it."""
        parts = []
        missing: list[str] = []
        for i, text in enumerate(new):
            if text is UNCHANGED:
                if old is not None and old[i] is not UNCHANGED:
                    text = old[i]  # REPLICA IDENTITY FULL: the old row carries it
                else:
                    missing.append(self.names[i])
                    continue
            parts.append(self.prefixes[i] + to_json(_text(text), self.types[i]))
        return ("{" + ",".join(parts) + "}").encode(), missing

    def decode_one(self, data: bytes) -> RowResult:
        change = decode(data)
        if isinstance(change, Insert):
            value, _ = self.value(change.new, None)
            return RowResult(self.key(change.new), value)
        if isinstance(change, Update):
            key = self.key(change.new)
            old_key = self.key(change.old) if change.old is not None else None
            full = change.old if change.old_kind == "O" else None
            value, missing = self.value(change.new, full)
            changed = old_key if old_key is not None and old_key != key else None
            before = None if full is None else self.value(full, None)[0]
            return RowResult(key, value, changed, ",".join(missing), before)
        if isinstance(change, Delete):
            before = self.value(change.old, None)[0] if change.old_kind == "O" else None
            return RowResult(self.key(change.old), None, before=before)
        raise InvariantViolation(f"not a row change: {type(change).__name__}")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


NAME = PgType(Kind.STRING)
