"""Priorities: under a backlog, due runs of a higher priority are claimed first; a run's
priority is its for life (every turn a signal, a decision or a timer wakes); equal
priority keeps the order of due times; bad priorities are refused and store nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.errors import ExecutionNotFound, InvalidArgument
from shardq.core.models import State
from shardq.shards.config import Shard, ShardMap
from shardq.shards.routing import InvalidExecutionId, bucket_for, new_execution_id
from shardq.store.listener import WakeSource
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, wait_until

registry = Registry()


@registry.workflow("chore")
def chore(ctx: WorkflowContext) -> str:
    return "done"


@registry.workflow("urgent_by_default", priority=8)
def urgent_by_default(ctx: WorkflowContext) -> str:
    return "done"


@registry.workflow("parks")
def parks(ctx: WorkflowContext) -> str:
    how = ctx.input["how"]
    if how == "signal":
        ctx.receive("go")
    elif how == "decision":
        ctx.interrupt("approve", "go on?")
    else:
        ctx.sleep("nap", 1.0)
    return "done"


def ids_on(shard_map: ShardMap, shard: Shard, workflow: str, n: int, prefix: str) -> list[str]:
    """`n` workflow ids of `workflow` whose runs land on `shard`."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        wid = f"{prefix}-{i}"
        i += 1
        if shard_map.for_bucket(bucket_for("default", workflow, wid)).name == shard.name:
            found.append(wid)
    return found


def claimed(store: Store, shard: Shard, limit: int) -> list[uuid.UUID]:
    claims, _ = store.claim(shard, owner="test", limit=limit, lease_s=30.0)
    return [c.execution_id for c in claims]


def started(client: Client, workflow: str, ids: list[str], **options: Any) -> list[uuid.UUID]:
    return [r.execution_id for r in client.start_many(workflow, [(w, None) for w in ids],
                                                      **options)]


