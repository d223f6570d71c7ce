"""Decoding many pgoutput row changes of one relation at once, column by column.

Python pays a few microseconds per value; a busy slot yields hundreds of thousands of changes a
second. So the changes of one relation in a decoded stretch are joined into one buffer and
walked *column by column across all rows* with numpy (each column's kind byte, length and
bytes at once), each column becomes an Arrow string array, and Arrow compute turns it into JSON
text and joins the columns into the row objects — the same text the per-value mapping of
:mod:`sluiceway.cdc.values` makes (a property test holds the two together).

Rows the column walk does not cover go through the per-value path instead: rows with an
unchanged TOASTed value, and values that need escaping or an array's parsing. A relation
without a primary key (its key is the whole row) goes that way entirely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluiceway.cdc.values import Kind, PgType, to_json

_T, _N, _U = ord("t"), ord("n"), ord("u")
_K, _O, _NEW = ord("K"), ord("O"), ord("N")
_I, _U_MSG, _D = ord("I"), ord("U"), ord("D")

#: Characters a JSON string must escape (and what RE2 needs to find them).
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_NOT_NUMBERS = pa.array(["NaN", "Infinity", "-Infinity"])

#: Per-row fallback: (new values, old values or None, old kind) → (key, value, old key, missing).
Scalar = Callable[[int], "RowResult"]


@dataclass(frozen=True, slots=True)
class RowResult:
    key: str | None
    value: bytes | None
    #: The key before an update that changed it (a delete of it precedes the record).
    old_key: str | None = None
    #: Unchanged TOASTed columns left out of ``value`` (no old row to take them from).
    missing: str = ""
    #: The whole old row as a JSON object, where the server sent it (``REPLICA IDENTITY FULL``).
    before: bytes | None = None


@dataclass
class Group:
    """Decoded changes of one relation: arrays in the order the rows were given."""

    keys: pa.Array
    values: pa.Array
    old_keys: pa.Array
    #: Row → names of unchanged TOASTed columns left out (rare; from the per-value path).
    missing: dict[int, str] = field(default_factory=dict)
    #: The old rows as JSON objects (null where the server sent none): ``REPLICA IDENTITY FULL``.
    befores: pa.Array | None = None


class _Walk:
    """One tuple's columns across all rows: kind, start and length of each value."""

    def __init__(self, arr: np.ndarray, pos: np.ndarray, ncols: int) -> None:
        counts = (arr[pos].astype(np.int32) << 8) | arr[pos + 1]
        self.ok = bool(np.all(counts == ncols))
        self.kinds: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        pos = pos + 2
        for _ in range(ncols if self.ok else 0):
            kind = arr[pos]
            is_text = kind == _T
            p1 = np.where(is_text, pos + 1, 0)
            length = (
                (arr[p1].astype(np.int64) << 24)
                | (arr[p1 + 1].astype(np.int64) << 16)
                | (arr[p1 + 2].astype(np.int64) << 8)
                | arr[p1 + 3]
            )
            length = np.where(is_text, length, 0)
            self.kinds.append(kind)
            self.starts.append(pos + 5)
            self.lengths.append(length)
            pos = np.where(is_text, pos + 5 + length, pos + 1)
        self.end = pos

    def text(self, arr: np.ndarray, column: int, rows: np.ndarray | None = None) -> pa.Array:
        """Column ``column`` as an Arrow string array (null where SQL NULL or unchanged)."""
        kind, start, length = self.kinds[column], self.starts[column], self.lengths[column]
        if rows is not None:
            kind, start, length = kind[rows], start[rows], length[rows]
        offsets = np.zeros(len(kind) + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        if total:
            gather = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - start, length)
            data = arr[gather].tobytes()
        else:
            data = b""
        valid = kind == _T
        mask = pa.array(~valid) if not valid.all() else None
        return pa.LargeStringArray.from_buffers(
            len(kind),
            pa.py_buffer(offsets.tobytes()),
            pa.py_buffer(data),
            pa.array(valid, pa.bool_()).buffers()[1] if mask is not None else None,
        ).cast(pa.string())


