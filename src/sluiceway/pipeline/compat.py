"""Working around PySpark defects that our sources would otherwise trip over.

Spark Declarative Pipelines (PySpark 4.3): ``spark-pipelines run`` reads the run's events with
``SparkConnectClient.execute_command_as_iterator``, which raises ``UNKNOWN_RESPONSE`` on any
response that is not a dict. Every Python data source makes the server report the workers'
profiler accumulators as observed metrics named ``__python_accumulator__`` (the planner workers
register them whether or not a profiler is on), and those reach that loop when the run ends: the
run completes, then the CLI fails. The client's fetch loop has already applied the accumulator
update by then, so the metrics can be passed over, which is what the patched method does; any
other unexpected response still raises as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("sluiceway.pipeline")

_PATCHED = "_sluiceway_skips_observed_metrics"


def is_connect_session(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def tolerate_observed_metrics_in_commands() -> bool:
    """Let ``execute_command_as_iterator`` pass over observed metrics; True if now in place.

    Idempotent. Does nothing where the client already copes (a method without the defect) or
    where its internals are not the ones this was written against.
    """
    try:
        from pyspark.sql.connect.client.core import PlanObservedMetrics, SparkConnectClient
    except ImportError:  # no Connect client installed: nothing to fix
        return False
    current = SparkConnectClient.execute_command_as_iterator
    if getattr(current, _PATCHED, False):
        return True
    needed = ("_execute_plan_request_with_metadata", "_set_command_in_plan", "_execute_and_fetch_as_iterator")
    if not all(hasattr(SparkConnectClient, name) for name in needed):
        log.debug("Spark Connect client internals differ; leaving execute_command_as_iterator alone")
        return False
    code = getattr(current, "__code__", None)
    if code is None or "UNKNOWN_RESPONSE" not in code.co_consts:
        return False  # this client does not raise on unexpected responses there

    def execute_command_as_iterator(
        self: Any, command: Any, observations: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        from pyspark.errors import PySparkValueError

        req = self._execute_plan_request_with_metadata()
        self._set_command_in_plan(req.plan, command)
        for response in self._execute_and_fetch_as_iterator(req, observations or {}):
            if isinstance(response, dict):
                yield response
            elif not isinstance(response, PlanObservedMetrics):
                raise PySparkValueError(
                    errorClass="UNKNOWN_RESPONSE", messageParameters={"response": str(response)}
                )

    setattr(execute_command_as_iterator, _PATCHED, True)
    execute_command_as_iterator.__doc__ = current.__doc__
    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]
    return True
