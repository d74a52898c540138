"""The store seam on real shards: claims, timers, fencing, retried commits, listing."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from shardq.client.client import Client
from shardq.core.models import Event, NewEvent, OpenWait, State, TaskAction, TurnCommit
from shardq.shards.config import Shard, ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.params import Lease
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import age, all_rows, rows

StartWorker = Callable[..., Worker]
registry = Registry()


@registry.workflow("job")
def job(ctx: WorkflowContext) -> Any:
    return ctx.step("run", lambda: ctx.input)


def _shard_of(client: Client, execution_id: uuid.UUID) -> Shard:
    return client.map.for_execution(execution_id)


def _timer_commit(execution_id: uuid.UUID, token: uuid.UUID, seconds: float) -> TurnCommit:
    return TurnCommit(
        execution_id, token,
        events=[NewEvent(0, Event.TIMER_STARTED, "t", {"seconds": seconds}, wake_in=seconds)],
        state=State.WAITING, task=TaskAction.SCHEDULE, delay=seconds,
    )


def _park_on_go(execution_id: uuid.UUID, token: uuid.UUID) -> TurnCommit:
    """The commit a turn makes when its run starts waiting for signal `go`."""
    return TurnCommit(
        execution_id, token,
        events=[NewEvent(0, Event.SIGNAL_WAITING, "go", {"timeout": None})],
        state=State.WAITING, task=TaskAction.DELETE, wake_on_signals=("go",),
        open_wait=OpenWait(0, "signal", "go"),
    )


def test_timer_is_not_claimable_before_its_wake_time(client: Client, store: Store) -> None:
    run = client.start("job", "timer-1")
    shard = _shard_of(client, run.execution_id)
    (claim,) = store.claim(shard, owner="test", limit=10, lease_s=30)[0]
    store.commit_turns(shard, [_timer_commit(run.execution_id, claim.lease_token, 1.0)],
                       lease_s=30)
    ((remaining,),) = rows(
        shard.url, "SELECT extract(epoch FROM run_at - now())::float8 FROM shardq.tasks"
    )
    time.sleep(max(0.0, remaining - 0.15))
    assert store.claim(shard, owner="test", limit=10, lease_s=30)[0] == []
    time.sleep(0.2)
    (again,) = store.claim(shard, owner="test", limit=10, lease_s=30)[0]
    (started,) = [e for e in again.history if e.kind == Event.TIMER_STARTED]
    from datetime import datetime

    assert again.db_now >= datetime.fromisoformat(started.payload["wake_at"])
    assert again.lease_token != claim.lease_token


def test_a_delay_counts_from_when_the_turn_chose_it_not_from_its_commit(
    client: Client, store: Store
) -> None:
    """A turn parked its run for 10 s, and its commit reached the database 4 s later (a
    completer's queue): the run is due 6 s after the commit, when the turn meant it."""
    run = client.start("job", "delay-1")
    shard = _shard_of(client, run.execution_id)
    (claim,) = store.claim(shard, owner="test", limit=10, lease_s=30)[0]
    backoff = TurnCommit(run.execution_id, claim.lease_token, state=State.PENDING,
                         task=TaskAction.SCHEDULE, delay=10.0,
                         decided_at=time.monotonic() - 4.0)
    store.commit_turns(shard, [backoff], lease_s=30)
    ((remaining,),) = rows(
        shard.url, "SELECT extract(epoch FROM run_at - now())::float8 FROM shardq.tasks")
    assert 5.5 < remaining <= 6.0


def test_a_timer_chosen_before_its_commit_queued_wakes_when_its_task_is_due(
    client: Client, store: Store
) -> None:
    """The timer's recorded wake_at and its task's due time count from the same moment,
    the turn's: a run claimed when due finds its timer done, with no extra turn."""
    run = client.start("job", "delay-2")
    shard = _shard_of(client, run.execution_id)
    (claim,) = store.claim(shard, owner="test", limit=10, lease_s=30)[0]
    timer = dataclasses.replace(_timer_commit(run.execution_id, claim.lease_token, 10.0),
                                decided_at=time.monotonic() - 4.0)
    store.commit_turns(shard, [timer], lease_s=30)
    ((due, wake),) = rows(shard.url, "SELECT extract(epoch FROM t.run_at - now())::float8, "
                          "extract(epoch FROM (h.payload->>'wake_at')::timestamptz - now())"
                          "::float8 FROM shardq.tasks t JOIN shardq.history h USING "
                          "(execution_id) WHERE h.kind = %s", Event.TIMER_STARTED)
    assert 5.5 < due <= 6.0 and abs(wake - due) < 0.01


def test_expired_lease_is_reclaimed_and_the_old_holder_is_fenced(
    client: Client, store: Store
) -> None:
    run = client.start("job", "lease-1")
    shard = _shard_of(client, run.execution_id)
    (first,) = store.claim(shard, owner="a", limit=1, lease_s=30)[0]
    assert store.claim(shard, owner="b", limit=1, lease_s=30)[0] == []
    age(client.map, "tasks", "leased_until", 31)  # the lease expired a second ago
    (second,) = store.claim(shard, owner="b", limit=1, lease_s=30)[0]
    assert second.claims == 2
    late = TurnCommit(run.execution_id, first.lease_token,
                      events=[NewEvent(0, Event.STEP_COMPLETED, "run", {"result": "a"})],
                      state=State.COMPLETED, output_json='"a"', task=TaskAction.DELETE)
    outcome = store.commit_turns(shard, [late], lease_s=30)
    assert outcome[run.execution_id].landed is False
    assert store.read_history(shard, run.execution_id) == []
    assert client.get(run.execution_id).state is State.RUNNING  # b holds it
    assert store.extend_leases(shard, [Lease(run.execution_id, first.lease_token)], 30) == set()
    assert store.extend_leases(shard, [Lease(run.execution_id, second.lease_token)], 30) == {
        run.execution_id
    }


def test_a_batch_writes_the_commits_that_hold_their_lease_and_nothing_of_the_others(
    client: Client, store: Store, shard_map: ShardMap
) -> None:
    shard = shard_map.shards[0]
    runs = []
    for i in range(200):  # until three runs land on the first shard
        run = client.start("job", f"mixed-{i}")
        if _shard_of(client, run.execution_id) == shard:
            runs.append(run)
        if len(runs) == 3:
            break
    held, lost, parked = (r.execution_id for r in runs)
    claims = {c.execution_id: c for c in store.claim(shard, owner="a", limit=3, lease_s=30)[0]}
    stolen = uuid.uuid4()  # another worker took `lost` over
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("UPDATE shardq.tasks SET lease_token = %s WHERE execution_id = %s",
                     (stolen, lost))

    def done(execution_id: uuid.UUID) -> TurnCommit:
        return TurnCommit(execution_id, claims[execution_id].lease_token,
                          events=[NewEvent(0, Event.STEP_COMPLETED, "run", {"result": 1})],
                          state=State.COMPLETED, output_json="1", task=TaskAction.DELETE)

    outcome = store.commit_turns(
        shard, [done(held), done(lost), _park_on_go(parked, claims[parked].lease_token)],
        lease_s=30,
    )
    assert [outcome[i].landed for i in (held, lost, parked)] == [True, False, True]
    assert client.get(held).output == 1 and client.get(held).state is State.COMPLETED
    assert client.get(lost).state is State.RUNNING and store.read_history(shard, lost) == []
    assert rows(shard.url, "SELECT lease_token FROM shardq.tasks WHERE execution_id = %s",
                lost) == [(stolen,)]
    assert client.get(parked).state is State.WAITING
    assert rows(shard.url, "SELECT execution_id, name FROM shardq.waits") == [(parked, "go")]
    assert [e.kind for e in store.read_history(shard, parked)] == ["signal.waiting"]


def test_a_commit_that_landed_is_recognised_and_never_applied_twice(
    client: Client, store: Store
) -> None:
    """What the completer does when a connection breaks around COMMIT: ask, then retry the rest."""
    run = client.start("job", "retry-1")
    other = client.start("job", "retry-2")
    shard = _shard_of(client, run.execution_id)
    claims = {
        c.execution_id: c
        for s in client.map.shards
        for c in store.claim(s, owner="a", limit=10, lease_s=30)[0]
    }
    checkpoint = TurnCommit(run.execution_id, claims[run.execution_id].lease_token,
                            events=[NewEvent(0, Event.STEP_COMPLETED, "run", {"result": 1})],
                            state=State.RUNNING, task=TaskAction.KEEP)
    assert store.commit_turns(shard, [checkpoint], lease_s=30)[run.execution_id].landed
    assert store.landed_commits(shard, [checkpoint]) == {run.execution_id}
    # Applying it again (a blind retry) is fenced off: the token rotated.
    assert not store.commit_turns(shard, [checkpoint], lease_s=30)[run.execution_id].landed
    final = TurnCommit(run.execution_id, checkpoint.next_token, state=State.COMPLETED,
                       output_json="1", task=TaskAction.DELETE)
    assert store.landed_commits(shard, [final]) == set()
    assert store.commit_turns(shard, [final], lease_s=30)[run.execution_id].landed
    assert store.landed_commits(shard, [final]) == {run.execution_id}
    assert [(e.position, e.kind) for e in store.read_history(shard, run.execution_id)] == [
        (0, "step.completed"), (None, "run.completed")
    ]
    assert client.get(run.execution_id).output == 1
    assert client.get(other.execution_id).state is State.RUNNING  # claimed, nothing committed


def test_one_poisoned_commit_does_not_sink_its_batch(
    client: Client, shard_map: ShardMap, start_worker: StartWorker
) -> None:
    poison = Registry()

    @poison.workflow("job")
    def nul_result(ctx: WorkflowContext) -> Any:
        # PostgreSQL's jsonb cannot store NUL: the commit of this run is refused.
        return ctx.step("run", lambda: "nul\u0000" if ctx.workflow_id == "bad" else "fine")

    runs = client.start_many("job", [(f"ok-{i}", None) for i in range(20)] + [("bad", None)])
    start_worker(poison, concurrency=21, batch_size=21)
    done = {r.execution_id: client.wait(r.execution_id, timeout=15) for r in runs}
    states = {e.workflow_id: e.state for e in done.values()}
    assert states.pop("bad") is State.FAILED
    assert set(states.values()) == {State.COMPLETED}
    bad = next(e for e in done.values() if e.workflow_id == "bad")
    assert bad.error is not None and bad.error["type"] == "StoreRejected"


def test_parked_runs_are_not_claimed_and_claims_carry_history_and_signals(
    client: Client, store: Store
) -> None:
    run = client.start("job", "park-1")
    shard = _shard_of(client, run.execution_id)
    (claim,) = store.claim(shard, owner="a", limit=1, lease_s=30)[0]
    park = _park_on_go(run.execution_id, claim.lease_token)
    assert store.commit_turns(shard, [park], lease_s=30)[run.execution_id].landed
    assert store.claim(shard, owner="a", limit=10, lease_s=30)[0] == []
    client.signal(run.execution_id, "other", {"x": 1})
    assert store.claim(shard, owner="a", limit=10, lease_s=30)[0] == []
    client.signal(run.execution_id, "go", {"x": 2})
    (woken,) = store.claim(shard, owner="a", limit=10, lease_s=30)[0]
    assert [(e.position, e.kind) for e in woken.history] == [
        (0, "signal.waiting"), (None, "signal.received"), (None, "signal.received")
    ]
    assert [(s.name, s.payload) for s in woken.signals] == [("other", {"x": 1}), ("go", {"x": 2})]


def test_parking_races_a_signal_without_losing_the_wake_up(
    client: Client, store: Store, pools: ShardPools
) -> None:
    """The signal commits while the parking commit is in flight: the run stays due."""
    for attempt in range(20):
        run = client.start("job", f"race-{attempt}")
        shard = _shard_of(client, run.execution_id)
        (claim,) = store.claim(shard, owner="a", limit=1, lease_s=30)[0]
        park = _park_on_go(run.execution_id, claim.lease_token)
        barrier = threading.Barrier(2)

        def park_it(commit: TurnCommit, on: Shard, gate: threading.Barrier) -> None:
            gate.wait()
            store.commit_turns(on, [commit], lease_s=30)

        def signal_it(execution_id: uuid.UUID, payload: int, gate: threading.Barrier) -> None:
            gate.wait()
            client.signal(execution_id, "go", payload)

        threads = [
            threading.Thread(target=park_it, args=(park, shard, barrier)),
            threading.Thread(target=signal_it, args=(run.execution_id, attempt, barrier)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (woken,) = store.claim(shard, owner="a", limit=10, lease_s=30)[0]
        assert woken.execution_id == run.execution_id
        assert [s.payload for s in woken.signals] == [attempt]


def test_list_pages_are_stable_under_concurrent_inserts(client: Client) -> None:
    first = client.start_many("job", [(f"list-{i:03d}", None) for i in range(230)])
    seen: list[uuid.UUID] = []
    cursor = None
    pages = 0
    while True:
        page = client.list_runs(limit=100, cursor=cursor)
        seen.extend(e.id for e in page.items)
        pages += 1
        client.start_many("job", [(f"late-{pages}-{i}", None) for i in range(30)])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    ids = seen
    assert len(ids) == len(set(ids)), "a page repeated an execution"
    assert ids == sorted(ids)
    assert {r.execution_id for r in first} <= set(ids)
    assert len(list(client.iter_all(workflow="job"))) == 230 + 30 * pages
    waiting = client.list_runs(state="waiting")
    assert waiting.items == [] and waiting.next_cursor is None


def test_a_run_read_by_id_is_the_run_its_page_lists_in_every_state(
    client: Client, store: Store
) -> None:
    """`get` is a fixed statement and a page is built per filter: they must agree."""
    leased = ("running", "waiting", "completed", "asked")
    runs = {state: client.start("job", f"agree-{state}", {"n": 1}).execution_id
            for state in leased}
    claims = {c.execution_id: c for shard in client.map.shards
              for c in store.claim(shard, owner="t", limit=10, lease_s=30)[0]}
    assert set(claims) == set(runs.values())
    runs.update((state, client.start("job", f"agree-{state}").execution_id)
                for state in ("pending", "cancelled"))
    for state, commit in (
        ("waiting", _park_on_go(runs["waiting"], claims[runs["waiting"]].lease_token)),
        ("completed", TurnCommit(runs["completed"], claims[runs["completed"]].lease_token,
                                 events=[], state=State.COMPLETED, output_json='{"ok": 1}',
                                 task=TaskAction.DELETE)),
    ):
        shard = client.map.for_execution(runs[state])
        assert store.commit_turns(shard, [commit], lease_s=30)[runs[state]].landed
    assert client.cancel(runs["cancelled"]) is State.CANCELLED
    assert client.cancel(runs["asked"]) is State.RUNNING  # leased: cancel requested
    seen = 0
    for state in State:
        for listed in client.iter_all(state=state):
            if listed.id in runs.values():
                assert client.get(listed.id) == listed
                seen += 1
    assert seen == len(runs)
    assert client.get(runs["completed"]).output == {"ok": 1}
    assert client.get(runs["asked"]).cancel_requested is True
    assert client.get(runs["cancelled"]).finished_at is not None


def test_connection_dropped_mid_turn_duplicates_nothing(
    client: Client, shard_map: ShardMap
) -> None:
    """A step terminates every connection of the worker: the checkpoint after it is retried."""
    dropper = Registry()

    def drop_connections() -> str:
        for shard in shard_map.shards:
            with psycopg.connect(shard.url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'shardq-test-worker' "
                    "AND datname = current_database()"
                )
        return "dropped"

    @dropper.workflow("job")
    def drops(ctx: WorkflowContext) -> Any:
        a = ctx.step("drop", drop_connections)
        b = ctx.step("after", lambda: "after")
        return [a, b]

    with ShardPools(shard_map, application_name="shardq-test-worker") as worker_pools:
        worker = Worker(Store(worker_pools), dropper, config=WorkerConfig(lease_s=5)).start()
        try:
            run = client.start("job", "drop-1")
            done = client.wait(run.execution_id, timeout=30)
        finally:
            worker.stop(drain_timeout_s=2)
    assert done.state is State.COMPLETED and done.output == ["dropped", "after"]
    assert all_rows(
        shard_map,
        "SELECT execution_id, position, count(*) FROM shardq.events "
        "GROUP BY 1, 2 HAVING count(*) > 1",
    ) == []
    assert [(e.kind, e.name) for e in client.history(run.execution_id)] == [
        ("step.completed", "drop"), ("step.completed", "after"), ("run.completed", "run")
    ]
