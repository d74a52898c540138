"""The engine through an in-process worker: steps, retries, timers, failures, replay."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument, NotSerializable, StepFailed, UnknownWorkflow
from shardq.core.models import Execution, StartResult, State
from shardq.shards.config import Shard
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry
from shardq.workflow.retry import RetryPolicy

from ..support import all_rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
calls: Counter[str] = Counter()
_lock = threading.Lock()


def count(key: str) -> int:
    with _lock:
        calls[key] += 1
        return calls[key]


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def finish(client: Client, execution_id: object, timeout: float = 15) -> Execution:
    return client.wait(str(execution_id), timeout=timeout)


def history_kinds(client: Client, execution_id: object) -> list[tuple[int | None, str, str]]:
    return [(e.position, e.kind, e.name) for e in client.history(str(execution_id))]


# -- workflows ---------------------------------------------------------------


@registry.workflow("three_steps")
def three_steps(ctx: WorkflowContext) -> list[Any]:
    a = ctx.step("a", lambda: count("a") and "A")
    b = ctx.step("b", lambda x: {"got": x, "tuple": (1, 2)}, a)
    c = ctx.step("c", lambda: count("c"))
    return [a, b, c]


@registry.workflow("flaky")
def flaky(ctx: WorkflowContext) -> str:
    def sometimes() -> str:
        if count("flaky") < 3:
            raise ConnectionError("payment provider timed out")
        return "ok"

    policy = RetryPolicy(max_attempts=5, initial_backoff=0.2, multiplier=1.5, jitter=0.0)
    return ctx.step("charge", sometimes, retry=policy)


@registry.workflow("once")
def once(ctx: WorkflowContext) -> str:
    def boom() -> str:
        count("once")
        raise RuntimeError("declined")

    try:
        ctx.step("charge", boom, retry=1)
    except StepFailed as exc:
        return f"caught {exc.error_type}: {exc.error_message} after {exc.attempts}"
    return "unreachable"


@registry.workflow("non_retryable")
def non_retryable(ctx: WorkflowContext) -> None:
    def bad() -> None:
        count("non_retryable")
        raise KeyError("sku-missing")

    ctx.step("lookup", bad, retry=RetryPolicy(max_attempts=5, non_retryable=(KeyError,)))


@registry.workflow("raises")
def raises(ctx: WorkflowContext) -> None:
    ctx.step("fine", lambda: 1)
    raise ValueError("order total is negative")


@registry.workflow("outlives_its_lease")
def outlives_its_lease(ctx: WorkflowContext) -> str:
    def slow() -> str:
        count("outlives_its_lease")
        time.sleep(3.0)  # twice the test's lease
        return "done"

    return ctx.step("slow", slow)


@registry.workflow("exits")
def exits(ctx: WorkflowContext) -> None:
    if ctx.input == "step":
        ctx.step("quit", lambda: sys.exit(3))
    sys.exit("the workflow asked the process to exit")


@registry.workflow("unserialisable_step")
def unserialisable_step(ctx: WorkflowContext) -> None:
    ctx.step("makes_object", object)


@registry.workflow("unserialisable_output")
def unserialisable_output(ctx: WorkflowContext) -> object:
    return {1, 2}


@registry.workflow("sleeper")
def sleeper(ctx: WorkflowContext) -> str:
    ctx.sleep("nap", float(ctx.input["seconds"]))
    return ctx.now().isoformat()


@registry.workflow("bad_sleep")
def bad_sleep(ctx: WorkflowContext) -> None:
    ctx.sleep("never", 0)


@registry.workflow("deterministic")
def deterministic(ctx: WorkflowContext) -> dict[str, Any]:
    drawn = [str(ctx.uuid()), ctx.random.random(), ctx.now().isoformat()]
    # The step records the first turn's values; the turn after the timer
    # replays the draws and must get the same ones.
    first_turn = ctx.step("remember", lambda: drawn)
    ctx.sleep("pause", 0.2)
    return {"first_turn": first_turn, "replayed": drawn, "after": str(ctx.uuid())}


@registry.workflow("timed_step")
def timed_step(ctx: WorkflowContext) -> None:
    import time

    ctx.step("slow", time.sleep, 2, timeout=0.2, retry=2)


# -- tests ---------------------------------------------------------------------


def test_steps_run_once_and_results_round_trip_json(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("three_steps", "order-1")
    done = finish(client, run.execution_id)
    assert done.state is State.COMPLETED
    assert done.output == ["A", {"got": "A", "tuple": [1, 2]}, 1]
    assert calls["a"] == 1 and calls["c"] == 1
    assert history_kinds(client, run.execution_id) == [
        (0, "step.completed", "a"), (1, "step.completed", "b"), (2, "step.completed", "c"),
        (None, "run.completed", "run"),
    ]
    assert done.finished_at is not None


def test_start_is_idempotent_on_workflow_id(client: Client, start_worker: StartWorker) -> None:
    first = client.start("three_steps", "order-7", {"n": 1})
    again = client.start("three_steps", "order-7", {"n": 2})
    assert first.created and not again.created
    assert again.execution_id == first.execution_id
    other_tenant = client.start("three_steps", "order-7", tenant="acme")
    assert other_tenant.created and other_tenant.execution_id != first.execution_id
    assert client.get(first.execution_id).input == {"n": 1}


def test_a_big_start_many_commits_every_shard_and_stays_idempotent(client: Client) -> None:
    keys = [(f"bulk-{i}", {"i": i}) for i in range(1_200)]  # the shards insert at once
    first = client.start_many("three_steps", keys)
    assert all(r.created for r in first)
    per_shard = all_rows(client.map, "SELECT count(*) FROM shardq.tasks")
    assert sum(n for (n,) in per_shard) == 1_200 and all(n > 0 for (n,) in per_shard)
    again = client.start_many("three_steps", [*keys[::-1], ("bulk-new", None)])
    assert [r.created for r in again] == [False] * 1_200 + [True]
    assert [r.execution_id for r in again[:-1]] == [r.execution_id for r in first[::-1]]
    assert client.get(first[7].execution_id).input == {"i": 7}


def test_bad_starts_are_refused_with_clear_errors(client: Client) -> None:
    with pytest.raises(UnknownWorkflow, match="unknown workflow 'nope'"):
        client.start("nope", "x")
    with pytest.raises(NotSerializable, match="input of three_steps 'x'"):
        client.start("three_steps", "x", {"when": datetime.now()})
    with pytest.raises(InvalidArgument, match="workflow_id"):
        client.start("three_steps", "")
    assert all_rows(client.map, "SELECT count(*) FROM shardq.executions") == [(0,), (0,)]


def test_retries_wait_on_durable_timers(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    run = client.start("flaky", "charge-1")
    # Between attempts the run holds no lease and its task is due in the future.
    wait_until(lambda: calls["flaky"] >= 1, what="first attempt")
    wait_until(
        lambda: all_rows(client.map,
                         "SELECT 1 FROM shardq.tasks WHERE lease_token IS NULL AND run_at > now()"),
        what="a retry timer",
    )
    done = finish(client, run.execution_id)
    assert done.state is State.COMPLETED and done.output == "ok"
    failures = [e for e in client.history(run.execution_id) if e.kind == "step.failed"]
    assert [f.payload["attempt"] for f in failures] == [1, 2]
    assert failures[0].payload["error"]["type"] == "ConnectionError"
    assert failures[0].payload["retry_in"] == pytest.approx(0.2)
    assert failures[1].payload["retry_in"] == pytest.approx(0.3)
    assert calls["flaky"] == 3


def test_retry_one_runs_once_and_the_failure_reaches_the_workflow(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("once", "o-1")
    done = finish(client, run.execution_id)
    assert done.output == "caught RuntimeError: declined after 1"
    assert calls["once"] == 1


def test_non_retryable_error_fails_the_run(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    run = client.start("non_retryable", "n-1")
    done = finish(client, run.execution_id)
    assert done.state is State.FAILED
    assert done.error is not None and done.error["type"] == "StepFailed"
    assert "step 'lookup' failed after 1 attempt(s): KeyError" in done.error["message"]
    assert calls["non_retryable"] == 1
    assert all_rows(client.map, "SELECT count(*) FROM shardq.tasks") == [(0,), (0,)]


def test_workflow_raising_fails_the_run(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    run = client.start("raises", "r-1")
    done = finish(client, run.execution_id)
    assert done.state is State.FAILED
    assert done.error is not None
    assert (done.error["type"], done.error["message"]) == ("ValueError", "order total is negative")
    assert "Traceback" in done.error["traceback"]
    assert history_kinds(client, run.execution_id) == [
        (0, "step.completed", "fine"), (None, "run.failed", "run"),
    ]


def test_results_that_are_not_json_are_clear_errors(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    step = finish(client, client.start("unserialisable_step", "u-1").execution_id)
    assert step.state is State.FAILED and step.error is not None
    assert "step 'makes_object' returned object, which is not JSON-serialisable" in (
        step.error["message"]
    )
    output = finish(client, client.start("unserialisable_output", "u-2").execution_id)
    assert output.state is State.FAILED and output.error is not None
    assert output.error["type"] == "NotSerializable"
    assert "workflow returned set" in output.error["message"]


def test_sleep_of_zero_is_refused_at_the_call(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    done = finish(client, client.start("bad_sleep", "z-1").execution_id)
    assert done.state is State.FAILED and done.error is not None
    assert done.error["type"] == "InvalidArgument"
    assert "seconds must be a positive number, got 0" in done.error["message"]


def test_year_long_sleep_is_one_row(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    year = 365 * 24 * 3600
    run = client.start("sleeper", "y-1", {"seconds": year})
    wait_until(lambda: client.get(run.execution_id).state is State.WAITING, what="parked")
    shard = client.map.for_execution(run.execution_id)
    from ..support import rows

    ((days, kind, deadline_days),) = rows(
        shard.url,
        "SELECT extract(epoch FROM t.run_at - now()) / 86400, w.kind, "
        "extract(epoch FROM w.deadline - now()) / 86400 "
        "FROM shardq.tasks t JOIN shardq.waits w USING (execution_id) "
        "WHERE t.execution_id = %s",
        run.execution_id,
    )
    assert kind == "timer"
    assert 364.9 < float(days) <= 365 and 364.9 < float(deadline_days) <= 365
    (started,) = [e for e in client.history(run.execution_id) if e.kind == "sleep.started"]
    assert started.payload["seconds"] == year


def test_short_sleep_wakes_on_the_database_clock(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry, poll_interval_s=60.0)
    run = client.start("sleeper", "s-1", {"seconds": 0.5})
    done = finish(client, run.execution_id)
    assert done.state is State.COMPLETED
    (started,) = [e for e in client.history(run.execution_id) if e.kind == "sleep.started"]
    woke = datetime.fromisoformat(done.output)
    assert woke >= datetime.fromisoformat(started.payload["wake_at"])
    assert (woke - datetime.fromisoformat(started.payload["wake_at"])).total_seconds() < 2


def test_replay_returns_the_same_time_and_randomness(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("deterministic", "d-1")
    done = finish(client, run.execution_id)
    assert done.state is State.COMPLETED
    assert done.output["replayed"] == done.output["first_turn"]
    assert done.output["after"] != done.output["first_turn"][0]
    clock = [e for e in client.history(run.execution_id) if e.kind == "now.read"]
    assert len(clock) == 1 and clock[0].payload["at"] == done.output["first_turn"][2]
    other = finish(client, client.start("deterministic", "d-2").execution_id)
    assert other.output["first_turn"][0] != done.output["first_turn"][0]


def test_step_timeout_bounds_each_attempt(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    done = finish(client, client.start("timed_step", "t-1").execution_id, timeout=20)
    assert done.state is State.FAILED and done.error is not None
    assert "StepTimeout" in done.error["message"]
    failures = [e for e in client.history(done.id) if e.kind == "step.failed"]
    assert [f.payload["attempt"] for f in failures] == [1, 2]


running = {"now": 0, "most": 0}
gate = threading.Event()


@registry.workflow("gated")
def gated(ctx: WorkflowContext) -> str:
    def hold() -> str:
        with _lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        gate.wait(10)
        with _lock:
            running["now"] -= 1
        return "done"

    return ctx.step("hold", hold)


def _gated_runs(client: Client, start_worker: StartWorker, *, runs: int, concurrency: int,
                batch_size: int) -> list[StartResult]:
    """Start a worker and `runs` gated runs; wait until as many turns as can hold the gate."""
    running.update(now=0, most=0)
    gate.clear()
    start_worker(registry, concurrency=concurrency, batch_size=batch_size)
    started = client.start_many("gated", [(f"g{concurrency}-{i}", None) for i in range(runs)])
    holding = min(runs, concurrency)
    try:
        wait_until(lambda: running["now"] == holding, what=f"{holding} turns running at once")
    except BaseException:
        gate.set()
        raise
    return started


def test_concurrency_bounds_the_turns_running_at_once(
    client: Client, start_worker: StartWorker
) -> None:
    runs = _gated_runs(client, start_worker, runs=12, concurrency=3, batch_size=10)
    # Nothing beyond the three running turns is leased: the rest stay claimable.
    leased = "SELECT count(*) FROM shardq.tasks WHERE lease_token IS NOT NULL"
    assert sum(n for (n,) in all_rows(client.map, leased)) == 3
    gate.set()
    assert all(finish(client, r.execution_id).output == "done" for r in runs)
    assert running["most"] == 3


def test_a_claimed_batch_of_blocking_turns_reaches_every_turn_thread(
    client: Client, start_worker: StartWorker
) -> None:
    # Idle turn threads are woken one at a time, each waking the next while work
    # is left: blocking steps must still end up on all of them.
    runs = _gated_runs(client, start_worker, runs=16, concurrency=16, batch_size=16)
    gate.set()
    assert all(finish(client, r.execution_id).output == "done" for r in runs)


def _workflow_id_on(client: Client, shard_index: int, workflow: str, prefix: str) -> str:
    """A workflow_id whose run routes to the shard at `shard_index`."""
    target = client.map.shards[shard_index]
    return next(
        key for key in (f"{prefix}-{i}" for i in range(10_000))
        if client.map.for_bucket(bucket_for("default", workflow, key)) == target
    )


def test_a_due_run_starts_while_a_turn_thread_is_idle_on_every_shard(
    client: Client, start_worker: StartWorker
) -> None:
    # Six of ten turn threads held by long steps: four are idle, fewer than half
    # a batch. A claim loop that waited for half a batch of free threads left due
    # runs unclaimed until the safety poll (30 s here), on whichever shard.
    _gated_runs(client, start_worker, runs=6, concurrency=10, batch_size=10)
    try:
        quick = [
            client.start("three_steps", _workflow_id_on(client, i, "three_steps", "idle"))
            for i in range(len(client.map.shards))
        ]
        done = [finish(client, r.execution_id, timeout=5) for r in quick]
        assert [d.state for d in done] == [State.COMPLETED] * len(quick)
        assert running["now"] == 6, "the long steps were still holding their threads"
    finally:
        gate.set()


def test_a_claim_never_asks_for_a_negative_batch(pools: ShardPools) -> None:
    # Turns claimed while commits were settling can take the unsettled commits
    # past commit_batch; the free slots are then negative, and a claim of
    # LIMIT -n made the database refuse it and ended the claim loop.
    worker = Worker(Store(pools), registry, config=WorkerConfig(concurrency=10, commit_batch=20))
    shard = pools.map.shards[0]
    worker._settling = 25
    assert worker._reserve(shard, None, True) == (0, None)
    assert shard.name in worker._starved


class HeartbeatCancelledOnce(Store):
    """The first heartbeat is cancelled by the server (as a statement_timeout would)."""

    def __init__(self, pools: ShardPools) -> None:
        super().__init__(pools)
        self.beats = 0

    def extend_leases(self, shard: Shard, leases: Any, lease_s: float) -> set[uuid.UUID]:
        self.beats += 1
        if self.beats == 1:
            raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        return super().extend_leases(shard, leases, lease_s)


def test_a_failed_heartbeat_is_retried_and_the_lease_held(
    client: Client, pools: ShardPools
) -> None:
    """A heartbeat error other than a lost connection used to end the heartbeat
    thread: the worker went on claiming while its leases expired under its
    turns, and the same worker re-claimed the run and ran its step again."""
    store = HeartbeatCancelledOnce(pools)
    worker = Worker(store, registry, config=WorkerConfig(
        lease_s=1.5, poll_interval_s=0.2, drain_timeout_s=5.0)).start()
    try:
        run = client.start("outlives_its_lease", "heartbeat-1").execution_id
        assert finish(client, run).output == "done"
        assert calls["outlives_its_lease"] == 1
        assert store.beats >= 3  # it kept beating after the failure
    finally:
        worker.stop()


@pytest.mark.parametrize("where", ["workflow", "step"])
def test_sys_exit_in_workflow_code_fails_the_run_and_the_turn_thread_lives_on(
    client: Client, start_worker: StartWorker, where: str
) -> None:
    """A SystemExit let through ended its turn thread silently; every retry of the
    run took one more, and this one-thread worker ran nothing after the first."""
    start_worker(registry, concurrency=1, lease_s=1.0)
    first = finish(client, client.start("exits", f"exits-{where}", where).execution_id)
    assert first.state is State.FAILED
    assert first.error is not None and first.error["type"] == "SystemExit"
    after = finish(client, client.start("three_steps", f"after-exit-{where}").execution_id)
    assert after.state is State.COMPLETED
