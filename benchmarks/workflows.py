"""The workflows the benchmark runs (`--app shardq.benchmarks.workflows:registry`).

`noop`, `steps3` and `park` are the example workflows of shardq.bin.examples,
registered again here so one worker fleet serves every scenario. `wake_probe`
records when the workflow resumed after its signal; `nap` is the 90-day timer
the parked-runs scenario writes straight into the tables.
"""

from __future__ import annotations

import time
from typing import Any

from shardq.bin import examples
from shardq.queue.context import WorkflowContext
from shardq.queue.registry import Registry

registry = Registry()
registry.register(examples.noop_job, name="noop")
registry.register(examples.three_steps, name="steps3")
registry.register(examples.park_on_signal, name="park")

NAP_SECONDS = 90 * 24 * 3600


@registry.workflow("wake_probe")
def wake_probe(ctx: WorkflowContext) -> dict[str, Any]:
    """Park on "go"; once woken, record the wall time the code resumed and a step ran.

    `resumed_at` is read in the workflow body on the turn that consumed the signal
    (after the wake-up, the claim and the replay); `step_at` comes from a step,
    which runs after the consumed signal has been checkpointed. Both are computed
    once: the turn that reads them is the one that completes the run.
    """
    ctx.wait_for_signal("go")
    resumed_at = time.time()
    step_at = ctx.step("woke", time.time)
    return {"resumed_at": resumed_at, "step_at": step_at}


@registry.workflow("nap")
def nap(ctx: WorkflowContext) -> None:
    """A run parked on a far-future timer."""
    ctx.sleep("nap", NAP_SECONDS)
