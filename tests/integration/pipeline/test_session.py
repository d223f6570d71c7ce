"""The local session's driver JVM gets the spec's own JVM options beside sluiceway's log settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(180)


def test_a_specs_driver_java_options_reach_the_jvm_with_the_quiet_log_settings() -> None:
    script = textwrap.dedent(
        """
        from sluiceway.pipeline.session import build_session
        s = build_session("local[1]", conf={"spark.driver.extraJavaOptions": "-Dsluice.probe=yes"})
        system = s.sparkContext._jvm.java.lang.System
        print(system.getProperty("sluice.probe"), system.getProperty("log4j.configurationFile"))
        s.stop()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=150, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe, log4j = done.stdout.split()[-2:]
    assert probe == "yes"  # once dropped: the log settings went in as --driver-java-options
    assert log4j.endswith("log4j2-quiet.properties")
