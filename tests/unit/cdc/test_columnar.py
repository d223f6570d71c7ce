"""The column-wise decoder makes exactly what the value-by-value reference makes, for random
relations, values and change kinds (inserts, updates with and without old rows, unchanged
TOASTed values, deletes)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.cdc.columnar import decode_group
from sluiceway.cdc.model import TableInfo
from sluiceway.cdc.pgoutput import UNCHANGED, Relation, decode
from sluiceway.cdc.relation import RelationDecoder
from sluiceway.cdc.values import Kind, PgType, resolve
from tests.support import pgoutput as pg

# (type oid, strategy of text forms) — what pgoutput sends for each kind of column.
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
COLUMNS: dict[int, st.SearchStrategy[str]] = {
    23: st.integers(-(2**31), 2**31 - 1).map(str),
    701: st.one_of(
        st.sampled_from(["NaN", "Infinity", "-Infinity"]),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
    ),
    1700: st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
    16: st.sampled_from(["t", "f"]),
    3802: st.sampled_from(['{"a": 1}', "[1, 2]", '"x"', "null", '{"b": {"c": [true, null]}}']),
    1114: st.datetimes().map(lambda d: d.isoformat(sep=" ")),
    1184: st.sampled_from(
        ["2024-05-01 10:00:00+00", "2024-05-01 10:00:00.5+05:30", "infinity", "0044-03-15 00:00:00+00 BC"]
    ),
    1082: st.dates().map(str),
    25: TEXT,
    1007: st.lists(st.one_of(st.integers(-99, 99).map(str), st.just("NULL")), max_size=4).map(
        lambda v: "{" + ",".join(v) + "}"
    ),
    1009: st.lists(TEXT.filter(lambda t: '"' not in t and "\\" not in t), max_size=3).map(
        lambda v: "{" + ",".join('"' + t + '"' for t in v) + "}"
    ),
}


@st.composite
def relations(draw: Any) -> tuple[Relation, TableInfo, list[int]]:
    oids = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=6))
    key_count = draw(st.integers(1, min(2, len(oids))))
    key_oids = [23, 25]
    columns = [(f"k{i}", key_oids[i % 2], True) for i in range(key_count)]
    columns += [(f'c{i}\u00e9"', oid, False) for i, oid in enumerate(oids)]
    rel = decode(pg.relation(9, "public", "t", columns))
    assert isinstance(rel, Relation)
    return rel, TableInfo(tuple(c[0] for c in columns[:key_count])), [c[1] for c in columns]


def row_values(
    draw: Any, oids: list[int], keys: int, nullable: bool = True, toast: bool = False
) -> list[object]:
    out: list[object] = []
    for i, oid in enumerate(oids):
        if i < keys:
            out.append(draw(COLUMNS[oid].filter(bool)) if oid == 25 else draw(COLUMNS[oid]))
            continue
        choice = draw(st.integers(0, 9))
        if nullable and choice == 0:
            out.append(None)
        elif toast and choice == 1:
            out.append(UNCHANGED)
        else:
            out.append(draw(COLUMNS[oid]))
    return out


@st.composite
def changes(draw: Any) -> tuple[Relation, TableInfo, list[bytes]]:
    rel, info, oids = draw(relations())
    keys = len(info.key_columns or ())
    messages = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["I", "U", "UK", "UO", "D", "DO"]))
        new = row_values(draw, oids, keys, toast=kind.startswith("U"))
        if kind == "I":
            messages.append(
                pg.insert(
                    9, [v for v in new if v is not UNCHANGED] and [None if v is UNCHANGED else v for v in new]
                )
            )
        elif kind == "U":
            messages.append(pg.update(9, new))
        elif kind == "UK":
            old = row_values(draw, oids, keys)
            messages.append(
                pg.update(9, new, old=[v if i < keys else None for i, v in enumerate(old)], kind="K")
            )
        elif kind == "UO":
            messages.append(pg.update(9, new, old=row_values(draw, oids, keys), kind="O"))
        elif kind == "D":
            old = row_values(draw, oids, keys)
            messages.append(pg.delete(9, [v if i < keys else None for i, v in enumerate(old)], kind="K"))
        else:
            messages.append(pg.delete(9, row_values(draw, oids, keys), kind="O"))
    return rel, info, messages


@settings(max_examples=300, deadline=None)
@given(changes())
def test_column_wise_decoding_equals_the_value_by_value_reference(
    case: tuple[Relation, TableInfo, list[bytes]],
) -> None:
    rel, info, messages = case
    mapping: dict[int, PgType] = {c.type_oid: resolve(c.type_oid, {}) for c in rel.columns}
    mapping[1007] = PgType(Kind.ARRAY, PgType(Kind.NUMBER))
    mapping[1009] = PgType(Kind.ARRAY, PgType(Kind.STRING))
    table = RelationDecoder(rel, info, mapping)
    expected = [table.decode_one(m) for m in messages]
    # The reference runs only as a fallback: count how often to be sure the column path is tested.
    fallbacks: list[int] = []

    def reference(i: int) -> Any:
        fallbacks.append(i)
        return table.decode_one(messages[i])

    group = decode_group(messages, table.names, table.types, table.key_pos, reference)
    assert group.keys.to_pylist() == [r.key for r in expected]
    assert group.values.to_pylist() == [r.value for r in expected]
    assert group.old_keys.to_pylist() == [r.old_key for r in expected]
    assert group.missing == {i: r.missing for i, r in enumerate(expected) if r.missing}
    befores = group.befores.to_pylist() if group.befores is not None else [None] * len(messages)
    assert befores == [r.before for r in expected]  # the old row, where it was sent whole
    toasted = {i for i, m in enumerate(messages) if m[:1] == b"U" and b"u" in m}  # an upper bound
    assert set(fallbacks) <= toasted
