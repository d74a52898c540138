"""A run that ends in the turn of its last step stores that step inside its outcome
event (schema/0017): one history row fewer, and the same history for every reader.

Each test asserts what the APIs show (the events, their order, their seqs, the
run's output or error), what `shardq.events` shows SQL readers (the same rows),
and that the table holds one row fewer than the events, which is the saving.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry
from shardq.workflow.retry import RetryPolicy

from ..support import rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
in_step = threading.Event()
let_go = threading.Event()


@registry.workflow("fold_waits_then_steps")
def fold_waits_then_steps(ctx: WorkflowContext) -> Any:
    first = ctx.step("first", lambda: "A")
    go = ctx.wait_for_signal("go")
    return [first, go, ctx.step("second", lambda: {"n": 2}), ctx.step("third", lambda: 3)]


@registry.workflow("fold_then_raises")
def fold_then_raises(ctx: WorkflowContext) -> None:
    ctx.step("fine", lambda: "kept")
    raise ValueError("order total is negative")


@registry.workflow("fold_cancelled_in_step")
def fold_cancelled_in_step(ctx: WorkflowContext) -> str:
    def slow() -> str:
        in_step.set()
        let_go.wait(10)
        return "done anyway"

    return ctx.step("slow", slow)


@registry.workflow("fold_step_fails")
def fold_step_fails(ctx: WorkflowContext) -> None:
    def boom() -> None:
        raise RuntimeError("declined")

    ctx.step("charge", boom, retry=RetryPolicy(max_attempts=1))


def _events(client: Client, run: str) -> list[tuple[int, int | None, str, str, Any]]:
    return [(e.seq, e.position, e.kind, e.name, e.payload) for e in client.history(run)]


def _sql_views(shard_map: ShardMap, run: str) -> tuple[list[tuple[Any, ...]], int]:
    """(shardq.events' rows of the run in seq order, the run's rows in shardq.history)."""
    url = shard_map.for_execution(run).url
    events = rows(url, "SELECT seq, position, kind, name, payload FROM shardq.events "
                       "WHERE execution_id = %s ORDER BY seq", run)
    (stored,) = rows(url, "SELECT count(*) FROM shardq.history WHERE execution_id = %s", run)
    return events, stored[0]


def test_the_last_step_rides_in_the_outcome_and_reads_as_its_own_event(
    client: Client, start_worker: StartWorker, shard_map: ShardMap
) -> None:
    start_worker(registry)
    run = str(client.start("fold_waits_then_steps", "fold-1").execution_id)
    wait_until(lambda: client.get(run).state is State.WAITING, what="the run parks")
    client.signal(run, "go", {"ok": True})
    done = client.wait(run, timeout=15)

    assert done.output == ["A", {"ok": True}, {"n": 2}, 3]
    events = _events(client, run)
    assert [(p, k, n) for _, p, k, n, _ in events] == [
        (0, "step.completed", "first"), (1, "signal.waiting", "go"),
        (None, "signal.received", "go"), (1, "signal.consumed", "go"),
        (2, "step.completed", "second"), (3, "step.completed", "third"),
        (None, "run.completed", "run"),
    ]
    assert events[5][4] == {"result": 3}
    assert events[6][4] == {"output": ["A", {"ok": True}, {"n": 2}, 3]}
    seqs = [seq for seq, *_ in events]
    assert seqs == sorted(set(seqs)), "every event has a seq of its own, in history order"
    sql_events, stored = _sql_views(shard_map, run)
    assert sql_events == events
    assert stored == len(events) - 1


def test_a_run_failing_after_its_last_step_keeps_the_step_and_its_error(
    client: Client, start_worker: StartWorker, shard_map: ShardMap
) -> None:
    start_worker(registry)
    run = str(client.start("fold_then_raises", "fold-2").execution_id)
    done = client.wait(run, timeout=15)

    assert done.state is State.FAILED
    assert done.error is not None and done.error["message"] == "order total is negative"
    events = _events(client, run)
    assert [(p, k, payload.get("result")) for _, p, k, _, payload in events] == [
        (0, "step.completed", "kept"), (None, "run.failed", None),
    ]
    assert events[1][4] == {"error": done.error}
    assert _sql_views(shard_map, run) == (events, 1)


def test_a_run_cancelled_during_its_last_step_keeps_the_step_in_its_history(
    client: Client, start_worker: StartWorker, shard_map: ShardMap
) -> None:
    in_step.clear()
    let_go.clear()
    start_worker(registry)
    run = str(client.start("fold_cancelled_in_step", "fold-3").execution_id)
    assert in_step.wait(10), "the step never started"
    client.cancel(run)
    let_go.set()
    done = client.wait(run, timeout=15)

    # The commit said completed; the store made it cancelled and kept the step.
    assert done.state is State.CANCELLED and done.output is None
    events = _events(client, run)
    assert [(p, k, n, payload) for _, p, k, n, payload in events] == [
        (0, "step.completed", "slow", {"result": "done anyway"}),
        (None, "run.cancelled", "run", {}),
    ]
    assert _sql_views(shard_map, run) == (events, 1)


def test_a_turn_ending_in_a_failed_step_is_stored_as_before(
    client: Client, start_worker: StartWorker, shard_map: ShardMap
) -> None:
    start_worker(registry)
    run = str(client.start("fold_step_fails", "fold-4").execution_id)
    assert client.wait(run, timeout=15).state is State.FAILED
    events = _events(client, run)
    assert [(p, k) for _, p, k, _, _ in events] == [
        (0, "step.failed"), (None, "run.failed"),
    ]
    assert _sql_views(shard_map, run) == (events, 2)
