"""Versions of one application, for the tests of versioning and `shardq replay`
(tests/integration/test_replay.py, test_patches.py).

`v1` is the code runs are recorded on. Every other registry is v1 with one change:
BREAKING holds changes a recorded history can no longer be replayed against (each a
seeded mistake `shardq replay` must catch), SAFE holds changes that keep every
history valid (a false positive there fails the test). `registry(name)` builds one
by name; the module attributes of the same names are what `--app` points at
(`shardq.tests.versions:v1`).

The workflows of v1:

- `order`: step `charge`, timer `settle`, signal `paid`, step `ship`: completed runs
  and runs parked on `paid` both have histories worth replaying.
- `batch`: steps `item-0`..`item-2` in a loop.
- `family`: a `leaf` child, waited for, then step `after`.
- `leaf`: one step.
- `stamp`: the database clock read (`now`), then a step.
- `bad_patch`: ctx.patched with the change id of its input (hostile ids).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

SETTLE_S = 0.05
Variant = Callable[[Registry], None]


def charged(amount: int) -> dict[str, Any]:
    return {"charged": amount}


def charged_v2(amount: int) -> dict[str, Any]:
    """The step body edited: what a step returns is recorded, so replay never runs it."""
    return {"charged": amount, "currency": "EUR"}


def shipped() -> str:
    return "shipped"


def order_steps(ctx: WorkflowContext, *, charge: Callable[[int], Any] = charged,
                first: str = "charge", then: str = "ship", settle_s: float = SETTLE_S,
                signal: str = "paid") -> Any:
    """v1's order, parts of which the variants change."""
    def call(name: str) -> None:
        if name == "charge":
            ctx.step("charge", charge, ctx.input["amount"])
        else:
            ctx.step(name, shipped)

    call(first)
    ctx.sleep("settle", settle_s)
    paid = ctx.wait_for_signal(signal)
    call(then)
    return {"paid": paid}


def _order(**changes: Any) -> Callable[[WorkflowContext], Any]:
    return lambda ctx: order_steps(ctx, **changes)


def _batch(count: int) -> Callable[[WorkflowContext], Any]:
    def batch(ctx: WorkflowContext) -> Any:
        return [ctx.step(f"item-{i}", shipped) for i in range(count)]
    return batch


def _family(child: str) -> Callable[[WorkflowContext], Any]:
    def family(ctx: WorkflowContext) -> Any:
        out = ctx.wait_child(ctx.start_child(child, f"{ctx.workflow_id}.leaf"))
        return [out, ctx.step("after", shipped)]
    return family


def leaf(ctx: WorkflowContext) -> Any:
    return ctx.step("leaf", shipped)


def stamp(ctx: WorkflowContext) -> Any:
    ctx.now()
    return ctx.step("stamped", shipped)


def bad_patch(ctx: WorkflowContext) -> Any:
    """ctx.patched with the change id its input gives (hostile ids fail the run)."""
    return ctx.patched(ctx.input["id"])


def build(**overrides: Callable[[WorkflowContext], Any] | None) -> Registry:
    """v1's registry with some workflows replaced (None: left out)."""
    functions: dict[str, Callable[[WorkflowContext], Any] | None] = {
        "order": _order(), "batch": _batch(3), "family": _family("leaf"), "leaf": leaf,
        "leaf2": leaf, "stamp": stamp, "bad_patch": bad_patch, **overrides}
    made = Registry()
    for name, fn in functions.items():
        if fn is not None:
            made.workflow(name)(fn)
    return made


def _validated_first(ctx: WorkflowContext) -> Any:
    ctx.step("validate", shipped)
    return order_steps(ctx)


def _charge_if_express(ctx: WorkflowContext) -> Any:
    if ctx.input.get("express"):
        ctx.step("charge", charged, ctx.input["amount"])
    ctx.sleep("settle", SETTLE_S)
    paid = ctx.wait_for_signal("paid")
    ctx.step("ship", shipped)
    return {"paid": paid}


def _without_wait(ctx: WorkflowContext) -> Any:
    ctx.step("charge", charged, ctx.input["amount"])
    ctx.sleep("settle", SETTLE_S)
    ctx.step("ship", shipped)
    return {"paid": None}


def _timer_as_signal(ctx: WorkflowContext) -> Any:
    ctx.step("charge", charged, ctx.input["amount"])
    ctx.wait_for_signal("settled")
    paid = ctx.wait_for_signal("paid")
    ctx.step("ship", shipped)
    return {"paid": paid}


def _clock_first(ctx: WorkflowContext) -> Any:
    ctx.now()
    return order_steps(ctx)


def _raises(ctx: WorkflowContext) -> Any:
    currency = ctx.input["currency"]  # a KeyError for every run started without one
    return [currency, order_steps(ctx)]


def _without_charge(ctx: WorkflowContext) -> Any:
    ctx.sleep("settle", SETTLE_S)
    paid = ctx.wait_for_signal("paid")
    ctx.step("ship", shipped)
    return {"paid": paid}


def _patched(ctx: WorkflowContext) -> Any:
    """A verification added where old runs may be parked past it: behind a patch."""
    ctx.step("charge", charged, ctx.input["amount"])
    ctx.sleep("settle", SETTLE_S)
    if ctx.patched("verify"):
        ctx.step("verify", shipped)
    paid = ctx.wait_for_signal("paid")
    ctx.step("ship", shipped)
    return {"paid": paid}


def _deprecated(ctx: WorkflowContext) -> Any:
    """The patch retired: every run of the old branch is gone."""
    ctx.step("charge", charged, ctx.input["amount"])
    ctx.sleep("settle", SETTLE_S)
    ctx.deprecate_patch("verify")
    ctx.step("verify", shipped)
    paid = ctx.wait_for_signal("paid")
    ctx.step("ship", shipped)
    return {"paid": paid}


def _patched_at_end(ctx: WorkflowContext) -> Any:
    out = order_steps(ctx)
    if ctx.patched("receipt"):
        ctx.step("receipt", shipped)
    return out


BREAKING: dict[str, Callable[[], Registry]] = {
    "steps_reordered": lambda: build(order=_order(first="ship", then="charge")),
    "step_removed": lambda: build(order=_without_charge),
    "step_added_first": lambda: build(order=_validated_first),
    "step_renamed": lambda: build(order=_order(then="dispatch")),
    "step_made_conditional": lambda: build(order=_charge_if_express),
    "wait_removed": lambda: build(order=_without_wait),
    "signal_renamed": lambda: build(order=_order(signal="payment")),
    "timer_changed": lambda: build(order=_order(settle_s=3600)),
    "timer_became_signal": lambda: build(order=_timer_as_signal),
    "clock_read_added": lambda: build(order=_clock_first),
    "loop_shortened": lambda: build(batch=_batch(2)),
    "loop_lengthened": lambda: build(batch=_batch(4)),
    "child_workflow_changed": lambda: build(family=_family("leaf2")),
    "workflow_removed": lambda: build(stamp=None),
    "code_now_raises": lambda: build(order=_raises),
}
"""Each breaks the replay of some recorded run of v1 (the test says which)."""

SAFE: dict[str, Callable[[], Registry]] = {
    "unchanged": build,
    "step_body_edited": lambda: build(order=_order(charge=charged_v2)),
    "patch_added": lambda: build(order=_patched),
    "patch_added_at_the_end": lambda: build(order=_patched_at_end),
    "workflow_added": lambda: build(extra=leaf),
}
"""Each keeps every history of v1 valid."""

v1 = build()
patched = build(order=_patched)
deprecated = build(order=_deprecated)
steps_reordered = BREAKING["steps_reordered"]()
