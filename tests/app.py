"""The tests' own application: the workflows (and the `registry`) tests run in process
and in daemons (`--app shardq.tests.app:registry`).

It began as a copy of the demo's example workflows, whose names it keeps;
it is kept apart so that the demo can change without changing what the tests check,
and what a test relies on is written here (tests/unit/test_own_app.py keeps the other
tests off the demo). Only what tests use is here; a test that needs something else
defines a registry of its own. Changing a workflow here changes what the tests that
start it assert (outputs, step names, schemas, prompts), so change it with them.

- `park`: waits for a "go" signal and returns its payload; the plain parked run.
- `noop`: one step, nothing else; `steps3`: three steps (the chaos load, tests/chaos.py).
- `slow_steps`, `slow_after_signal`: slow steps that write a trace file, for crash tests
  that kill workers mid-step.
- `checkout`: a step, a wait for "payment_captured", a step.
- `cart`: a workflow class with a published contract (input schema, a checked signal,
  queries, a validated update).
- `quorum_approval`: `wait_until` over "approved" signals, with a deadline.
- `proposal_review`: an interrupt (approve, edit, reject) with a schema and a value.
- `expense_approval`, `deletion_plan`, `approval`: builder definitions (gates,
  compensation, an optional gate, an interrupt, a timer).
- `onboarding`, `tenant_cancel`: a run parked on `receive`, and a sender that signals
  runs on any shard (`signal_external`, directly or through the outbox relay).
"""

from __future__ import annotations

import json
import time
from typing import Any

from shardq.core.errors import ExternalSignalFailed
from shardq.core.models import Signal
from shardq.workflow.builder import Run, Workflow
from shardq.workflow.context import WorkflowContext
from shardq.workflow.contracts import SignalSpec, query, update
from shardq.workflow.registry import Registry

registry = Registry()


# -- plain runs: park, noop, steps3 ---------------------------------------------------


def _nothing() -> None:
    return None


@registry.workflow("park")
def park(ctx: WorkflowContext) -> Any:
    """Park on the signal "go"; complete with its payload."""
    return ctx.wait_for_signal("go")


@registry.workflow("tagged", attributes={"region": str, "amount": float})
def tagged(ctx: WorkflowContext) -> Any:
    """Set its search attributes from its input ({"region", "amount"}); park on "go"."""
    ctx.set_attributes(region=ctx.input["region"], amount=ctx.input["amount"])
    return ctx.wait_for_signal("go")


@registry.workflow("noop")
def noop(ctx: WorkflowContext) -> None:
    """One step that does nothing: a plain job."""
    ctx.step("run", _nothing)


@registry.workflow("family")
def family(ctx: WorkflowContext) -> str:
    """Two `noop` children with the input's tag in their ids, waited for: a run the inbox
    shows with its children."""
    tag = ctx.input["tag"]
    ctx.wait_children([ctx.start_child("noop", f"{ctx.workflow_id}.{tag}.{i}")
                       for i in range(2)])
    return "done"


@registry.workflow("steps3")
def steps3(ctx: WorkflowContext) -> int:
    """Steps "a", "b" and "c", each doing nothing; returns 3."""
    for name in ("a", "b", "c"):
        ctx.step(name, _nothing)
    return 3


# -- slow steps for crash tests -------------------------------------------------------


@registry.workflow("slow_steps")
def slow_steps(ctx: WorkflowContext) -> list[int]:
    """Steps "step-0".."step-N" (input `steps`, default 5), each sleeping `seconds`
    (default 0.2) and then appending `<workflow_id> <i>` to the file `trace` if given:
    a test kills workers mid-step and counts from the trace what really ran."""
    seconds = float(ctx.input.get("seconds", 0.2))
    trace = ctx.input.get("trace")
    done = []
    for i in range(int(ctx.input.get("steps", 5))):
        done.append(ctx.step(f"step-{i}", _slow_step, ctx.workflow_id, i, seconds, trace))
    return done


def _slow_step(workflow_id: str, i: int, seconds: float, trace: str | None) -> int:
    time.sleep(seconds)
    if trace:
        with open(trace, "a") as out:
            out.write(f"{workflow_id} {i}\n")
    return i


