"""Races on one run's locks, made to happen by holding a lock from a second connection.

Senders, cancellers and workers lock a run's task row, then its executions row,
each set in id order. These tests hold one of those locks on a connection of
their own, so the interleaving a review found by reading the code happens on
every run instead of once in thousands.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shardq.client.client import Client
from shardq.core.models import ExternalRequest, State, TaskAction, TurnCommit
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import in_thread, key_on, keys_on, rows, wait_until, waiting_on_a_lock

StartWorker = Callable[..., Worker]
registry = Registry()
step_entered = threading.Event()
step_release = threading.Event()
effects: list[str] = []


@registry.workflow("lock_receiver")
def lock_receiver(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go")


@registry.workflow("lock_sender")
def lock_sender(ctx: WorkflowContext) -> list[bool]:
    """Signal the targets in the order given, all in this turn's one commit."""
    return [ctx.signal_external(t, "go", "from-sender").delivered for t in ctx.input["targets"]]


@registry.workflow("lock_effect")
def lock_effect(ctx: WorkflowContext) -> Any:
    ctx.wait_for_signal("go")
    return ctx.step("effect", _effect)


def _effect() -> str:
    step_entered.set()
    step_release.wait(10)
    effects.append("done")
    return "done"


def _parked(client: Client, run: uuid.UUID) -> bool:
    return client.get(run).state is State.WAITING


def _deadlocks(url: str) -> int:
    return int(rows(url, "SELECT deadlocks FROM pg_stat_database "
                         "WHERE datname = current_database()")[0][0])


def test_a_batch_of_same_shard_sends_locks_its_targets_in_id_order(
    client: Client, pools: ShardPools, start_worker: StartWorker
) -> None:
    """A group commit whose first turn signals T_high and second T_low, against a
    client's signal to [T_low, T_high] that took T_low's lock first: the batch
    must wait for T_low before it takes T_high, or the two deadlock."""
    shard = client.map.shards[0]
    store = Store(pools)
    started = [client.start("lock_receiver", key_on(client.map, 0, "lock_receiver", f"r{i}"))
               for i in range(2)]
    low, high = sorted(s.execution_id for s in started)
    worker = start_worker(registry, poll_interval_s=60.0)
    for run in (low, high):
        wait_until(functools.partial(_parked, client, run), what="parked")
    worker.stop()
    senders = [client.start("lock_sender", key_on(client.map, 0, "lock_sender", f"s{i}"),
                            {"targets": []}).execution_id for i in range(2)]
    claims, _ = store.claim(shard, owner="test", limit=10, lease_s=30)
    assert sorted(c.execution_id for c in claims) == sorted(senders)
    batch = [
        TurnCommit(claim.execution_id, claim.lease_token, state=State.COMPLETED,
                   output_json="null", task=TaskAction.DELETE,
                   externals=[ExternalRequest(0, target, "go", '"from-batch"', None)])
        for claim, target in zip(claims, (high, low), strict=True)
    ]
    deadlocks_before = _deadlocks(shard.url)
    with psycopg.connect(shard.url) as holder:
        # The client's statement, its first lock taken before the batch's.
        holder.execute("SELECT 1 FROM shardq.executions WHERE id = %s FOR UPDATE", [low])
        committer, outcome = in_thread(lambda: store.commit_turns(shard, batch, lease_s=30))
        wait_until(lambda: waiting_on_a_lock(shard.url, holder.info.backend_pid),
                   what="the batch waiting on a target's lock")
        # The rest of the client's statement: were the batch holding T_high while
        # it waits for T_low, this would close a cycle one of the two loses.
        holder.execute(
            "SELECT 1 FROM shardq.deliver_signals('default', %s, %s, %s, %s, 10, 10, "
            "NULL::text[])",
            [[low, high], ["go", "go"], [Jsonb("from-client")] * 2, [None, None]],
        ).fetchall()
        holder.commit()
    committer.join(15)
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert all(o.landed for o in outcome[0].values())
    for run in (low, high):
        assert rows(shard.url, "SELECT payload FROM shardq.signals WHERE execution_id = %s "
                               "ORDER BY id", run) == [("from-client",), ("from-batch",)]
    # Stats reach pg_stat_database within a second of a transaction's end.
    time.sleep(1.2)
    assert _deadlocks(shard.url) == deadlocks_before


