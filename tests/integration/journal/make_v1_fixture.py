"""Writes ``v1_journal/``: a journal directory in the format-1 layout (BEGIN | RECORD… | COMMIT).

It must run with the code of a version that wrote format 1 — the fixture was made with commit
d6e653e (main before format 2)::

    git archive d6e653e src | tar -x -C /tmp/v1
    PYTHONPATH=/tmp/v1/src .venv/bin/python tests/integration/journal/make_v1_fixture.py

Deterministic (injected clock, explicit timestamps), so running it again gives the same bytes.
Besides the journal it writes ``expected.json``: every record as that version read it back,
and its head, registers and segments, for ``test_compat.py`` to compare with.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from itertools import count

from sluiceway.journal import Journal

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "v1_journal")


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    ticks = count(1_700_000_000_000_000, 1000)
    with Journal.open(OUT, segment_bytes=4096, clock=lambda: next(ticks)) as j:
        with j.append(set_registers={"epoch": "1"}) as tx:
            tx.write("user-1", b'{"name": "Ada"}', headers=[("source", "signup")], namespace="users")
            tx.write("user-2", "Grace", namespace="users", timestamp=1_700_000_000_000_001)
        with j.append() as tx:
            tx.write("user-1", None, namespace="users")  # a tombstone
        for n in range(6):  # one-record appends (format 1's one-step single-record encoder)
            with j.append() as tx:
                tx.write(f"k{n % 3}", f"v{n}".encode(), namespace="" if n % 2 else "ns")
        with j.append() as tx:  # write_many's vectorised encoder (32 records or more)
            tx.write_many([(f"bulk-{i % 5}", None if i % 9 == 0 else bytes([i]) * i) for i in range(40)])
        with j.append(set_registers={"epoch": "2", "leader": "a"}):
            pass  # an append with register updates only
        for n in range(8):
            with j.append() as tx:
                tx.write(f"k{n % 3}", b"x" * 400, headers=[("n", str(n)), ("é", "ü")], namespace="ns")
        j.commit_offset("billing", 30)
        j.compact()  # rewrites closed segments: BEGIN/COMMIT flagged COMPACTED, offset gaps
        with j.append() as tx:
            tx.write("last", b"in the active segment")
        expected = {
            "head": j.head,
            "registers": j.registers(),
            "segments": [s.base for s in j.segments()],
            "consumers": j.consumers(),
            "records": [
                {
                    "offset": r.offset,
                    "namespace": r.namespace,
                    "key": r.key,
                    "value": None if r.value is None else base64.b64encode(r.value).decode(),
                    "headers": r.headers,
                    "timestamp_us": r.timestamp_us,
                }
                for r in j.read()
            ],
        }
    os.unlink(os.path.join(OUT, "LOCK"))
    with open(os.path.join(HERE, "v1_expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
