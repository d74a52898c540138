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
- `nap`: park on a 90-day timer (the other half of the parked runs);
- `relay_sink`, `relay_source`, `relay_probe`: signals between runs with
  `ctx.signal_external`, on one shard or through the outbox relay (relay);
- `fanout_source`: one run signalling many, in one call or one call each (relay);
- `claim_probe`: record when its first step ran, i.e. soon after it was claimed
  (limits: time to claim by priority);
- `noop_keyed`: `noop` under a concurrency limit of 1 per key `k:<input k>`
  (limits: a limited drain beside `noop`'s, and limit_violations);
- `fanin_parent`, `tree_node`: children started and waited for, a tree of them
  (children: fanin_10k_s, cancel_tree_s);
- `rated`: one step under the rate limiter `bench` (RATE_PER_S a second),
  returning when it started (limits: rate_limit_error).

`park` and `nap` runs are also written straight into the tables by the parked
fixture (parked.py); tests/acceptance/test_benchmarks.py checks those rows equal what the
engine writes when it runs these functions.
"""

from __future__ import annotations

import os
import time
from typing import Any

from shardq.core.children import ChildRequest
from shardq.core.models import SignalRequest
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

registry = Registry()

TRACING_ENV = "SHARDQ_BENCH_OTEL"
"""Set to `memory` (the upgrades scenario's traced fleet): this process's spans go to
the OpenTelemetry SDK's in-memory exporter, through a batch processor."""
if os.environ.get(TRACING_ENV) == "memory":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(_provider)

NAP_SECONDS = 90 * 24 * 3600
WAKE_SIGNAL = "go"


def _nothing() -> None:
    return None


@registry.workflow("noop")
def noop(ctx: WorkflowContext) -> None:
    """One step that does nothing: the cheapest durable job."""
    ctx.step("run", _nothing)


KEYED_LIMIT = 1
"""The concurrency limit of every key of `noop_keyed`."""


def key_of(value: Any) -> tuple[str, int]:
    """`noop_keyed`'s concurrency: key `k:<k>` of its input, limit KEYED_LIMIT."""
    return f"k:{value['k']}", KEYED_LIMIT


@registry.workflow("noop_keyed", concurrency=key_of)
def noop_keyed(ctx: WorkflowContext) -> None:
    """`noop` with at most KEYED_LIMIT runs of its key at once."""
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


@registry.workflow("relay_sink")
def relay_sink(ctx: WorkflowContext) -> Any:
    """Park until one signal "msg" arrives; complete with it."""
    return ctx.wait_for_signal("msg")


@registry.workflow("relay_source")
def relay_source(ctx: WorkflowContext) -> int:
    """Send one signal "msg" to each of `targets`, each call durable before the next."""
    for target in ctx.input["targets"]:
        ctx.signal_external(target, "msg", {"from": ctx.workflow_id})
    return len(ctx.input["targets"])


@registry.workflow("fanout_source")
def fanout_source(ctx: WorkflowContext) -> int:
    """Send "msg" to every one of `targets`: in one `signal_external_many` call when
    `batch`, else one `signal_external` call (and commit) per target."""
    targets = ctx.input["targets"]
    if ctx.input["batch"]:
        ctx.signal_external_many([SignalRequest(t, "msg", {"from": ctx.workflow_id})
                                  for t in targets])
    else:
        for target in targets:
            ctx.signal_external(target, "msg", {"from": ctx.workflow_id})
    return len(targets)


@registry.workflow("relay_probe")
def relay_probe(ctx: WorkflowContext) -> dict[str, float]:
    """Signal a `wake_probe` run; record the wall time just before the call.

    One turn: signal_external commits but does not park, so the time is read once.
    """
    sent_at = time.time()
    ctx.signal_external(ctx.input["target"], WAKE_SIGNAL)
    return {"sent_at": sent_at}


RATE_LIMITER = "bench"
RATE_PER_S = 200
"""The rate of limiter `bench`: steps a second across every worker and shard, burst 1.
Well under what the fleet drains (thousands of one-step runs a second; a limited
run costs two turns, its parking and its step), so the limiter and not the
fleet sets the pace, and its 5 ms slots stay far above the clock's resolution."""

registry.rate_limiter(RATE_LIMITER, RATE_PER_S, per=1.0)


@registry.workflow("rated")
def rated(ctx: WorkflowContext) -> float:
    """One step under limiter `bench`; the wall time the step started is its output."""
    return ctx.step("call", time.time, rate_limit=RATE_LIMITER)


@registry.workflow("claim_probe")
def claim_probe(ctx: WorkflowContext) -> dict[str, float]:
    """Record the wall time its first step ran: its first turn, right after the claim."""
    return {"claimed_at": ctx.step("claimed", time.time)}


@registry.workflow("fanin_parent", max_history=20_000)
def fanin_parent(ctx: WorkflowContext) -> int:
    """Start `noop` children in one call, ids `ids` (or `<prefix><i>` for i < `n`), and
    wait for them all."""
    ids = ctx.input.get("ids") or [f"{ctx.input['prefix']}{i}" for i in range(ctx.input["n"])]
    handles = ctx.start_children([ChildRequest("noop", i) for i in ids])
    return sum(1 for o in ctx.wait_children(handles) if o is not None and o.ok)


@registry.workflow("tree_node")
def tree_node(ctx: WorkflowContext) -> Any:
    """A level of a tree: `widths[0]` children with the rest of `widths`; a leaf parks
    until a signal it never gets (the tree is cancelled from its root)."""
    widths = ctx.input["widths"]
    if not widths:
        return ctx.wait_for_signal("never")
    handles = ctx.start_children([
        ChildRequest("tree_node", f"{ctx.workflow_id}.{i}", {"widths": widths[1:]})
        for i in range(widths[0])])
    return len(ctx.wait_children(handles))
