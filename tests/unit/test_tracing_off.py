"""Without opentelemetry-api, tracing is off and costs nothing: every call of
core/tracing.py is a constant, and no trace context is made to be stored."""

from __future__ import annotations

import subprocess
import sys

ABSENT = """
import sys
sys.modules["opentelemetry"] = None  # as if the optional extra were not installed
from shardq.core import tracing
assert tracing.ENABLED is False
with tracing.span("shardq.turn", parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01") as s:
    assert s is None
    assert tracing.current_traceparent() is None
assert tracing.start_span("shardq.commit") is None
tracing.end(None)
import logging
record = logging.LogRecord("x", logging.INFO, "", 0, "m", None, None)
assert tracing.TraceIds().filter(record) and not hasattr(record, "trace_id")
from shardq.bin.web.app import create_app  # the app builds without its middleware
from shardq.worker.turn import run_turn  # the worker's modules import
print("off")
"""


def test_without_the_package_every_tracing_call_is_a_constant() -> None:
    done = subprocess.run([sys.executable, "-c", ABSENT], capture_output=True, text=True,
                          check=False, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "off"), done.stderr


def test_a_malformed_traceparent_is_no_parent() -> None:
    from shardq.core import tracing

    span = "-" + "2" * 16 + "-01"
    for bad in ("", "garbage", "00-xyz-abc-01", "01-" + "1" * 32 + span,
                "00-" + "0" * 32 + span, "00-" + "g" * 32 + span):
        assert tracing._context_of(bad) is None, bad