@registry.workflow("slow_after_signal")
def slow_after_signal(ctx: WorkflowContext) -> Any:
    """Wait for "go", then hand its payload to step "use", which appends
    `<id> start <payload>` to the file `trace`, sleeps `seconds` and appends
    `<id> done <payload>`: a test kills the worker between a signal's consumption and
    the next commit. Both input keys are required."""
    payload = ctx.wait_for_signal("go")
    return ctx.step("use", _use_slowly, ctx.workflow_id, payload,
                    float(ctx.input["seconds"]), ctx.input["trace"])


def _use_slowly(workflow_id: str, payload: Any, seconds: float, trace: str) -> Any:
    with open(trace, "a") as out:
        out.write(f"{workflow_id} start {json.dumps(payload)}\n")
    time.sleep(seconds)
    with open(trace, "a") as out:
        out.write(f"{workflow_id} done {json.dumps(payload)}\n")
    return payload


# -- checkout: steps around a signal --------------------------------------------------


def reserve_inventory(order: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "reserved": [i["sku"] for i in order["items"]]}


def fulfill_order(order: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "shipped": True, "paid": payment["amount"]}


@registry.workflow("checkout")
def checkout(ctx: WorkflowContext) -> dict[str, Any]:
    """Input {"order_id", "items": [{"sku", ...}]}: step "reserve_inventory", wait for
    "payment_captured" ({"amount"}), step "fulfill_order"; returns all three results.
    The input is not checked before the run starts (it has no schema)."""
    order = ctx.input
    reservation = ctx.step("reserve_inventory", reserve_inventory, order)
    payment = ctx.wait_for_signal("payment_captured")
    shipment = ctx.step("fulfill_order", fulfill_order, order, payment)
    return {"reservation": reservation, "payment": payment, "shipment": shipment}


# -- cart: a workflow class with a published contract ---------------------------------

CART_INPUT = {"type": "object", "required": ["customer"], "properties": {
    "customer": {"type": "string", "minLength": 1}}}
CART_ITEM = {"type": "object", "required": ["sku", "quantity"], "additionalProperties": False,
             "properties": {"sku": {"type": "string", "minLength": 1},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 100}}}
"""The schema of the cart's `add_item` update, as its interface publishes it."""
PAYMENT = {"type": "object", "required": ["amount"], "properties": {
    "amount": {"type": "number", "exclusiveMinimum": 0}}}


def cart_is_open(cart: Cart, item: dict[str, Any]) -> None:
    """`add_item`'s validator: refuses once the cart is paid, and a SKU already in it."""
    if cart.status != "open":
        raise ValueError(f"the cart is {cart.status}: no more items")
    if any(i["sku"] == item["sku"] for i in cart.items):
        raise ValueError(f"{item['sku']} is already in the cart: change its quantity instead")


@registry.workflow_class("cart", input_schema=CART_INPUT, signals=[
    SignalSpec("payment_captured", schema=PAYMENT,
               description="The payment gateway's webhook: the cart was paid"),
])
class Cart:
    """Input {"customer"} (required). Items arrive as `add_item` updates (answered with
    the number of items), queries `contents` and `item` answer from committed state (no
    worker needed), and the signal "payment_captured" ({"amount" > 0}) ends the wait:
    then step "ship", and the run completes with the customer, items, amount paid and
    {"shipped": [skus]}."""

    def __init__(self) -> None:
        self.customer = ""
        self.items: list[dict[str, Any]] = []
        self.status = "open"

    def run(self, ctx: WorkflowContext) -> dict[str, Any]:
        self.customer = ctx.input["customer"]
        payment = ctx.wait_for_signal("payment_captured")
        self.status = "paid"
        skus = [item["sku"] for item in self.items]
        shipped = ctx.step("ship", lambda: {"shipped": skus})
        self.status = "shipped"
        return {"customer": self.customer, "items": self.items, "paid": payment["amount"],
                **shipped}

    @query("contents", description="The cart as recorded: status and items",
           response_schema={"type": "object", "required": ["status", "items"]})
    def contents(self, argument: Any) -> dict[str, Any]:
        return {"customer": self.customer, "status": self.status, "items": self.items}

    @query("item", schema={"type": "integer", "minimum": 0},
           description="The SKU of the item at this index")
    def item(self, index: int) -> str:
        return str(self.items[index]["sku"])

    @update("add_item", schema=CART_ITEM, response_schema={"type": "integer"},
            validator=cart_is_open, description="Add an item; answers the number of items")
    def add_item(self, item: dict[str, Any]) -> int:
        self.items.append(item)
        return len(self.items)


