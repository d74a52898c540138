"""Two builds of one application, for the tests of build pinning
(tests/acceptance/test_builds_deploy.py, tests/integration/test_builds.py).

`order` takes a step, waits for signal `paid`, takes another, and returns the build
that ran each step: [reserve's, ship's]. v2 adds a step `check` before `reserve`
behind `ctx.patched`, so a run started on v1 replays on v2 (a move of v1's runs to v2
is safe), while a run started on v2 does not replay on v1 (its history holds the
patch marker where v1 takes `reserve`): run on the wrong build, it fails.
`--app` points at `shardq.tests.builds:v1` or `:v2`.
"""

from __future__ import annotations

from typing import Any

from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

v1 = Registry()
v2 = Registry()


@v1.workflow("order")
def order_v1(ctx: WorkflowContext) -> Any:
    reserved = ctx.step("reserve", lambda: "v1")
    ctx.wait_for_signal("paid")
    return [reserved, ctx.step("ship", lambda: "v1")]


@v2.workflow("order")
def order_v2(ctx: WorkflowContext) -> Any:
    if ctx.patched("check"):
        ctx.step("check", lambda: "v2")
    reserved = ctx.step("reserve", lambda: "v2")
    ctx.wait_for_signal("paid")
    return [reserved, ctx.step("ship", lambda: "v2")]


def counter(ctx: WorkflowContext) -> Any:
    """A loop that continues as new: each generation waits for `next`, `left` more to go."""
    ctx.wait_for_signal("next")
    left = int(ctx.input["left"])
    if left > 0:
        ctx.continue_as_new({"left": left - 1})
    return "done"


v1.workflow("counter")(counter)
v2.workflow("counter")(counter)
