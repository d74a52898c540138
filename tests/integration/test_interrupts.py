"""ctx.interrupt: a run waits in input_required for one idempotent, audited decision."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import (
    DecisionRefused,
    ExecutionNotFound,
    InvalidArgument,
    PayloadInvalid,
)
from shardq.core.models import State, TaskAction, TurnCommit
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
PROPOSAL = {
    "type": "object",
    "required": ["amount", "reason"],
    "properties": {"amount": {"type": "number", "minimum": 0}, "reason": {"type": "string"}},
}


@registry.workflow("review")
def review(ctx: WorkflowContext) -> dict[str, Any]:
    proposal = ctx.step("prepare", lambda: {"amount": ctx.input.get("amount", 10)})
    decision = ctx.interrupt("manager", "Approve, edit or reject this proposal",
                             actions=tuple(ctx.input.get("actions", ("approve", "edit",
                                                                     "reject"))),
                             schema=PROPOSAL, timeout=ctx.input.get("timeout"))
    ctx.sleep("after", 0.01)  # a replay after the decision must return the same one
    return {"proposal": proposal, "action": decision.action, "payload": decision.payload,
            "decision_id": decision.decision_id, "actor": decision.actor}


def parked(client: Client, key: str, **settings: Any) -> str:
    run = client.start("review", key, settings)
    wait_until(lambda: client.get(run.execution_id).state is State.INPUT_REQUIRED,
               what="input_required")
    return str(run.execution_id)


def kinds(client: Client, run: str) -> list[tuple[int | None, str]]:
    return [(e.position, e.kind) for e in client.history(run) if e.kind.startswith("interrupt.")]


def test_a_decision_resumes_the_run_and_replay_returns_the_same_one(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = parked(client, "r1")
    (pending,) = client.pending_interrupts().items
    assert (str(pending.execution_id), pending.name, pending.actions) == (
        run, "manager", ("approve", "edit", "reject"))
    assert pending.prompt == "Approve, edit or reject this proposal"
    assert pending.schema == PROPOSAL
    result = client.decide(run, "manager", "approve", decision_id="d1", actor="ann")
    assert result.accepted and result.decision.action == "approve"
    done = client.wait(run, timeout=10)
    assert done.output == {"proposal": {"amount": 10}, "action": "approve", "payload": None,
                           "decision_id": "d1", "actor": "ann"}
    assert kinds(client, run) == [(1, "interrupt.requested"), (1, "interrupt.decided")]
    assert client.pending_interrupts().items == []


def test_an_edit_is_checked_against_the_schema_field_by_field_and_nothing_is_stored(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = parked(client, "r2")
    before = client.history(run)
    with pytest.raises(PayloadInvalid) as refused:
        client.decide(run, "manager", "edit", {"amount": -1}, decision_id="d1", actor="ann")
    assert sorted((v["field_path"], v["message"]) for v in refused.value.violations) == [
        ("/amount", "-1 is less than the minimum of 0"),
        ("/reason", "'reason' is a required property"),
    ]
    assert client.history(run) == before
    assert client.get(run).state is State.INPUT_REQUIRED
    client.decide(run, "manager", "edit", {"amount": 5, "reason": "too much"},
                  decision_id="d2", actor="ann")
    assert client.wait(run, timeout=10).output["payload"] == {"amount": 5, "reason": "too much"}


def test_the_same_decision_again_is_a_no_op_and_a_different_one_is_refused_and_audited(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = parked(client, "r3")
    first = client.decide(run, "manager", "reject", decision_id="d1", actor="ann")
    again = client.decide(run, "manager", "reject", decision_id="d1", actor="ann")
    assert first.accepted and not again.accepted
    assert again.decision == first.decision
    with pytest.raises(DecisionRefused) as refused:
        client.decide(run, "manager", "approve", decision_id="d2", actor="bob")
    assert refused.value.reason_code == "decided"
    assert refused.value.standing is not None
    assert refused.value.standing["actor"] == "ann"
    assert client.wait(run, timeout=10).output["action"] == "reject"
    audit = [e.payload for e in client.history(run) if e.kind == "interrupt.refused"]
    assert [(a["actor"], a["action"], a["reason_code"]) for a in audit] == [
        ("bob", "approve", "decided")]


def test_concurrent_decisions_one_wins(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    same, different = parked(client, "r4"), parked(client, "r5")
    barrier = threading.Barrier(20)

    def decide(run: str, decision_id: str, action: str) -> str:
        barrier.wait()
        try:
            result = client.decide(run, "manager", action, decision_id=decision_id, actor="x")
        except DecisionRefused as exc:
            return exc.reason_code
        return "accepted" if result.accepted else "repeated"

    with ThreadPoolExecutor(20) as pool:
        outcomes = list(pool.map(lambda _: decide(same, "same", "approve"), range(100)))
    assert sorted(set(outcomes)) == ["accepted", "repeated"]
    assert outcomes.count("accepted") == 1
    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        raced = list(pool.map(lambda a: decide(different, f"d-{a}", a), ["approve", "reject"]))
    assert sorted(raced) == ["accepted", "decided"]
    winner = "approve" if raced[0] == "accepted" else "reject"
    assert client.wait(different, timeout=10).output["action"] == winner
    assert all_rows(client.map, "SELECT count(*) FROM shardq.events WHERE execution_id = %s "
                                "AND kind = 'interrupt.decided'", same) in ([(1,), (0,)],
                                                                            [(0,), (1,)])


def test_a_deadline_resolves_it_as_timed_out_never_as_an_approval(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = parked(client, "r6", timeout=0.3)
    done = client.wait(run, timeout=10)
    assert done.output["action"] == "timed_out"
    assert done.output["decision_id"] is None
    with pytest.raises(DecisionRefused) as late:
        client.decide(run, "manager", "approve", decision_id="late", actor="ann")
    assert late.value.reason_code == "timed_out"
    # The run finished: the late decision is answered and leaves no trace.
    assert kinds(client, run) == [(1, "interrupt.requested"), (1, "interrupt.timed_out")]


def test_refused_decisions_on_a_finished_run_leave_its_history_as_it_was(
    client: Client, start_worker: StartWorker
) -> None:
    """25 refusals used to append 25 `interrupt.refused` rows after `run.completed`."""
    start_worker(registry)
    decided, timed_out = parked(client, "end-1"), parked(client, "end-2", timeout=0.3)
    client.decide(decided, "manager", "approve", decision_id="d1", actor="ann")
    finished = {run: client.wait(run, timeout=10) for run in (decided, timed_out)}
    assert {r: e.state for r, e in finished.items()} == {
        decided: State.COMPLETED, timed_out: State.COMPLETED}
    before = {run: client.history(run) for run in finished}
    refusals: list[tuple[str, str]] = []
    for i in range(25):
        run = (decided, timed_out)[i % 2]
        with pytest.raises(DecisionRefused) as refused:
            client.decide(run, "manager", ("approve", "reject")[i % 3 == 0],
                          decision_id=f"late-{i}", actor=f"user-{i}")
        refusals.append((refused.value.reason_code, str(refused.value)))
    assert {code for code, _ in refusals[0::2]} == {"decided"}
    assert {code for code, _ in refusals[1::2]} == {"timed_out"}
    assert all("the run is completed" in text for _, text in refusals)
    after = {run: client.history(run) for run in finished}
    assert after == before
    assert {run: events[-1].kind for run, events in after.items()} == {
        decided: "run.completed", timed_out: "run.completed"}
    # The repeat of the decision that stands is still a no-op success.
    again = client.decide(decided, "manager", "approve", decision_id="d1", actor="ann")
    assert not again.accepted and again.decision.decision_id == "d1"


def test_cancel_is_a_decision_too(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    run = parked(client, "r7")
    assert client.cancel(run, actor="ops") is State.CANCELLED
    decided = [e.payload for e in client.history(run) if e.kind == "interrupt.decided"]
    assert [(d["action"], d["actor"]) for d in decided] == [("cancel", "ops")]
    assert client.get(run).state is State.CANCELLED


def test_an_action_it_does_not_accept_and_another_tenant_are_refused(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = parked(client, "r8", actions=["approve", "reject"])
    with pytest.raises(DecisionRefused, match="action_refused"):
        client.decide(run, "manager", "edit", {"amount": 1, "reason": "r"}, decision_id="d1",
                      actor="ann")
    before = client.history(run)
    with pytest.raises(ExecutionNotFound):
        client.decide(run, "manager", "approve", decision_id="d2", actor="eve", tenant="other")
    assert client.history(run) == before
    assert client.pending_interrupts(tenant="other").items == []
    with pytest.raises(DecisionRefused, match="not_open"):
        client.decide(run, "nothing_here", "approve", decision_id="d3", actor="ann")


@pytest.mark.parametrize(("args", "says"), [
    (("manager", "cancel"), "action must be one of"),
    (("manager", "approve"), "decision_id must be a non-empty string"),
    (("bad name!", "approve"), "interrupt name"),
])
def test_bad_decisions_are_refused_before_anything_is_sent(
    client: Client, args: tuple[str, str], says: str
) -> None:
    run = client.start("review", "r9", {}).execution_id
    decision_id = "" if "decision_id" in says else "d"
    with pytest.raises(InvalidArgument, match=says):
        client.decide(run, *args, decision_id=decision_id, actor="ann")


def test_the_inbox_pages_across_shards_oldest_first(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    runs = [parked(client, f"p{i}") for i in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        page = client.pending_interrupts(limit=3, cursor=cursor)
        seen += [str(p.execution_id) for p in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == runs  # started one after the other: requested in that order
    assert {client.map.for_execution(r).name for r in runs} == {s.name for s in client.map.shards}
    assert client.pending_interrupts(workflow="other").items == []
    with pytest.raises(InvalidArgument, match="cursor"):
        client.pending_interrupts(cursor="nope")


def test_a_decision_that_lands_while_a_worker_holds_the_run_is_acted_on(
    client: Client, start_worker: StartWorker, pools: ShardPools
) -> None:
    """The decision cannot wake a leased run (its task row is the worker's), and the
    worker's turn, begun before the decision, parks on the interrupt again. That
    commit deleted the task row: the run was left with no task and no wait,
    `pending` forever, its accepted decision never acted on."""
    worker = start_worker(registry)
    run = parked(client, "held")
    worker.stop()  # no worker is left to take the run but this test's claim
    shard = client.map.for_execution(run)
    store = Store(pools)
    # Something wakes the waiting run (an update does) and a worker claims it.
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("INSERT INTO shardq.tasks (execution_id, run_at, claims) "
                     "VALUES (%s, now(), 1)", (run,))
    claims, _ = store.claim(shard, owner="holder", limit=10, lease_s=30)
    (claim,) = [c for c in claims if str(c.execution_id) == run]
    assert client.decide(run, "manager", "approve", decision_id="d-held", actor="ann").accepted
    parking = TurnCommit(claim.execution_id, claim.lease_token, state=State.INPUT_REQUIRED,
                         task=TaskAction.DELETE)
    assert store.commit_turns(shard, [parking], lease_s=30)[claim.execution_id].landed
    start_worker(registry)
    done = client.wait(run, timeout=10)
    assert (done.state, done.output["action"], done.output["decision_id"]) == (
        State.COMPLETED, "approve", "d-held")


@registry.workflow("review_value")
def review_value(ctx: WorkflowContext) -> Any:
    proposal = ctx.step("prepare", lambda: {"amount": ctx.input["amount"], "reason": "travel"})
    decision = ctx.interrupt("manager", "Check this proposal", schema=PROPOSAL, value=proposal)
    return decision.payload if decision.action == "edit" else proposal


def test_the_value_under_review_is_stored_with_the_request_and_listed(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("review_value", "rv-1", {"amount": 120})
    wait_until(lambda: client.get(run.execution_id).state is State.INPUT_REQUIRED,
               what="input_required")
    (pending,) = [p for p in client.pending_interrupts().items
                  if p.execution_id == run.execution_id]
    assert pending.value == {"amount": 120, "reason": "travel"}
    requested = [e for e in client.history(run.execution_id) if e.kind == "interrupt.requested"]
    assert requested[0].payload["value"] == {"amount": 120, "reason": "travel"}
    client.decide(run.execution_id, "manager", "edit", {"amount": 95, "reason": "travel"},
                  decision_id="d-1", actor="ann")
    assert client.wait(run.execution_id, timeout=10).output == {"amount": 95, "reason": "travel"}


def test_a_value_that_does_not_match_the_schema_fails_the_run_with_the_violation(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("review_value", "rv-2", {"amount": -5})
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.FAILED
    assert "value of interrupt 'manager' does not match its schema: /amount" in str(
        done.error), done.error
    assert not [p for p in client.pending_interrupts().items
                if p.execution_id == run.execution_id]
