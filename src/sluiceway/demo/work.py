"""The demo's transform and feed processor (importable by Spark workers and feed workers)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from sluiceway.pipeline.record import Record

VAT = 0.2


def enrich(record: Record) -> Record:
    """record → record: add the total with VAT and tag the record (a per-record transform)."""
    body = json.loads(record.value or b"{}")
    body["total_with_vat_cents"] = round(body.get("total_cents", 0) * (1 + VAT))
    return record.replace(value=json.dumps(body).encode(), headers=[*record.headers, ("enriched", "1")])


class Fulfilment:
    """Feed processor: gate 0 charges each paid order (fan-out, in parallel); gate 1 ships them,
    and starts only once every charge of that customer is complete (fan-in).

    It records when each step ran, so the demo can check the gates held.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: (partition, gate) -> [(started, finished)]
        self.spans: dict[tuple[str, int], list[tuple[float, float]]] = {}

    def __call__(self, item: Any) -> dict[str, Any]:
        started = time.monotonic()
        order = json.loads(item.data or b"{}")
        if item.gate == 0:
            order["charged"] = True
            result: dict[str, Any] = {"gate": 1, "done": False, "data": json.dumps(order).encode()}
        else:
            order["shipped"] = True
            result = {"done": True, "data": json.dumps(order).encode()}
        with self.lock:
            self.spans.setdefault((item.partition, item.gate), []).append((started, time.monotonic()))
        return result

    def gate_violations(self) -> list[str]:
        """Partitions where a gate-1 step started before every gate-0 step had finished."""
        bad = []
        with self.lock:
            for (partition, gate), spans in self.spans.items():
                if gate != 1:
                    continue
                first_ship = min(s for s, _ in spans)
                last_charge = max((f for _, f in self.spans.get((partition, 0), [])), default=0.0)
                if first_ship < last_charge:
                    bad.append(partition)
        return bad
