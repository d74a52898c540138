"""Child workflows: started in the parent's commit or through the outbox, their outcomes
back exactly once, fan-in on one wait row, and trees cancelled with their parents."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.client.recorded import recorded_runs
from shardq.core.children import ChildHandle, ChildRequest
from shardq.core.errors import ChildFailed, ExecutionNotFound
from shardq.core.models import State
from shardq.outbox.relay import Relay
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry
from shardq.workflow.replayer import check_run

from ..support import key_on, rows, wait_until

StartWorker = Callable[..., Worker]
StartRelay = Callable[..., Relay]
registry = Registry()
TURNS: dict[str, int] = {}


@registry.workflow("add")
def add(ctx: WorkflowContext) -> Any:
    if ctx.input.get("fail"):
        raise ValueError(f"cannot add {ctx.input['a']}")
    return ctx.input["a"] + ctx.input["b"]


@registry.workflow("held")
def held(ctx: WorkflowContext) -> Any:
    """A child that runs until it is told to finish (or cancelled)."""
    return ctx.wait_for_signal("go")


@registry.workflow("parent")
def parent(ctx: WorkflowContext) -> Any:
    """Start the child the input names and wait for it; a failure is caught and told."""
    child = ctx.start_child(ctx.input["workflow"], ctx.input["id"], ctx.input.get("input"))
    ctx.sleep("between", 0.01)  # a second turn: replay must not start the child again
    try:
        return {"output": ctx.wait_child(child)}
    except ChildFailed as exc:
        return {"failed": exc.state, "type": exc.error_type, "message": exc.error_message}


@registry.workflow("fan")
def fan(ctx: WorkflowContext) -> Any:
    """Start a child per id; wait for all of them, or for `count`."""
    handles = ctx.start_children([ChildRequest("add", i, {"a": n, "b": 1})
                                  for n, i in enumerate(ctx.input["ids"])])
    outcomes = ctx.wait_children(handles, ctx.input.get("count"))
    return [None if o is None else o.result() for o in outcomes]


@registry.workflow("fan_held")
def fan_held(ctx: WorkflowContext) -> Any:
    """Start `n` children that each wait for a signal; wait for all of them. Counts its
    turns (the function runs from the top on each) in `TURNS`, by workflow id."""
    TURNS[ctx.workflow_id] = TURNS.get(ctx.workflow_id, 0) + 1
    handles = ctx.start_children([ChildRequest("held", f"{ctx.workflow_id}.{n}")
                                  for n in range(ctx.input["n"])])
    return [o and o.result() for o in ctx.wait_children(handles)]


@registry.workflow("tree")
def tree(ctx: WorkflowContext) -> Any:
    """A level of a tree: `width` children of the next level, leaves wait for "go"."""
    depth = ctx.input["depth"]
    if depth == 0:
        return ctx.wait_for_signal("go")
    handles = ctx.start_children([
        ChildRequest("tree", f"{ctx.workflow_id}.{n}", {"depth": depth - 1,
                                                        "width": ctx.input["width"]})
        for n in range(ctx.input["width"])])
    return [o and o.state for o in ctx.wait_children(handles)]


@registry.workflow("leaves")
def leaves(ctx: WorkflowContext) -> Any:
    """Start a "held" child under the input's policy and end at once."""
    ctx.start_child("held", ctx.input["id"], policy=ctx.input["policy"])
    if ctx.input.get("fail"):
        raise RuntimeError("parent failed")
    return "parent done"


@registry.workflow("hostile")
def hostile(ctx: WorkflowContext) -> Any:
    """One bad call, by name; its error fails the run and nothing is started."""
    bad = ctx.input["case"]
    if bad == "unknown workflow":
        ctx.start_child("no-such-workflow", "x")
    elif bad == "nul id":
        ctx.start_child("add", "a\x00b", {"a": 1, "b": 2})
    elif bad == "too many":
        ctx.start_children([ChildRequest("add", f"c{n}", {"a": n, "b": 0})
                            for n in range(10_001)])
    elif bad == "bad policy":
        ctx.start_child("add", "p", {"a": 1, "b": 1}, policy="orphan")
    elif bad == "twice in one call":
        ctx.start_children([ChildRequest("add", "same"), ChildRequest("add", "same")])
    elif bad == "not a child":
        ctx.start_child("add", "mine", {"a": 1, "b": 1})
        ctx.wait_children([ChildHandle(ctx.execution_id, "add", "not-mine")])
    elif bad == "count zero":
        ctx.wait_children([ctx.start_child("add", "z", {"a": 1, "b": 1})], 0)
    elif bad == "bad input":
        ctx.start_child("add", "nan", float("nan"))
    return "unreachable"


