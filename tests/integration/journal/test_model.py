"""Random sequences of appends, aborts, failed expectations, crashes, compactions and reads, checked
against a plain in-memory model of what the journal must contain."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sluiceway.journal import AppendAborted, ExpectationFailed, Journal, encode

Rec = tuple[str, str, bytes | None]  # namespace, key, value

# Values are padded so that a handful of appends fills a 4 KiB segment: compaction and
# retention only touch closed segments, so the model needs many of them.
records_st = st.lists(
    st.tuples(
        st.sampled_from(["", "ns"]),
        st.sampled_from(["a", "b", "c"]),
        st.one_of(st.none(), st.binary(max_size=100).map(lambda b: b + bytes(400))),
    ),
    max_size=6,
)


class Boom(Exception):
    pass


class JournalModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="journal-model-")
        self.path = os.path.join(self.dir, "j")
        self.j = Journal.open(self.path, segment_bytes=4096)
        self.records: dict[int, Rec] = {}
        self.head = 0
        self.registers: dict[str, str] = {}
        self.consumers: dict[str, int] = {}

    @initialize(appends=st.lists(records_st, max_size=12))
    def prefill(self, appends: list[list[Rec]]) -> None:
        """Start from a journal of several segments, so maintenance has closed segments to work on."""
        for records in appends:
            self.append(records, "commit", {})

    def teardown(self) -> None:
        self.j.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        records=records_st,
        outcome=st.sampled_from(
            ["commit", "commit", "commit", "abort", "raise", "bad_offset", "bad_register"]
        ),
        set_regs=st.dictionaries(st.sampled_from(["x", "y"]), st.text(max_size=3), max_size=2),
    )
    def append(self, records: list[Rec], outcome: str, set_regs: dict[str, str]) -> None:
        expect_offset = self.head + 1 if outcome == "bad_offset" else self.head
        expect_regs = {"x": "never-this"} if outcome == "bad_register" else {"x": self.registers.get("x")}
        tx = self.j.append(expect_offset=expect_offset, expect_registers=expect_regs, set_registers=set_regs)
        try:
            with tx:
                for ns, key, value in records:
                    tx.write(key, value, namespace=ns, headers=[("n", str(len(key)))])
                if outcome == "abort":
                    tx.abort()
                elif outcome == "raise":
                    raise Boom
        except Boom:
            assert outcome == "raise"
        except ExpectationFailed:
            assert outcome.startswith("bad_")
            return
        if outcome in ("abort", "raise"):
            try:
                _ = tx.offsets
            except AppendAborted:
                return
            raise AssertionError("aborted append reported offsets")
        assert outcome == "commit"
        assert tx.offsets == range(self.head, self.head + len(records))
        for i, rec in enumerate(records):
            self.records[self.head + i] = rec
        self.head += len(records)
        self.registers.update(set_regs)

    @rule(records=records_st.filter(bool), cut=st.floats(min_value=0.0, max_value=0.999))
    def crash_mid_append(self, records: list[Rec], cut: float) -> None:
        """The writer dies while its last append is being written: a prefix of the batch is on disk."""
        encoded = encode.encode_records(
            [k.encode() for _ns, k, _v in records],
            [v for _ns, _k, v in records],
            [ns.encode() for ns, _k, _v in records],
            [b""] * len(records),
            [0] * len(records),
        )
        batch = b"".join(encode.encode_batch(encoded, self.head, 0, {"x": "torn"}))
        seg = self.j.segments()[-1].path
        self.j._release()  # no clean close: exactly what a SIGKILL leaves behind
        with open(seg, "ab") as f:
            f.write(batch[: int(len(batch) * cut)])
        self.j = Journal.open(self.path, segment_bytes=4096)

    @rule()
    def reopen(self) -> None:
        self.j.close()
        self.j = Journal.open(self.path, segment_bytes=4096)

    @rule(name=st.sampled_from(["c1", "c2"]), data=st.data())
    def commit_offset(self, name: str, data: st.DataObject) -> None:
        offset = data.draw(st.integers(min_value=0, max_value=self.head))
        self.j.commit_offset(name, offset)
        self.consumers[name] = offset

    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        if not self.consumers or data.draw(st.booleans()):
            self.commit_offset("c1", data)
        active = self.j.segments()[-1].base
        horizon = min(self.consumers.values())
        result = self.j.compact()
        latest: dict[tuple[str, str], int] = {}
        for off, (ns, key, _v) in sorted(self.records.items()):
            latest[(ns, key)] = off
        doomed = [
            off
            for off, (ns, key, _v) in self.records.items()
            if off < horizon and off < active and latest[(ns, key)] != off
        ]
        for off in doomed:
            del self.records[off]
        assert result.records_removed == len(doomed)

    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        lo = data.draw(st.integers(min_value=0, max_value=self.head + 1))
        hi = data.draw(st.integers(min_value=lo, max_value=self.head + 2))
        want = [(off, *rec) for off, rec in sorted(self.records.items()) if lo <= off < hi]
        got = [(r.offset, r.namespace, r.key, r.value) for r in self.j.read(lo, hi)]
        assert got == want
        rows = [row for rb in self.j.read_arrow(lo, hi, max_rows=7) for row in rb.to_pylist()]
        assert [(r["offset"], r["namespace"], r["key"], r["value"]) for r in rows] == want

    @invariant()
    def matches_model(self) -> None:
        assert self.j.head == self.head
        assert self.j.registers() == self.registers
        assert self.j.consumers() == self.consumers
        with Journal.open(self.path, read_only=True) as reader:
            assert reader.head == self.head
            assert reader.registers() == self.registers
            assert [r.offset for r in reader.read()] == sorted(self.records)


JournalModel.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJournalModel = JournalModel.TestCase