def _quote(col: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise('"', col, '"', "")


def json_column(col: pa.Array, pg: PgType) -> pa.Array:
    """JSON text of every value of a text column (nulls: ``null``), as ``values.to_json`` makes it."""
    kind = pg.kind
    if kind is Kind.NUMBER:
        out = pc.if_else(pc.is_in(col, _NOT_NUMBERS), _quote(col), col)
    elif kind is Kind.BOOL:
        out = pc.if_else(pc.equal(col, "t"), "true", "false")
    elif kind is Kind.JSON:
        out = col
    elif kind is Kind.TIMESTAMP:
        out = _quote(pc.replace_substring(col, " ", "T", max_replacements=1))
    elif kind is Kind.TIMESTAMPTZ:
        xsd = pc.replace_substring(col, " ", "T", max_replacements=1)
        out = _quote(pc.replace_substring_regex(xsd, r"([+-]\d\d)( BC)?$", r"\1:00\2"))
    elif kind is Kind.DATE:
        out = _quote(col)
    elif kind is Kind.STRING:
        out = _quote(col)
        special = pc.fill_null(pc.match_substring_regex(col, _NEEDS_ESCAPE), False)
        if pc.any(special).as_py():
            out = _per_value(col, out, special, pg)
    else:  # arrays: parsed value by value
        out = pa.array([to_json(v, pg) for v in col.to_pylist()], pa.string())
    return pc.fill_null(out, "null")


def _per_value(col: pa.Array, out: pa.Array, rows: pa.Array, pg: PgType) -> pa.Array:
    idx = np.flatnonzero(rows.to_numpy(zero_copy_only=False))
    texts = col.take(pa.array(idx)).to_pylist()
    fixed = pa.array([to_json(t, pg) for t in texts], pa.string())
    return pc.replace_with_mask(out, rows, fixed)


def _key(walk: _Walk, arr: np.ndarray, positions: Sequence[int], types: Sequence[PgType]) -> pa.Array:
    if len(positions) == 1:
        return walk.text(arr, positions[0])
    parts: list[object] = ["["]
    for n, i in enumerate(positions):
        if n:
            parts.append(",")
        parts.append(json_column(walk.text(arr, i), types[i]))
    parts.append("]")
    joined = pc.binary_join_element_wise(*parts, "")
    # A key column that is not in an old key tuple makes no key (as the per-value path).
    present = None
    for i in positions:
        here = pa.array(walk.kinds[i] == _T)
        present = here if present is None else pc.and_(present, here)
    return pc.if_else(present, joined, pa.scalar(None, pa.string()))


def decode_group(
    datas: Sequence[bytes],
    names: Sequence[str],
    types: Sequence[PgType],
    key_positions: Sequence[int] | None,
    scalar: Scalar,
) -> Group:
    """Key, value and old key of each change (``I``/``U``/``D`` messages of one relation version)."""
    n = len(datas)
    if key_positions is None or n == 0:
        return _scalar_group(n, scalar)
    sizes = np.fromiter((len(d) for d in datas), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    arr = np.frombuffer(b"".join(datas), dtype=np.uint8)
    kinds = arr[starts]
    flag = arr[starts + 5]
    ncols = len(names)
    has_old = (kinds == _D) | ((kinds == _U_MSG) & ((flag == _K) | (flag == _O)))
    # Old tuples (deletes, and updates that carry one) start after the K/O byte.
    old_rows = np.flatnonzero(has_old)
    old = _Walk(arr, starts[old_rows] + 6, ncols) if len(old_rows) else None
    new_pos = starts + 6  # I and U without an old tuple: 'N' right after the relation id
    if old is not None:
        if not old.ok:
            return _scalar_group(n, scalar)
        new_pos[old_rows] = old.end + 1  # skip the 'N' after the old tuple
    new_rows = np.flatnonzero(kinds != _D)
    new = _Walk(arr, new_pos[new_rows], ncols) if len(new_rows) else None
    if new is not None and not new.ok:
        return _scalar_group(n, scalar)

    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    index: list[np.ndarray] = []
    old_keys_all = pa.nulls(n, pa.string())
    fallback: set[int] = set()
    befores = None
    if new is not None:
        unchanged = np.zeros(len(new_rows), dtype=bool)
        for kind in new.kinds:
            unchanged |= kind == _U
        fallback.update(int(r) for r in new_rows[unchanged])
        values.append(_objects(new, arr, names, types))
        keys.append(_key(new, arr, key_positions, types))
        index.append(new_rows)
    if old is not None:
        full = flag[old_rows] == _O  # the whole old row (REPLICA IDENTITY FULL), not only its key
        if full.any():
            whole = _objects(old, arr, names, types).filter(pa.array(full))
            mask = np.zeros(n, dtype=bool)
            mask[old_rows[full]] = True
            befores = pc.replace_with_mask(pa.nulls(n, pa.binary()), pa.array(mask), whole)
        old_key = _key(old, arr, key_positions, types)
        deletes = kinds[old_rows] == _D
        del_rows = old_rows[deletes]
        if len(del_rows):
            keys.append(old_key.filter(pa.array(deletes)))
            values.append(pa.nulls(len(del_rows), pa.binary()))
            index.append(del_rows)
        # An update's old key (K/O tuple) matters where it differs from the new key.
        upd = ~deletes
        if upd.any():
            placed = pa.nulls(n, pa.string())
            mask = np.zeros(n, dtype=bool)
            mask[old_rows[upd]] = True
            old_keys_all = pc.replace_with_mask(placed, pa.array(mask), old_key.filter(pa.array(upd)))
    order = np.concatenate(index)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    key_arr = pa.concat_arrays([k.cast(pa.string()) for k in keys]).take(pa.array(inverse))
    value_arr = pa.concat_arrays(values).take(pa.array(inverse))
    if old is not None:
        differs = pc.fill_null(pc.not_equal(old_keys_all, key_arr), False)
        old_keys_all = pc.if_else(differs, old_keys_all, pa.scalar(None, pa.string()))
    group = Group(key_arr, value_arr, old_keys_all, befores=befores)
    return _patch(group, sorted(fallback), scalar) if fallback else group


def _objects(walk: _Walk, arr: np.ndarray, names: Sequence[str], types: Sequence[PgType]) -> pa.Array:
    """Each row of ``walk`` as a JSON object of every column (``binary``)."""
    parts: list[object] = ["{"]
    for i, name in enumerate(names):
        parts.append(("," if i else "") + to_json(name, _NAME) + ":")
        parts.append(json_column(walk.text(arr, i), types[i]))
    parts.append("}")
    return pc.binary_join_element_wise(*parts, "").cast(pa.binary())


def _scalar_group(n: int, scalar: Scalar) -> Group:
    results = [scalar(i) for i in range(n)]
    befores = [r.before for r in results]
    return Group(
        pa.array([r.key for r in results], pa.string()),
        pa.array([r.value for r in results], pa.binary()),
        pa.array([r.old_key for r in results], pa.string()),
        {i: r.missing for i, r in enumerate(results) if r.missing},
        pa.array(befores, pa.binary()) if any(b is not None for b in befores) else None,
    )


def _patch(group: Group, rows: list[int], scalar: Scalar) -> Group:
    results = [scalar(i) for i in rows]
    mask = np.zeros(len(group.keys), dtype=bool)
    mask[rows] = True
    where = pa.array(mask)
    befores = group.befores
    if befores is not None or any(r.before is not None for r in results):
        base = befores if befores is not None else pa.nulls(len(group.keys), pa.binary())
        befores = pc.replace_with_mask(base, where, pa.array([r.before for r in results], pa.binary()))
    return Group(
        pc.replace_with_mask(group.keys, where, pa.array([r.key for r in results], pa.string())),
        pc.replace_with_mask(group.values, where, pa.array([r.value for r in results], pa.binary())),
        pc.replace_with_mask(group.old_keys, where, pa.array([r.old_key for r in results], pa.string())),
        {i: r.missing for i, r in zip(rows, results, strict=True) if r.missing},
        befores,
    )


_NAME = PgType(Kind.STRING)