def test_cancel_sees_a_lease_taken_while_it_waited_for_the_run(
    client: Client, start_worker: StartWorker
) -> None:
    """cancel reads the task row (none: the run is parked), then waits for the
    executions row; meanwhile a signal makes the run due and a worker claims it.
    cancel must see that lease: end the run at the worker's commit, the step's
    result kept, not cancel it under a working turn."""
    shard = client.map.shards[0]
    step_entered.clear()
    step_release.clear()
    effects.clear()
    run = client.start("lock_effect", key_on(client.map, 0, "lock_effect", "c")).execution_id
    worker = start_worker(registry, poll_interval_s=0.2)
    wait_until(lambda: client.get(run).state is State.WAITING, what="parked")
    worker.stop()
    outcome: list[State | BaseException] = []
    with psycopg.connect(shard.url) as holder:
        holder.execute("SELECT 1 FROM shardq.executions WHERE id = %s FOR UPDATE", [run])

        def cancel() -> None:
            try:
                outcome.append(client.cancel(run))
            except BaseException as exc:
                outcome.append(exc)

        canceller = threading.Thread(target=cancel)
        canceller.start()
        wait_until(lambda: waiting_on_a_lock(shard.url, holder.info.backend_pid),
                   what="cancel waiting for the run's lock")
        # What a sender that committed between cancel's two reads leaves: the
        # signal, its history event, and the run due again.
        with psycopg.connect(shard.url, autocommit=True) as sender:
            signal_id = sender.execute(
                "INSERT INTO shardq.signals (execution_id, tenant, name, payload) "
                "VALUES (%s, 'default', 'go', '1') RETURNING id", [run]).fetchone()
            assert signal_id is not None
            sender.execute(
                "INSERT INTO shardq.history (execution_id, position, kind, name, payload) "
                "VALUES (%s, NULL, 'signal.received', 'go', jsonb_build_object('signal_id', "
                "%s::bigint))", [run, signal_id[0]])
            sender.execute("INSERT INTO shardq.tasks (execution_id, run_at, claims) "
                           "VALUES (%s, now(), 1)", [run])
        start_worker(registry, poll_interval_s=0.2)
        assert step_entered.wait(10), "the worker never ran the step"
        holder.rollback()
    canceller.join(10)
    assert outcome and not isinstance(outcome[0], BaseException), outcome
    step_release.set()
    finished = client.wait(run, timeout=10)
    assert finished.state is State.CANCELLED
    assert outcome == [State.RUNNING]
    assert effects == ["done"]
    kinds = [e.kind for e in client.history(run)]
    # The step's result is recorded before the run ends: it will never run again.
    assert kinds.index("step.completed") < kinds.index("run.cancelled"), kinds


def test_a_batch_that_finishes_its_runs_deletes_their_task_rows_in_id_order(
    client: Client, pools: ShardPools
) -> None:
    """A batch whose every commit ends its run is fenced by deleting its task rows
    (shardq.finish_tasks). A sender holding T_low's task row and then asking for
    T_high's must find T_high free: the batch waits for T_low before it touches
    T_high, although T_high lies first in the heap, where a sequential or bitmap
    scan of a small table would reach it first."""
    shard = client.map.shards[0]
    store = Store(pools)
    low, high = sorted(client.start("lock_receiver", key).execution_id
                       for key in keys_on(client.map, 0, "lock_receiver", "finish", 2))
    claims, _ = store.claim(shard, owner="test", limit=10, lease_s=30)
    assert sorted(c.execution_id for c in claims) == [low, high]
    # A new version of T_low's row goes after T_high's in the heap, and the table
    # is analyzed as autovacuum leaves a small one: planned freely, its DELETE
    # would scan the heap (the statistics of a table just truncated hide that).
    rows(shard.url, "UPDATE shardq.tasks SET claims = claims WHERE execution_id = %s "
                    "RETURNING 1", low)
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("ANALYZE shardq.tasks")
    assert [r[0] for r in rows(shard.url, "SELECT execution_id FROM shardq.tasks "
                                          "WHERE execution_id = ANY(%s) ORDER BY ctid",
                               [low, high])] == [high, low]
    batch = [TurnCommit(c.execution_id, c.lease_token, state=State.COMPLETED, output_json="1",
                        task=TaskAction.DELETE) for c in claims]
    deadlocks_before = _deadlocks(shard.url)
    with psycopg.connect(shard.url) as holder:
        holder.execute("SET lock_timeout = '5s'")
        holder.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s FOR UPDATE", [low])
        committer, outcome = in_thread(lambda: store.commit_turns(shard, batch, lease_s=30))
        wait_until(lambda: waiting_on_a_lock(shard.url, holder.info.backend_pid),
                   what="the batch waiting on T_low's task row")
        holder.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s FOR UPDATE", [high])
        holder.commit()
    committer.join(15)
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert {run: o.landed for run, o in outcome[0].items()} == {low: True, high: True}
    for run in (low, high):
        assert client.get(run).state is State.COMPLETED
    assert rows(shard.url, "SELECT count(*) FROM shardq.tasks WHERE execution_id = ANY(%s)",
                [low, high]) == [(0,)]
    time.sleep(1.2)
    assert _deadlocks(shard.url) == deadlocks_before
