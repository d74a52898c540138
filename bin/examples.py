"""The example workflows the demo and the tests run (`--app shardq.bin.examples:registry`)."""

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


def reserve_inventory(order: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "reserved": [i["sku"] for i in order["items"]]}


def fulfill_order(order: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "shipped": True, "paid": payment["amount"]}


@registry.workflow("checkout")
def checkout(ctx: WorkflowContext) -> dict[str, Any]:
    """Reserve stock, wait (hours, days) for the payment webhook, then ship."""
    order = ctx.input
    reservation = ctx.step("reserve_inventory", reserve_inventory, order)
    payment = ctx.wait_for_signal("payment_captured")
    shipment = ctx.step("fulfill_order", fulfill_order, order, payment)
    return {"reservation": reservation, "payment": payment, "shipment": shipment}


CART_INPUT = {"type": "object", "required": ["customer"], "properties": {
    "customer": {"type": "string", "minLength": 1}}}
CART_ITEM = {"type": "object", "required": ["sku", "quantity"], "additionalProperties": False,
             "properties": {"sku": {"type": "string", "minLength": 1},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 100}}}
PAYMENT = {"type": "object", "required": ["amount"], "properties": {
    "amount": {"type": "number", "exclusiveMinimum": 0}}}


def cart_is_open(cart: Cart, item: dict[str, Any]) -> None:
    if cart.status != "open":
        raise ValueError(f"the cart is {cart.status}: no more items")
    if any(i["sku"] == item["sku"] for i in cart.items):
        raise ValueError(f"{item['sku']} is already in the cart: change its quantity instead")


@registry.workflow_class("cart", input_schema=CART_INPUT, signals=[
    SignalSpec("payment_captured", schema=PAYMENT,
               description="The payment gateway's webhook: the cart was paid"),
])
class Cart:
    """A shopping cart that lives until it is paid, with a published contract.

    Items arrive as updates (each answered with the cart's size once recorded),
    `contents` answers from the committed state at any time, with no worker
    running, and the payment webhook is a signal whose payload is checked.
    """

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


@registry.workflow("quorum_approval")
def quorum_approval(ctx: WorkflowContext) -> dict[str, Any]:
    """Two distinct approvers before a deadline (`hours`, default 48); else timed out.

    The approvals live in the workflow's own state; `wait_until` feeds it each
    `approved` signal and re-checks the quorum after every one. Signals of other
    names wait for later calls.
    """
    approvers: list[str] = []

    def approved(signal: Signal) -> None:
        who = (signal.payload or {}).get("approver", f"anonymous-{signal.signal_id}")
        if who not in approvers:
            approvers.append(who)

    deadline = float(ctx.input.get("hours", 48)) * 3600
    met = ctx.wait_until(lambda: len(approvers) >= 2, on={"approved": approved},
                         timeout=deadline, name="quorum")
    return {"outcome": "approved" if met else "timed_out", "approvers": approvers}


