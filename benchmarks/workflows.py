"""The workflows the benchmark runs (`--app shardq.benchmarks.workflows:registry`).

The suite's own, so that what it measures does not move when the examples in
shardq.bin.examples (the demo's, the tests') change, and so that nothing in the
product imports the benchmarks or the benchmarks import a tool of the product:

- `noop`: a plain job, one no-op step (claim, durable floor, parked drains);
- `steps3`: three no-op steps (steps3);
- `park`: park on signal "go", complete with its payload (cycle; half the
  parked runs);
- `wake_probe`: park on "go", then record when the code resumed and a step ran
  (wake);
- `nap`: park on a 90-day timer (the other half of the parked runs).

`park` and `nap` runs are also written straight into the tables by the parked
fixture (parked.py); tests/test_benchmarks.py checks those rows equal what the
engine writes when it runs these functions.
"""

from __future__ import annotations

import time
from typing import Any

from shardq.queue.context import WorkflowContext
from shardq.queue.registry import Registry

registry = Registry()

NAP_SECONDS = 90 * 24 * 3600
WAKE_SIGNAL = "go"


def _nothing() -> None:
    return None


@registry.workflow("noop")
def noop(ctx: WorkflowContext) -> None:
    """One step that does nothing: the cheapest durable job."""
    ctx.step("run", _nothing)


@registry.workflow("steps3")
def steps3(ctx: WorkflowContext) -> int:
    """Three no-op steps, each its own recorded result."""
    for name in ("a", "b", "c"):
        ctx.step(name, _nothing)
    return 3


@registry.workflow("park")
def park(ctx: WorkflowContext) -> Any:
    """Start, park on a signal, resume, complete: one durable cycle."""
    return ctx.wait_for_signal(WAKE_SIGNAL)


@registry.workflow("wake_probe")
def wake_probe(ctx: WorkflowContext) -> dict[str, Any]:
    """Park on "go"; once woken, record the wall time the code resumed and a step ran.

    `resumed_at` is read in the workflow body on the turn that consumed the signal
    (after the wake-up, the claim and the replay); `step_at` comes from a step,
    which runs after the consumed signal has been checkpointed. Both are computed
    once: the turn that reads them is the one that completes the run.
    """
    ctx.wait_for_signal(WAKE_SIGNAL)
    resumed_at = time.time()
    step_at = ctx.step("woke", time.time)
    return {"resumed_at": resumed_at, "step_at": step_at}


@registry.workflow("nap")
def nap(ctx: WorkflowContext) -> None:
    """A run parked on a far-future timer."""
    ctx.sleep("nap", NAP_SECONDS)
