"""The declarative builder: gates, interrupts, timers, compensation, checked at build time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.errors import ExecutionNotFound, InvalidArgument, SignalRefused
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.builder import Run, Workflow
from shardq.workflow.registry import Registry

from ..app import registry
from ..support import wait_until

StartWorker = Callable[..., Worker]


def noop(run: Run) -> None:
    return None


def boom(run: Run) -> None:
    raise RuntimeError("deliberate")


@pytest.mark.parametrize(("build", "says"), [
    (lambda: Workflow("w").step("a", noop).wait_for("e").wait_for("e"), "one event per gate"),
    (lambda: Workflow("w").step("a", noop).wait_for(""), "signal name must be a non-empty"),
    (lambda: Workflow("w").step("a", noop).wait_for("shardq.x"), "is reserved"),
    (lambda: Workflow("w").step("a", noop).wait_for("e", timeout=0), "positive number"),
    (lambda: Workflow("w").step("a", noop).wait_for("e", timeout=-5), "positive number"),
    (lambda: Workflow("w").step("a", noop).timer("t", float("inf")), "positive number"),
    (lambda: Workflow("w").step("a", noop).interrupt("i", "ok?", timeout=0),
     "timeout must be > 0"),
    (lambda: Workflow("w").step("a", noop).interrupt("i", ""), "prompt must be"),
    (lambda: Workflow("w").step("a", noop).interrupt("i", "ok?", actions=["maybe"]), "actions"),
    (lambda: Workflow("w").step("a", noop).interrupt("i", "?", schema={"type": 5}),
     "not a valid JSON Schema"),
    (lambda: Workflow("w").step("a", noop).interrupt("i", "?", value={"a": 1}),  # type: ignore[arg-type]
     "value must be a function of the run"),
    (lambda: Workflow("w").step("a", noop).step("a", noop), "used twice"),
    (lambda: Workflow("w").step("compensate:a", noop), "reserved for compensations"),
    (lambda: Workflow("w").step("a", noop, retry=0), "max_attempts"),
    (lambda: Workflow("w").wait_for("e").build(), "at least one step"),
    (lambda: Workflow("w").version(0), "version"),
    (lambda: Workflow("bad name!"), "workflow name"),
])
def test_a_bad_definition_is_refused_when_it_is_built(
    build: Callable[[], Any], says: str
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        build()


def test_gates_keep_an_early_signal_and_take_only_the_first_of_each_event(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("expense_approval", "e-1", {"amount": 70}).execution_id
    # Finance signs first: kept until its gate, after the manager's.
    client.signal(run, "finance-approval", {"by": "fin"})
    with pytest.raises(SignalRefused, match="one of its gates") as refused:
        client.signal(run, "finance-approval", {"by": "someone else"})
    assert refused.value.reason_code == "gate_closed"
    wait_until(lambda: client.get(run).state is State.WAITING, what="at the manager's gate")
    assert client.get(run).state is State.WAITING
    with pytest.raises(ExecutionNotFound):  # another tenant's signal stores nothing
        client.signal(run, "manager-approval", {"by": "intruder"}, tenant="other")
    client.signal(run, "manager-approval")  # no payload: still opens the gate
    done = client.wait(run, timeout=10)
    assert done.state is State.COMPLETED, done.error
    assert done.output["steps"]["pay"] == {"paid": 70, "approved_by": [None, {"by": "fin"}]}
    with pytest.raises(SignalRefused):
        client.signal(run, "manager-approval", {"late": True})


def test_a_rejection_unwinds_completed_steps_in_reverse_and_fails_the_run(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("deletion_plan", "acct-1", {"account": "acct-1"}).execution_id
    wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, what="input_required")
    client.decide(run, "approve_deletion", "reject", decision_id="no", actor="dpo")
    done = client.wait(run, timeout=10)
    assert done.state is State.FAILED
    assert done.error is not None
    assert done.error["type"] == "Rejected"
    assert "rejected by dpo" in done.error["message"]
    steps = [e.name for e in client.history(run) if e.kind == "step.completed"]
    assert steps == ["plan", "snapshot", "freeze", "compensate:freeze", "compensate:snapshot"]


def test_a_gate_that_times_out_unwinds_and_ends_timed_out(
    client: Client, start_worker: StartWorker
) -> None:
    local = Registry()
    local.register_definition(
        Workflow("short_gate")
        .step("reserve", lambda run: "r", compensate=lambda run: "released")
        .wait_for("go", timeout=0.2)
        .step("never", noop)
        .build()
    )
    start_worker(local)
    run = Client(client.store, local).start("short_gate", "g").execution_id
    done = client.wait(run, timeout=10)
    assert done.state is State.TIMED_OUT
    assert done.error is not None and "gate 'go' timed out" in done.error["message"]
    assert [e.name for e in client.history(run) if e.kind == "step.completed"] == [
        "reserve", "compensate:reserve"]


def test_one_attempt_is_believed_and_an_optional_gate_reports_its_timeout(
    client: Client, start_worker: StartWorker
) -> None:
    local = Registry()
    local.register_definition(
        Workflow("once").step("a", noop, compensate=lambda run: "undone")
        .wait_for_signal_or_timeout("docs", "documents_ready", timeout=0.2)
        .step("b", lambda run: sorted(run.timed_out))
        .step("c", boom, retry=1)
        .build()
    )
    start_worker(local)
    run = Client(client.store, local).start("once", "o").execution_id
    done = client.wait(run, timeout=10)
    assert done.state is State.FAILED
    history = client.history(run)
    assert [e.payload for e in history if e.name == "b" and e.kind == "step.completed"] == [
        {"result": ["docs"]}]
    assert [e.payload["attempt"] for e in history if e.kind == "step.failed"] == [1]
    assert [e.name for e in history if e.kind == "step.completed"][-1] == "compensate:a"


def test_the_approval_shape_with_an_edit_decided_and_documents_sent(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("approval", "ap-1", {"amount": 300}).execution_id
    client.signal(run, "documents_ready", {"files": 2})
    wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, what="input_required")
    client.decide(run, "manager_review", "edit", {"amount": 250, "reason": "cap"},
                  decision_id="d", actor="mia")
    done = client.wait(run, timeout=10)
    assert done.state is State.COMPLETED, done.error
    assert done.output["steps"]["commit"] == {"committed": True, "amount": 250, "reason": "cap"}
    assert done.output["signals"] == {"documents_ready": {"files": 2}}
    assert done.output["timed_out"] == []


proposals = Registry()
proposals.register_definition(
    Workflow("proposal_review")
    .step("prepare", lambda run: {"amount": run.input["amount"], "reason": "travel"})
    .interrupt("finance", "Check the proposal", schema={"type": "object"},
               value=lambda run: run.steps["prepare"])
    .step("commit", lambda run: run.decisions["finance"].payload or run.steps["prepare"])
    .build())


def test_an_interrupt_stage_shows_the_value_it_computes_from_the_run(
    pools: ShardPools, shard_map: ShardMap, start_worker: StartWorker
) -> None:
    client = Client(Store(pools), proposals)
    start_worker(proposals)
    run = client.start("proposal_review", "p-1", {"amount": 40}).execution_id
    wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, what="in review")
    (pending,) = client.pending_interrupts().items
    assert pending.value == {"amount": 40, "reason": "travel"}
    client.decide(run, "finance", "edit", {"amount": 35, "reason": "travel"},
                  decision_id="f-1", actor="fin")
    assert client.wait(run, timeout=10).state is State.COMPLETED