PROPOSAL_SCHEMA = {
    "type": "object",
    "required": ["amount", "reason"],
    "properties": {
        "amount": {"type": "number", "minimum": 0},
        "reason": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}


def prepare_proposal(request: dict[str, Any]) -> dict[str, Any]:
    return {"amount": request.get("amount", 100), "reason": request.get("reason", "travel")}


def commit_proposal(proposal: dict[str, Any]) -> dict[str, Any]:
    return {"committed": True, **proposal}


@registry.workflow("proposal_review")
def proposal_review(ctx: WorkflowContext) -> dict[str, Any]:
    """Prepare a proposal, ask a manager (approve, edit or reject, a day at most), commit.

    The proposal is the value under review: the inbox shows it and starts the
    edit form from it. An edit replaces the proposal with the manager's version
    (checked against PROPOSAL_SCHEMA before it is stored); a rejection or a
    timeout ends the run with that outcome and commits nothing.
    """
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


def submit_expense(run: Run) -> dict[str, Any]:
    return {"expense": run.input.get("expense", "EXP-1"), "amount": run.input.get("amount", 50)}


def pay_expense(run: Run) -> dict[str, Any]:
    return {"paid": run.steps["submit"]["amount"],
            "approved_by": [run.signals["manager-approval"], run.signals["finance-approval"]]}


# Manager, then finance: each a gate that takes one signal. Finance may sign
# first; its signal waits for its gate. A week per sign-off at most.
expense_approval = registry.register_definition(
    Workflow("expense_approval")
    .step("submit", submit_expense)
    .wait_for("manager-approval", timeout=7 * 86400)
    .wait_for("finance-approval", timeout=7 * 86400)
    .step("pay", pay_expense)
    .build()
)


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


# A rejection at the review unwinds what was done: unfreeze, then drop the
# snapshot (reverse order), each once, and the run ends failed.
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


def prepare_for_review(run: Run) -> dict[str, Any]:
    return prepare_proposal(run.input or {})


def commit_decision(run: Run) -> dict[str, Any]:
    decision = run.decisions["manager_review"]
    proposal = decision.payload if decision.action == "edit" else run.steps["prepare"]
    return commit_proposal(proposal)


# The shape: documents may or may not come within a day (the review
# sees which), a manager decides, a cool-down, then the commit.
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


@registry.workflow("onboarding")
def onboarding(ctx: WorkflowContext) -> str:
    """A tenant's new user, onboarding for up to `days` unless the tenant is cancelled."""
    days = float((ctx.input or {}).get("days", 30))
    cancelled = ctx.receive("tenant_cancelled", timeout=days * 86400)
    return "stopped: tenant cancelled" if cancelled is not None else "onboarded"


@registry.workflow("tenant_cancel")
def tenant_cancel(ctx: WorkflowContext) -> dict[str, Any]:
    """Tell every onboarding run of a tenant (`runs`, on any shard) that it was cancelled.

    A run of this run's shard gets the signal in this run's own commit; one
    that already finished is skipped by its reason code, and the fan-out goes
    on. A run of another shard gets it through the outbox relay (`queued`); if
    that one finished meanwhile, the relay records `external.failed` with the
    reason code in this run's history. Each signal is keyed by this run and its
    target, so the whole fan-out can be retried without signalling anyone twice.
    """
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


def noop() -> None:
    return None


@registry.workflow("noop")
def noop_job(ctx: WorkflowContext) -> None:
    """A plain job: one step."""
    ctx.step("run", noop)


@registry.workflow("steps3")
def three_steps(ctx: WorkflowContext) -> int:
    for name in ("a", "b", "c"):
        ctx.step(name, noop)
    return 3


@registry.workflow("park")
def park_on_signal(ctx: WorkflowContext) -> Any:
    """Start, park on a signal, resume, complete: one durable cycle."""
    return ctx.wait_for_signal("go")


@registry.workflow("slow_steps")
def slow_steps(ctx: WorkflowContext) -> list[int]:
    """Numbered steps that each take `seconds`, each appending a line to the file `trace`
    when it finishes: crash tests kill workers mid-step and count what really ran."""
    seconds = float(ctx.input.get("seconds", 0.2))
    trace = ctx.input.get("trace")
    done = []
    for i in range(int(ctx.input.get("steps", 5))):
        done.append(ctx.step(f"step-{i}", _slow, ctx.workflow_id, i, seconds, trace))
    return done


def _slow(workflow_id: str, i: int, seconds: float, trace: str | None) -> int:
    time.sleep(seconds)
    if trace:
        with open(trace, "a") as out:
            out.write(f"{workflow_id} {i}\n")
    return i


@registry.workflow("slow_after_signal")
def slow_after_signal(ctx: WorkflowContext) -> Any:
    """Wait for "go", then hand its payload to a step taking `seconds` that appends
    `<id> start|done <payload>` lines to the file `trace`: crash tests kill the
    worker between a signal's consumption and the next commit."""
    payload = ctx.wait_for_signal("go")
    return ctx.step("use", _slow_use, ctx.workflow_id, payload,
                    float(ctx.input["seconds"]), ctx.input["trace"])


def _slow_use(workflow_id: str, payload: Any, seconds: float, trace: str) -> Any:
    with open(trace, "a") as out:
        out.write(f"{workflow_id} start {json.dumps(payload)}\n")
    time.sleep(seconds)
    with open(trace, "a") as out:
        out.write(f"{workflow_id} done {json.dumps(payload)}\n")
    return payload