def test_higher_priority_is_claimed_first_and_equal_priority_by_due_time(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    ids = iter(ids_on(shard_map, shard, "chore", 43, "p"))
    backlog = started(client, "chore", [next(ids) for _ in range(30)])
    low = started(client, "chore", [next(ids) for _ in range(4)], priority=3)
    high = started(client, "chore", [next(ids) for _ in range(4)], priority=7)
    # Equal priority: separate starts, so each has its own due time.
    late = [started(client, "chore", [next(ids)])[0] for _ in range(5)]

    assert set(claimed(store, shard, 4)) == set(high)
    second = claimed(store, shard, 6)
    assert set(low) <= set(second) and len(set(second) - set(low)) == 2
    assert set(second) - set(low) <= set(backlog)
    rest = set(claimed(store, shard, 100))
    assert rest == set(backlog) - set(second) | set(late)
    assert claimed(store, shard, 100) == []


def test_equal_priority_keeps_the_order_of_due_times(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    order = [started(client, "chore", [w], priority=2)[0]
             for w in ids_on(shard_map, shard, "chore", 5, "eq")]
    assert [claimed(store, shard, 1)[0] for _ in order] == order


def test_a_workflow_s_own_priority_applies_unless_a_start_names_one(client: Client) -> None:
    plain = client.start("urgent_by_default", "a")
    chosen = client.start("urgent_by_default", "b", priority=1)
    assert client.get(plain.execution_id).priority == 8
    assert client.get(chosen.execution_id).priority == 1
    assert client.get(client.start("chore", "c").execution_id).priority == 0
    assert [e.priority for e in client.list_runs(workflow="urgent_by_default").items] == [8, 1]


@pytest.mark.parametrize("how", ["signal", "decision", "timer"])
def test_a_woken_turn_keeps_the_run_s_priority(
    client: Client, store: Store, shard_map: ShardMap,
    start_worker: Callable[..., Worker], how: str,
) -> None:
    shard = shard_map.shards[0]
    (wid,) = ids_on(shard_map, shard, "parks", 1, f"wake-{how}")
    run = client.start("parks", wid, {"how": how}, priority=5).execution_id
    worker = start_worker(registry)
    parked = State.INPUT_REQUIRED if how == "decision" else State.WAITING
    wait_until(lambda: client.get(run).state == parked, what=f"the run parked on a {how}")
    worker.stop()
    backlog = started(client, "chore", ids_on(shard_map, shard, "chore", 20, f"bl-{how}"))
    if how == "signal":
        client.signal(run, "go")
    elif how == "decision":
        client.decide(run, "approve", "approve", decision_id="d1", actor="tester")
    else:
        wait_until(lambda: all_rows(shard_map, "SELECT 1 FROM shardq.tasks WHERE "
                                    "execution_id = %s AND run_at <= now()", run),
                   what="the timer came due")
    assert claimed(store, shard, 1) == [run]
    assert set(claimed(store, shard, 100)) == set(backlog)


def test_a_fast_lane_claim_takes_only_priority_work_most_urgent_first(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    ids = ids_on(shard_map, shard, "chore", 9, "lane")
    backlog = started(client, "chore", ids[:5])
    low = started(client, "chore", ids[5:7], priority=1)
    high = started(client, "chore", ids[7:], priority=6)
    claims, _ = store.claim(shard, owner="test", limit=10, lease_s=30.0, min_priority=1)
    lane = [c.execution_id for c in claims]
    assert set(lane[:2]) == set(high) and set(lane[2:]) == set(low)
    assert set(claimed(store, shard, 10)) == set(backlog)


def test_a_wake_for_priority_work_says_urgent_and_one_for_the_rest_does_not(
    client: Client, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    plain, urgent = ids_on(shard_map, shard, "chore", 2, "note")
    wake = WakeSource(shard)
    try:
        assert wake.wait(10)  # the first connection counts as a wake-up
        wake.clear()
        started(client, "chore", [plain])
        assert wake.wait(10) and not wake.take_urgent()
        wake.clear()
        started(client, "chore", [urgent], priority=2)
        assert wake.wait(10) and wake.take_urgent()
        assert not wake.urgent, "taken once"
    finally:
        wake.close()


def test_two_claims_racing_for_the_urgent_rows_never_lease_one_twice(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    ids = ids_on(shard_map, shard, "chore", 14, "race")
    started(client, "chore", ids[:10])
    urgent = started(client, "chore", ids[10:], priority=9)
    barrier = threading.Barrier(2)
    results: list[list[uuid.UUID]] = []

    def claim() -> None:
        barrier.wait()
        results.append(claimed(store, shard, 3))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    both = results[0] + results[1]
    assert len(both) == len(set(both)) == 6
    assert set(urgent) <= set(both)


BAD_PRIORITIES: list[tuple[str, object]] = [
    ("negative", -1),
    ("past the top", 10),
    ("huge", 2**63),
    ("fraction", 1.5),
    ("nan", float("nan")),
    ("infinity", float("inf")),
    ("text", "5"),
    ("bool", True),
    ("list", [1]),
]


@pytest.mark.parametrize("value", [c[1] for c in BAD_PRIORITIES],
                         ids=[c[0] for c in BAD_PRIORITIES])
def test_a_bad_priority_is_refused_in_one_line_and_stores_nothing(
    client: Client, shard_map: ShardMap, value: object,
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: client.start("chore", "x", priority=value),  # type: ignore[arg-type]
        lambda: client.start_many("chore", [("y", None), ("z", None)],
                                  priority=value),  # type: ignore[arg-type]
        lambda: client.signal_with_start("chore", "w", None, "go",
                                         priority=value),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidArgument, match=r"^priority must be a whole number within "
                                                  r"0\.\.9 \(higher is claimed first\), got "):
            call()
    assert all_rows(shard_map, "SELECT id FROM shardq.executions") == []


def test_a_priority_change_moves_a_queued_run_ahead_and_holds_for_its_later_wakes(
    client: Client, store: Store, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    shard = shard_map.shards[0]
    queued = started(client, "chore", ids_on(shard_map, shard, "chore", 10, "ch"))
    assert client.set_priority(queued[-1], 7) is State.PENDING
    assert client.get(queued[-1]).priority == 7
    assert claimed(store, shard, 1) == [queued[-1]]  # its task row took the new level

    (wid,) = ids_on(shard_map, shard, "parks", 1, "ch-parked")
    run = client.start("parks", wid, {"how": "signal"}).execution_id
    worker = start_worker(registry)
    wait_until(lambda: client.get(run).state == State.WAITING, what="the run parked")
    worker.stop()
    # Parked: no task row; the wake the signal makes copies the run's new priority.
    assert client.set_priority(str(run), 6) is State.WAITING
    client.signal(run, "go")
    assert claimed(store, shard, 1) == [run]
    assert client.get(run).priority == 6


def test_a_finished_run_keeps_its_priority(
    client: Client, start_worker: Callable[..., Worker],
) -> None:
    run = client.start("chore", "fin", priority=2).execution_id
    start_worker(registry)
    wait_until(lambda: client.get(run).state == State.COMPLETED, what="the run completed")
    assert client.set_priority(run, 9) is State.COMPLETED
    assert client.get(run).priority == 2


@pytest.mark.parametrize("value", [c[1] for c in BAD_PRIORITIES],
                         ids=[c[0] for c in BAD_PRIORITIES])
def test_a_bad_priority_change_is_refused_and_changes_nothing(
    client: Client, shard_map: ShardMap, value: object,
) -> None:
    run = client.start("chore", "bad-change", priority=3).execution_id
    with pytest.raises(InvalidArgument, match=r"^priority must be a whole number within "):
        client.set_priority(run, value)  # type: ignore[arg-type]
    assert all_rows(shard_map, "SELECT e.priority, t.priority FROM shardq.executions e "
                    "JOIN shardq.tasks t ON t.execution_id = e.id") == [(3, 3)]


NO_SUCH_RUN = [
    ("unknown run", str(new_execution_id(7)), "default", ExecutionNotFound),
    ("another tenant's run", None, "acme", ExecutionNotFound),
    ("not an id", "not-a-uuid", "default", InvalidExecutionId),
    ("NUL in the id", "\x00", "default", InvalidExecutionId),
    ("NUL in the tenant", None, "a\x00b", InvalidArgument),
]


@pytest.mark.parametrize(("target", "tenant", "error"), [c[1:] for c in NO_SUCH_RUN],
                         ids=[c[0] for c in NO_SUCH_RUN])
def test_a_priority_change_of_no_such_run_is_refused_and_changes_nothing(
    client: Client, shard_map: ShardMap, target: str | None, tenant: str,
    error: type[Exception],
) -> None:
    run = client.start("chore", "kept", priority=3).execution_id
    with pytest.raises(error):
        client.set_priority(target or run, 8, tenant=tenant)
    assert all_rows(shard_map, "SELECT e.priority, t.priority FROM shardq.executions e "
                    "JOIN shardq.tasks t ON t.execution_id = e.id") == [(3, 3)]


@pytest.mark.parametrize("value", [c[1] for c in BAD_PRIORITIES],
                         ids=[c[0] for c in BAD_PRIORITIES])
def test_a_workflow_registered_with_a_bad_priority_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument, match=r"^workflow w: priority must be a whole number"):
        Registry().workflow("w", priority=value)(chore)