def _state(client: Client, execution_id: Any) -> State | None:
    """The run's state; None while it is not there yet (a start on its way)."""
    try:
        return client.get(execution_id).state
    except ExecutionNotFound:
        return None


def test_a_child_on_the_parent_s_shard_starts_in_its_commit_and_reports_once(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    child_id = key_on(client.map, 0, "add", "same")
    run = client.start("parent", key_on(client.map, 0, "parent", "p"),
                       {"workflow": "add", "id": child_id, "input": {"a": 2, "b": 3}})
    done = client.wait(run.execution_id, timeout=15)
    assert done.state is State.COMPLETED, done.error
    assert done.output == {"output": 5}
    kinds = [(e.position, e.kind) for e in client.history(run.execution_id)
             if e.kind.startswith("child")]
    # The child may end before the parent's wait: then it never parked.
    assert kinds in ([(0, "child.started"), (2, "children.waiting"), (2, "children.ended")],
                     [(0, "child.started"), (2, "children.ended")])
    child = client.history(run.execution_id)[0].payload["child"]
    assert client.history(child)[0].kind == "child.of"
    shard = client.map.shards[0].url
    # One child run, made in the parent's own commit: no relay runs in this test.
    assert rows(shard, "SELECT count(*) FROM shardq.executions WHERE workflow_id = %s",
                child_id) == [(1,)]
    assert rows(shard, "SELECT count(*) FROM shardq.outbox WHERE source_execution_id = %s",
                run.execution_id) == [(0,)]
    assert rows(shard, "SELECT ended FROM shardq.children WHERE parent_id = %s",
                run.execution_id) == [("completed",)]
    (listed,) = client.describe(run.execution_id).children
    assert (str(listed.child_id), listed.workflow_id, listed.ended) == (
        child, child_id, "completed")


def test_a_child_on_another_shard_starts_and_reports_through_the_outbox(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry)
    relay()
    run = client.start("parent", key_on(client.map, 0, "parent", "x"),
                       {"workflow": "add", "id": key_on(client.map, 1, "add", "far"),
                        "input": {"a": 40, "b": 2}})
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is State.COMPLETED, done.error
    assert done.output == {"output": 42}
    # The child lives on shard 1, its parent's list on shard 0; the start and the
    # outcome crossed through the outbox, whose delivered rows are gone.
    child = client.history(run.execution_id)[0].payload["child"]
    assert rows(client.map.shards[1].url, "SELECT parent_id FROM shardq.executions "
                "WHERE id = %s", child) == [(run.execution_id,)]
    assert rows(client.map.shards[0].url, "SELECT ended FROM shardq.children "
                "WHERE parent_id = %s", run.execution_id) == [("completed",)]
    for shard in client.map.shards:
        assert rows(shard.url, "SELECT count(*) FROM shardq.outbox WHERE state <> 'pending'"
                    " OR source_execution_id IN (%s, %s)", run.execution_id, child) == [(0,)]


@pytest.mark.parametrize("shard", [0, 1])
def test_a_failed_child_raises_its_reason_in_the_parent(
    client: Client, start_worker: StartWorker, relay: StartRelay, shard: int
) -> None:
    start_worker(registry)
    relay()
    run = client.start("parent", key_on(client.map, 0, "parent", f"f{shard}"),
                       {"workflow": "add", "id": key_on(client.map, shard, "add", "bad"),
                        "input": {"a": 1, "b": 1, "fail": True}})
    done = client.wait(run.execution_id, timeout=20)
    assert done.output == {"failed": "failed", "type": "ValueError", "message": "cannot add 1"}


@pytest.mark.parametrize("shard", [0, 1])
def test_a_child_id_another_run_holds_fails_the_child_not_the_other_run(
    client: Client, start_worker: StartWorker, relay: StartRelay, shard: int
) -> None:
    taken = key_on(client.map, shard, "held", "taken")
    other = client.start("held", taken)
    start_worker(registry)
    relay()
    run = client.start("parent", key_on(client.map, 0, "parent", f"c{shard}"),
                       {"workflow": "held", "id": taken})
    done = client.wait(run.execution_id, timeout=20)
    assert done.output["failed"] == "failed"
    assert done.output["type"] == "ChildStartRefused"
    assert "taken by run" in done.output["message"]
    # The run that held the id is untouched: still waiting for its signal.
    assert _state(client, other.execution_id) is State.WAITING


def test_a_parent_gets_two_hundred_children_s_outputs_across_shards(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry, concurrency=16)
    relay()
    ids = [f"kid-{n}" for n in range(200)]
    run = client.start("fan", key_on(client.map, 0, "fan", "all"), {"ids": ids})
    wait_until(lambda: _state(client, run.execution_id) in (State.WAITING, State.COMPLETED),
               what="parent parked")
    done = client.wait(run.execution_id, timeout=60)
    assert done.state is State.COMPLETED, done.error
    assert done.output == [n + 1 for n in range(200)]
    # Children landed on both shards.
    counts = [rows(s.url, "SELECT count(*) FROM shardq.executions WHERE workflow_name = 'add'"
                   " AND parent_id = %s", run.execution_id)[0][0] for s in client.map.shards]
    assert sum(counts) == 200 and all(counts)
    # One history event for the call's 200 starts, which every later turn replayed
    # (the parent's second turn returned their outputs in order), and so does the
    # offline check; a run's children are the ones it names, at positions 0..199.
    history = client.history(run.execution_id)
    (batch,) = [e for e in history if e.kind in ("child.started", "children.started")]
    assert (batch.kind, batch.position, batch.payload["workflow_id"]) == (
        "children.started", 0, ids)
    assert sorted(str(c.child_id) for c in client.describe(run.execution_id).children) == sorted(
        batch.payload["child"])
    (recorded,) = [r for r in recorded_runs(client, workflows=["fan"])
                   if r.execution_id == run.execution_id]
    assert check_run(registry, recorded).ok
    assert not check_run(registry, replace(recorded, history=tuple(
        replace(e, payload={**e.payload, "workflow_id": ["kid-0", "other", *ids[2:]]})
        if e.kind == "children.started" else e for e in recorded.history))).ok


def test_a_parent_is_woken_once_when_its_last_child_ends_not_per_child(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry, concurrency=8)
    relay()
    run = client.start("fan_held", key_on(client.map, 0, "fan_held", "w"), {"n": 40})
    url = client.map.shards[0].url
    wait = ("SELECT w.kind, (w.request->>'need')::int, EXISTS (SELECT 1 FROM shardq.tasks t "
            "WHERE t.execution_id = w.execution_id) FROM shardq.waits w "
            "WHERE w.execution_id = %s")
    wait_until(lambda: rows(url, wait, run.execution_id) == [("children", 40, False)],
               timeout=20, what="the parent parked on one row needing 40")
    kids = [c.child_id for c in client.describe(run.execution_id).children]
    wait_until(lambda: all(_state(client, k) is State.WAITING for k in kids), timeout=20,
               what="every child waiting")
    for kid in kids[:-1]:
        client.signal(kid, "go", 1)
    # 39 outcomes in: the one row counted them down, and the parent was not made due.
    wait_until(lambda: rows(url, wait, run.execution_id) == [("children", 1, False)],
               timeout=20, what="39 outcomes counted")
    assert [e.kind for e in client.history(run.execution_id)
            if e.kind.startswith("children.")] == ["children.started", "children.waiting"]
    client.signal(kids[-1], "go", 1)
    assert client.wait(run.execution_id, timeout=20).output == [1] * 40
    # Two turns: the one that started the children and parked, the one the last woke.
    assert TURNS[client.get(run.execution_id).workflow_id] == 2
    assert [e.kind for e in client.history(run.execution_id)
            if e.kind.startswith("children.")] == ["children.started", "children.waiting",
                                                   "children.ended"]


def test_a_quorum_wait_returns_once_enough_children_ended(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry)
    relay()
    run = client.start("fan", key_on(client.map, 0, "fan", "quorum"),
                       {"ids": [f"q-{n}" for n in range(6)], "count": 2})
    done = client.wait(run.execution_id, timeout=30)
    assert done.state is State.COMPLETED, done.error
    assert sum(1 for o in done.output if o is not None) >= 2


def test_cancelling_the_root_cancels_a_three_level_tree_across_shards(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry, concurrency=16)
    relay()
    root = client.start("tree", key_on(client.map, 0, "tree", "root"), {"depth": 2, "width": 3})
    family = f"SELECT id FROM shardq.executions WHERE workflow_name = 'tree' AND workflow_id " \
             f"LIKE '{client.get(root.execution_id).workflow_id}.%%'"

    def members() -> list[Any]:
        return [r[0] for s in client.map.shards for r in rows(s.url, family)]

    wait_until(lambda: len(members()) == 12 and all(
        _state(client, m) is State.WAITING for m in members()), timeout=30,
        what="a tree of 1 + 3 + 9 runs, all waiting")
    # One leaf finishes first: it keeps its outcome.
    first = sorted(members(), key=lambda m: client.get(m).workflow_id)[-1]
    client.signal(first, "go", "done first")
    assert client.wait(first, timeout=15).state is State.COMPLETED
    client.cancel(root.execution_id)
    wait_until(lambda: all(client.get(m).state.terminal for m in members()), timeout=30,
               what="every descendant ended")
    states = {m: _state(client, m) for m in members()}
    assert states.pop(first) is State.COMPLETED
    assert set(states.values()) == {State.CANCELLED}
    assert _state(client, root.execution_id) is State.CANCELLED
    # Cancelled once each: one run.cancelled event per run.
    for m in states:
        assert [e.kind for e in client.history(m)].count("run.cancelled") == 1


@pytest.mark.parametrize(("policy", "fail", "child_state"), [
    ("cancel", False, State.CANCELLED),
    ("cancel", True, State.CANCELLED),
    ("abandon", False, State.WAITING),
    ("wait", True, State.WAITING),
])
def test_a_parent_that_ends_first_applies_the_child_s_policy(
    client: Client, start_worker: StartWorker, relay: StartRelay, policy: str, fail: bool,
    *, child_state: State,
) -> None:
    start_worker(registry)
    relay()
    child_id = key_on(client.map, 1, "held", f"{policy}-{fail}")
    run = client.start("leaves", key_on(client.map, 0, "leaves", f"{policy}-{fail}"),
                       {"id": child_id, "policy": policy, "fail": fail})
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is (State.FAILED if fail else State.COMPLETED)
    child = client.history(run.execution_id)[0].payload["child"]
    wait_until(lambda: _state(client, child) is child_state, timeout=20, what=child_state)


def test_a_wait_policy_child_keeps_its_completing_parent_open(
    client: Client, start_worker: StartWorker, relay: StartRelay
) -> None:
    start_worker(registry)
    relay()
    run = client.start("leaves", key_on(client.map, 0, "leaves", "kept"),
                       {"id": key_on(client.map, 1, "held", "kept"), "policy": "wait"})
    wait_until(lambda: _state(client, run.execution_id) is State.WAITING, timeout=20,
               what="parent waiting for its child")
    child = client.history(run.execution_id)[0].payload["child"]
    wait_until(lambda: _state(client, child) is State.WAITING, what="child waiting")
    client.signal(child, "go", 1)
    assert client.wait(run.execution_id, timeout=20).output == "parent done"


@pytest.mark.parametrize(("case", "message"), [
    ("unknown workflow", "no-such-workflow"),
    ("nul id", "workflow_id"),
    ("too many", "at most 10000 children"),
    ("bad policy", "policy must be one of cancel, abandon, wait"),
    ("twice in one call", "appears twice in one call"),
    ("not a child", "is not a child this run started"),
    ("count zero", "count must be 1..1"),
    ("bad input", "input of add"),
])
def test_a_bad_child_call_fails_the_parent_and_starts_nothing(
    client: Client, start_worker: StartWorker, case: str, message: str
) -> None:
    start_worker(registry)
    run = client.start("hostile", key_on(client.map, 0, "hostile", case.replace(" ", "-")),
                       {"case": case})
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is State.FAILED
    assert done.error is not None
    assert message in done.error["message"], done.error
    if case not in ("not a child", "count zero"):
        for shard in client.map.shards:
            assert rows(shard.url, "SELECT count(*) FROM shardq.children "
                        "WHERE parent_id = %s", run.execution_id) == [(0,)]
