"""History read from the operator's own Prometheus (the workspace's ``prometheus: {url: …}``).

Each part's series are PromQL over the ``sluice_*`` series its processes export (docs/operations.md,
"Metrics"), asked with ``/api/v1/query_range``: the range is whatever Prometheus keeps. A part is
found by its label: an outbox by its harvesters' election name (``harvest``), a pipeline and a
capture by name, a feed by its table prefix. A journal exports nothing of its own, so it has no
series here. Prometheus unreachable or refusing a query is a :class:`HistoryError` naming it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from sluiceway.overview.history.figures import Series, sink_series, split_part
from sluiceway.overview.history.store import Chart, HistoryError, Term, bucket_step, chart
from sluiceway.overview.workspace import DEFAULT_ELECTION, Workspace


@dataclass(frozen=True, slots=True)
class Query:
    series: Series
    #: PromQL; ``@`` stands for the part's label matcher (``{@}`` → ``{pipeline="orders"}``).
    expr: str
    #: A label that splits the result into one series each (``sink``: ``lag:<sink>``).
    by: str | None = None

    def asked(self, only: Sequence[str] | None) -> bool:
        """Whether a read of the series ``only`` (``None``: all) needs this query."""
        if only is None:
            return True
        if self.by is None:
            return self.series.name in only
        return any(name.startswith(f"{self.series.name}:") for name in only)


def _rate(metric: str, matcher: str = "@") -> str:
    return f"sum(rate({metric}{{{matcher}}}[1m]))"


def _p99(histogram: str) -> str:
    return f"histogram_quantile(0.99, sum by (le) (rate({histogram}_bucket{{@}}[1m])))"


QUERIES: dict[str, tuple[Query, ...]] = {
    "outbox": (
        Query(Series("published_rate", "published", "records/s"),
              _rate("sluice_harvest_records_total", '@,outcome="published"')),
        Query(Series("backlog_age_seconds", "head row's wait", "s"),
              "max(sluice_harvest_backlog_age_seconds{@})"),
        Query(Series("in_flight", "in flight", "records"), "sum(sluice_harvest_in_flight{@})"),
        Query(Series("latency_p99_seconds", "write to acknowledgement, p99", "s"),
              _p99("sluice_harvest_latency_seconds")),
        Query(Series("dead_letter_rate", "dead-lettered", "records/s"),
              _rate("sluice_harvest_records_total", '@,outcome="dead_lettered"')),
    ),
    "pipeline": (
        Query(Series("lag", "largest sink lag", "records"), "max(sluice_pipeline_lag{@})"),
        Query(Series("rate", "records written (all sinks)", "records/s"),
              _rate("sluice_pipeline_records_total")),
        Query(Series("failed_sinks", "stopped sinks", "sinks"), "sum(sluice_pipeline_sink_stopped{@})"),
        Query(Series("lag", "", ""), "max by (sink) (sluice_pipeline_lag{@})", by="sink"),
        Query(Series("rate", "", ""), "sum by (sink) (rate(sluice_pipeline_records_total{@}[1m]))",
              by="sink"),
    ),
    "feed": (
        Query(Series("complete_rate", "completed", "items/s"),
              _rate("sluice_feed_items_total", '@,outcome="completed"')),
        Query(Series("failed_rate", "failed", "items/s"),
              _rate("sluice_feed_items_total", '@,outcome="failed"')),
        Query(Series("leased", "partitions leased", "partitions"), "sum(sluice_feed_partitions_held{@})"),
    ),
    "capture": (
        Query(Series("publish_rate", "changes published", "changes/s"),
              _rate("sluice_capture_changes_total")),
        Query(Series("lag_bytes", "WAL past the confirmed position", "B"),
              "max(sluice_capture_lag_bytes{@})"),
        Query(Series("ack_p99_seconds", "commit to acknowledgement, p99", "s"),
              _p99("sluice_capture_publish_latency_seconds")),
        Query(Series("skipped", "changes skipped", "changes"), "sum(sluice_capture_skipped_total{@})"),
        Query(Series("dead_lettered", "changes dead-lettered", "changes"),
              "sum(sluice_capture_dead_letters_total{@})"),
    ),
    "journal": (),
}  # fmt: skip


#: Values a PromQL answer can have that are not points on a chart.
_NOT_NUMBERS = ("NaN", "+Inf", "-Inf")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class PrometheusHistory:
    """History from the Prometheus server at ``url``, for the parts of ``workspace``."""

    source = "prometheus"

    def __init__(
        self, url: str, workspace: Workspace, *, timeout: float = 5.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url.rstrip("/")
        self._clock = clock
        self.workspace = workspace
        self._client = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def selector(self, kind: str, name: str) -> str:
        """The label matcher that finds part ``name`` of ``kind`` in Prometheus."""
        if kind == "outbox":
            return f'harvest="{_label(self.workspace.outbox(name).election or DEFAULT_ELECTION)}"'
        if kind == "feed":
            return f'feed="{_label(self.workspace.feed(name).prefix)}"'
        return f'{kind}="{_label(name)}"'

    def read(self, part: str, span: float, *, only: Sequence[str] | None = None) -> Chart:
        kind, name = split_part(part)
        sel = self.selector(kind, name)
        until = float(math.floor(self._clock()))
        since = until - span
        step = bucket_step(span, 5)
        rows: list[tuple[str, float, float]] = []
        for query in QUERIES[kind]:
            if not query.asked(only):
                continue  # not asked for: not asked of Prometheus either (a sparkline asks one)
            for labels, values in self._range(query.expr.replace("@", sel), since, until, step):
                label = labels.get(query.by, "") if query.by else ""
                name_ = f"{query.series.name}:{label}" if query.by else query.series.name
                rows.extend(
                    (name_, float(t), float(v)) for t, v in values if v not in ("NaN", "+Inf", "-Inf")
                )

        def known(kind: str, names: list[str]) -> list[Series]:
            return [q.series for q in QUERIES[kind] if q.by is None] + sink_series(names)

        return chart(part, self.source, since, until, step, rows, only, known)

    def trouble_since(self, part: str) -> float | None:
        return None  # health is the console's judgement: Prometheus has no series of it

    def terms(self, part: str, limit: int = 20) -> list[Term]:
        return []

    def _range(
        self, expr: str, since: float, until: float, step: float
    ) -> list[tuple[dict[str, str], list[tuple[float, str]]]]:
        try:
            response = self._client.get(
                f"{self.url}/api/v1/query_range",
                params={"query": expr, "start": since, "end": until, "step": step},
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise HistoryError(f"prometheus at {self.url}: {exc}") from None
        if body.get("status") != "success":
            raise HistoryError(
                f"prometheus at {self.url} refused {expr!r}: {body.get('error', response.text)}"
            )
        return [(r["metric"], [(t, v) for t, v in r["values"]]) for r in body["data"]["result"]]
