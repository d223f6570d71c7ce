"""A failed query's text becomes one line: what failed and the first line of the cause."""

from __future__ import annotations

from sluiceway.pipeline.runner import first_line, summarize

EXCEPTION = "pyspark.errors.exceptions.captured.IllegalArgumentException: Total size of serialized results"
PROXY = f"""An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/x/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
{EXCEPTION}
\tat org.apache.spark.Something(Something.scala:1)"""


def test_our_own_sink_failure_wins() -> None:
    text = "Query failed\nsluiceway.pipeline.errors.SinkFailed: sink 'db' failed at offset 7: boom"
    assert summarize(text) == "sink 'db' failed at offset 7: boom"


def test_a_proxy_traceback_becomes_the_exception_it_ends_with() -> None:
    assert summarize(PROXY) == EXCEPTION


def test_plain_text_keeps_its_first_line() -> None:
    assert summarize("\n  query stopped\nmore") == "query stopped"
    assert first_line("CheckViolation: new row violates check\nDETAIL:  Failing row contains (…)") == (
        "CheckViolation: new row violates check"
    )
    assert first_line(None) == ""