# -- quorum_approval: wait_until over signals -----------------------------------------


@registry.workflow("quorum_approval")
def quorum_approval(ctx: WorkflowContext) -> dict[str, Any]:
    """Two distinct approvers ("approved" signals, payload {"approver"}) within `hours`
    (default 48): {"outcome": "approved" | "timed_out", "approvers": [...]}. Signals of
    other names wait for later calls."""
    approvers: list[str] = []

    def approved(signal: Signal) -> None:
        who = (signal.payload or {}).get("approver", f"anonymous-{signal.signal_id}")
        if who not in approvers:
            approvers.append(who)

    deadline = float(ctx.input.get("hours", 48)) * 3600
    met = ctx.wait_until(lambda: len(approvers) >= 2, on={"approved": approved},
                         timeout=deadline, name="quorum")
    return {"outcome": "approved" if met else "timed_out", "approvers": approvers}


# -- proposal_review: an interrupt in code --------------------------------------------

PROPOSAL_SCHEMA = {
    "type": "object",
    "required": ["amount", "reason"],
    "properties": {
        "amount": {"type": "number", "minimum": 0},
        "reason": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}
"""What an edit of a proposal must be: {"amount" >= 0, "reason"}, nothing else."""


def prepare_proposal(request: dict[str, Any]) -> dict[str, Any]:
    return {"amount": request.get("amount", 100), "reason": request.get("reason", "travel")}


def commit_proposal(proposal: dict[str, Any]) -> dict[str, Any]:
    return {"committed": True, **proposal}


@registry.workflow("proposal_review")
def proposal_review(ctx: WorkflowContext) -> dict[str, Any]:
    """Step "prepare" makes the proposal {"amount" (default 100), "reason" (default
    "travel")} from the input; the interrupt "manager_review" shows it as its value
    (actions approve, edit, reject; an edit is checked against PROPOSAL_SCHEMA; times
    out after `hours`, default 24). A rejection or a timeout ends the run with
    {"outcome", "by"}; otherwise step "commit" and {"outcome": "committed", ...}."""
    proposal = ctx.step("prepare", prepare_proposal, ctx.input or {})
    decision = ctx.interrupt(
        "manager_review", f"Approve, edit or reject: {proposal['amount']} for "
        f"{proposal['reason']}", schema=PROPOSAL_SCHEMA,
        timeout=float((ctx.input or {}).get("hours", 24)) * 3600, value=proposal,
    )
    if decision.action in ("reject", "timed_out"):
        return {"outcome": decision.action, "by": decision.actor}
    if decision.action == "edit":
        proposal = decision.payload
    return {"outcome": "committed", "by": decision.actor,
            "result": ctx.step("commit", commit_proposal, proposal)}


# -- builder definitions: gates, compensation, an optional gate, a timer ---------------


def submit_expense(run: Run) -> dict[str, Any]:
    return {"expense": run.input.get("expense", "EXP-1"), "amount": run.input.get("amount", 50)}


def pay_expense(run: Run) -> dict[str, Any]:
    return {"paid": run.steps["submit"]["amount"],
            "approved_by": [run.signals["manager-approval"], run.signals["finance-approval"]]}


expense_approval = registry.register_definition(
    Workflow("expense_approval")
    .step("submit", submit_expense)
    .wait_for("manager-approval", timeout=7 * 86400)
    .wait_for("finance-approval", timeout=7 * 86400)
    .step("pay", pay_expense)
    .build()
)
"""Step "submit", then two gates in order ("manager-approval", "finance-approval", a
week each; a signal for the later gate waits for it), then step "pay", which records
the amount and both gates' payloads."""


def plan_deletion(run: Run) -> dict[str, Any]:
    return {"account": run.input["account"], "tables": ["orders", "invoices"]}


def snapshot_account(run: Run) -> dict[str, Any]:
    return {"snapshot": f"snap-{run.input['account']}"}


def drop_snapshot(run: Run) -> dict[str, Any]:
    return {"dropped": run.steps["snapshot"]["snapshot"]}


def freeze_account(run: Run) -> dict[str, Any]:
    return {"frozen": run.input["account"]}


def unfreeze_account(run: Run) -> dict[str, Any]:
    return {"unfrozen": run.input["account"]}


def delete_account(run: Run) -> dict[str, Any]:
    return {"deleted": run.input["account"], "approved_by": run.decisions["approve_deletion"].actor}


deletion_plan = registry.register_definition(
    Workflow("deletion_plan")
    .step("plan", plan_deletion)
    .step("snapshot", snapshot_account, compensate=drop_snapshot)
    .step("freeze", freeze_account, compensate=unfreeze_account)
    .interrupt("approve_deletion", "Delete this account for good?", actions=("approve", "reject"),
               timeout=3 * 86400)
    .step("delete", delete_account)
    .build()
)
"""Input {"account"}: steps "plan", "snapshot", "freeze" (the last two compensated), the
interrupt "approve_deletion" (approve or reject), step "delete". A rejection runs
"compensate:freeze" then "compensate:snapshot" and fails the run."""


def prepare_for_review(run: Run) -> dict[str, Any]:
    return prepare_proposal(run.input or {})


def commit_decision(run: Run) -> dict[str, Any]:
    decision = run.decisions["manager_review"]
    proposal = decision.payload if decision.action == "edit" else run.steps["prepare"]
    return commit_proposal(proposal)


approval = registry.register_definition(
    Workflow("approval")
    .step("prepare", prepare_for_review)
    .wait_for_signal_or_timeout("wait_for_documents", "documents_ready", timeout=24 * 3600)
    .interrupt("manager_review", "Approve, edit, or reject this proposal",
               schema=PROPOSAL_SCHEMA, value=lambda run: run.steps["prepare"])
    .timer("cooldown", 0.5)
    .step("commit", commit_decision)
    .build()
)
"""Step "prepare" (as proposal_review's), an optional gate "wait_for_documents" (the
signal "documents_ready", or a day), the interrupt "manager_review", a 0.5 s timer
"cooldown", step "commit" (the edited proposal, or the prepared one)."""


# -- onboarding and tenant_cancel: signals across shards ------------------------------


@registry.workflow("onboarding")
def onboarding(ctx: WorkflowContext) -> str:
    """Wait up to `days` (default 30) for "tenant_cancelled": returns
    "stopped: tenant cancelled" if it came, "onboarded" otherwise."""
    days = float((ctx.input or {}).get("days", 30))
    cancelled = ctx.receive("tenant_cancelled", timeout=days * 86400)
    return "stopped: tenant cancelled" if cancelled is not None else "onboarded"


@registry.workflow("tenant_cancel")
def tenant_cancel(ctx: WorkflowContext) -> dict[str, Any]:
    """Send "tenant_cancelled" ({"reason"}) to every run of the input's `runs`, on any
    shard. Returns {"signalled": [runs of this shard, signalled in this run's commit],
    "queued": [runs of other shards, left to the outbox relay], "skipped": {run:
    reason_code} (a run of this shard that had finished)}. A queued target that finished
    meanwhile gets an `external.failed` record in this run's history. Each signal is
    keyed by this run and its target, so a retried fan-out signals nobody twice."""
    signalled: list[str] = []
    queued: list[str] = []
    skipped: dict[str, str] = {}
    for run in ctx.input["runs"]:
        try:
            sent = ctx.signal_external(run, "tenant_cancelled",
                                       {"reason": ctx.input.get("reason")},
                                       idempotency_key=f"{ctx.execution_id}:{run}")
        except ExternalSignalFailed as exc:
            skipped[run] = exc.reason_code
            continue
        (queued if sent.queued else signalled).append(run)
    return {"signalled": signalled, "queued": queued, "skipped": skipped}
