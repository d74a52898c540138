"""Concurrency limits per key: at no moment do more than `limit` runs of one key hold a
task row (and so a lease), across workers and shards; runs waiting for a slot have no
task row, so claims never see them; a slot frees when its run finishes or parks on a
signal, never while its lease may be live; bad keys and limits are refused and store
nothing (docs/flow-control.md)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from shardq.client.client import Client
from shardq.core.errors import ConcurrencyKeyNotFound, InvalidArgument
from shardq.core.models import StaleBounds, State
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for, bucket_for_key
from shardq.store import statements
from shardq.store.store import Store
from shardq.worker.retention import KEY_IDLE_S, RetentionPlan, purge
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.contracts import update
from shardq.workflow.registry import Registry

from ..support import all_rows, run_cli, wait_until

registry = Registry()


@registry.workflow("sync", concurrency=lambda i: (f"customer:{i['customer']}", i.get("limit", 2)))
def sync(ctx: WorkflowContext) -> str:
    ctx.step("work", lambda: time.sleep(0.05))
    return "synced"


@registry.workflow("chore")
def chore(ctx: WorkflowContext) -> str:
    return "done"


@registry.workflow("parks", concurrency=("parking", 1))
def parks(ctx: WorkflowContext) -> str:
    ctx.receive("go")
    return "done"


@registry.workflow("bad_key_fn", concurrency=lambda i: i["pair"])
def bad_key_fn(ctx: WorkflowContext) -> str:
    return "never"


@registry.workflow_class("basket", concurrency=lambda i: (f"basket:{i['owner']}", 1))
class Basket:
    """Items arrive as `add` updates (answered with their count) until "close"."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def run(self, ctx: WorkflowContext) -> list[str]:
        ctx.receive("close")
        return self.items

    @update("add")
    def add(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)


def live_leases_by_key(shard_map: ShardMap) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, n in all_rows(shard_map, "SELECT concurrency_key, count(*) FROM shardq.tasks "
                           "WHERE concurrency_key IS NOT NULL AND leased_until > now() "
                           "GROUP BY 1"):
        counts[key] = counts.get(key, 0) + int(n)
    return counts


def task_rows_by_key(shard_map: ShardMap, prefix: str) -> dict[str, int]:
    """Task rows (slots held) of the keys starting with `prefix`: the module's tests share
    their shards, so each uses keys of its own."""
    return {k: int(n) for k, n in all_rows(
        shard_map, "SELECT concurrency_key, count(*) FROM shardq.tasks "
        "WHERE starts_with(concurrency_key, %s) GROUP BY 1", prefix)}


def queued(shard_map: ShardMap, prefix: str) -> list[uuid.UUID]:
    return [r[0] for r in all_rows(
        shard_map, "SELECT execution_id FROM shardq.key_queue "
        "WHERE starts_with(concurrency_key, %s) ORDER BY queued_at", prefix)]


def miscounted(shard_map: ShardMap) -> list[tuple[Any, ...]]:
    """Keys whose `held` is not their task rows: admission would then be wrong for ever."""
    return all_rows(shard_map, "SELECT k.key, k.held, (SELECT count(*) FROM shardq.tasks t "
                    "WHERE t.concurrency_key = k.key) FROM shardq.concurrency_keys k "
                    "WHERE k.held <> (SELECT count(*) FROM shardq.tasks t "
                    "WHERE t.concurrency_key = k.key)")


def stored(shard_map: ShardMap) -> list[tuple[Any, ...]]:
    return all_rows(shard_map, "SELECT (SELECT count(*) FROM shardq.executions), "
                    "(SELECT count(*) FROM shardq.concurrency_keys)")


def test_no_more_than_the_limit_of_a_key_run_at_once_across_workers(
    client: Client, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    runs = client.start_many("sync", [(f"s{i}", {"customer": i % 3}) for i in range(30)])
    most: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, n in live_leases_by_key(shard_map).items():
                most[key] = max(most.get(key, 0), n)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for _ in range(2):
            start_worker(registry, concurrency=16, poll_interval_s=0.2)
        wait_until(lambda: all(client.get(r.execution_id).state is State.COMPLETED
                               for r in runs), timeout=60, what="every sync done")
    finally:
        stop.set()
        sampler.join()
    assert most == {"customer:0": 2, "customer:1": 2, "customer:2": 2}
    assert queued(shard_map, "customer:") == []
    assert task_rows_by_key(shard_map, "customer:") == {}
    assert miscounted(shard_map) == []


def test_runs_over_the_limit_wait_without_a_task_row_and_are_never_claimed(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    runs = client.start_many("sync", [(f"w{i}", {"customer": "one", "limit": 1})
                                      for i in range(5)])
    assert task_rows_by_key(shard_map, "customer:one") == {"customer:one": 1}
    assert len(queued(shard_map, "customer:one")) == 4
    shown = [client.get(r.execution_id) for r in runs]
    assert [e.waiting_for_slot for e in shown] == [False, True, True, True, True]
    assert {e.state for e in shown} == {State.PENDING}
    assert {e.concurrency_key for e in shown} == {"customer:one"}
    # Listed and counted as pending, as `get` says, the ones waiting for a slot too.
    pending = client.list_runs(state=State.PENDING, limit=100).items
    assert sorted(e.id for e in pending) == sorted(r.execution_id for r in runs)
    counted = [store.health(shard, StaleBounds(), overdue_grace_s=60, timeout_s=5)
               for shard in shard_map.shards]
    assert sum(h.runs_by_state.get("pending", 0) for h in counted) == 5
    assert sum(h.concurrency_waiting for h in counted) == 4
    claims = [c for shard in shard_map.shards
              for c in store.claim(shard, owner="t", limit=10, lease_s=30.0)[0]]
    assert [c.execution_id for c in claims] == [runs[0].execution_id]


def test_a_run_parked_on_a_signal_frees_its_slot_and_a_wake_waits_for_one(
    client: Client, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    first = client.start("parks", "p1").execution_id
    second = client.start("parks", "p2").execution_id
    assert client.get(second).waiting_for_slot
    start_worker(registry, poll_interval_s=0.2)
    # The first parks on "go" and gives its slot to the second, which parks too.
    wait_until(lambda: {client.get(r).state for r in (first, second)} == {State.WAITING},
               what="both parked")
    assert task_rows_by_key(shard_map, "parking") == {}
    assert queued(shard_map, "parking") == [] and miscounted(shard_map) == []
    client.signal(first, "go")
    client.signal(second, "go")
    wait_until(lambda: {client.get(r).state for r in (first, second)} == {State.COMPLETED},
               what="both done")


def test_a_cancel_takes_a_waiting_run_out_of_the_queue(
    client: Client, shard_map: ShardMap,
) -> None:
    runs = client.start_many("sync", [(f"c{i}", {"customer": "x", "limit": 1})
                                      for i in range(3)])
    client.cancel(runs[1].execution_id)
    assert client.get(runs[1].execution_id).state is State.CANCELLED
    assert queued(shard_map, "customer:x") == [runs[2].execution_id]
    client.cancel(runs[0].execution_id)
    # Its slot went to the last one waiting.
    assert queued(shard_map, "customer:x") == []
    assert task_rows_by_key(shard_map, "customer:x") == {"customer:x": 1}
    assert not client.get(runs[2].execution_id).waiting_for_slot


def test_starts_racing_for_the_last_slot_admit_exactly_one(
    client: Client, shard_map: ShardMap,
) -> None:
    for round_ in range(10):
        barrier = threading.Barrier(2)

        def start(i: int, round_: int = round_, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            client.start("sync", f"r{round_}-{i}", {"customer": f"race{round_}", "limit": 1})

        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert task_rows_by_key(shard_map, "customer:race") == {
        f"customer:race{r}": 1 for r in range(10)}
    assert len(queued(shard_map, "customer:race")) == 10
    assert miscounted(shard_map) == []


def test_an_expired_lease_keeps_its_slot_until_its_run_is_claimed_again(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    runs = client.start_many("sync", [(f"e{i}", {"customer": "dead", "limit": 1})
                                      for i in range(2)])
    shard = shard_map.for_execution(runs[0].execution_id)
    # A worker claims the first run and dies holding it (its lease is never renewed).
    (dead,), _ = store.claim(shard, owner="dead", limit=10, lease_s=0.5)
    assert dead.execution_id == runs[0].execution_id
    assert store.claim(shard, owner="live", limit=10, lease_s=30.0)[0] == []
    time.sleep(0.7)
    # Expired: the same run is due again, and the second still waits for the slot.
    (again,), _ = store.claim(shard, owner="live", limit=10, lease_s=30.0)
    assert again.execution_id == runs[0].execution_id
    assert client.get(runs[1].execution_id).waiting_for_slot


def test_an_operator_limit_promotes_waiting_runs_at_once_and_reset_goes_back(
    client: Client, shard_map: ShardMap,
) -> None:
    client.start_many("sync", [(f"o{i}", {"customer": "op", "limit": 1}) for i in range(5)])
    raised = client.set_concurrency_limit("customer:op", 3)
    assert (raised.declared, raised.override, raised.limit) == (1, 3, 3)
    assert (raised.running, raised.waiting) == (3, 2)
    assert task_rows_by_key(shard_map, "customer:op") == {"customer:op": 3}
    back = client.set_concurrency_limit("customer:op", None)
    # Lowered: the runs holding slots keep them and finish.
    assert (back.limit, back.running, back.waiting) == (1, 3, 2)
    assert "customer:op" in [k.key for k in client.busiest_concurrency_keys(100)]
    assert client.concurrency_limit("customer:nobody") is None


@pytest.mark.parametrize(("concurrency", "says"), [
    (("", 1), "non-empty string"),
    (("  ", 1), "non-empty string"),
    (("a\x00b", 1), "NUL"),
    (("k" * 10_240, 1), "at most 255 characters"),
    ((7, 1), "non-empty string"),
    (("k", 0), "within 1..1000000"),
    (("k", -1), "within 1..1000000"),
    (("k", float("nan")), "within 1..1000000"),
    (("k", float("inf")), "within 1..1000000"),
    (("k", 10**12), "within 1..1000000"),
    (("k", True), "within 1..1000000"),
    (("k", 1.5), "within 1..1000000"),
    (("k",), r"a \(key, limit\) pair"),
    ("k", r"a \(key, limit\) pair"),
])
def test_a_bad_key_or_limit_is_refused_and_stores_nothing(
    client: Client, shard_map: ShardMap, concurrency: Any, says: str,
) -> None:
    before = stored(shard_map)
    with pytest.raises(InvalidArgument, match=says):
        client.start("chore", "bad", concurrency=concurrency)
    if isinstance(concurrency, tuple) and len(concurrency) == 2:
        # The same bad key (with a good limit), or bad limit, given to an operator's change.
        key, limit = concurrency
        with pytest.raises(InvalidArgument, match=says):
            client.set_concurrency_limit(key, 1 if key != "k" else limit)
    assert stored(shard_map) == before


@pytest.mark.parametrize(("pair", "says"), [
    (None, "concurrency function raised TypeError"),
    (["k", 0], "within 1..1000000"),
    (["", 1], "non-empty string"),
])
def test_a_concurrency_function_that_fails_refuses_the_start(
    client: Client, shard_map: ShardMap, pair: Any, says: str,
) -> None:
    before = stored(shard_map)
    value = {"pair": pair} if pair is not None else None
    with pytest.raises(InvalidArgument, match=says):
        client.start("bad_key_fn", "bad", value)
    assert stored(shard_map) == before


def test_an_unknown_key_cannot_be_given_a_limit(client: Client) -> None:
    with pytest.raises(ConcurrencyKeyNotFound):
        client.set_concurrency_limit("never-declared", 2)


def test_the_command_line_starts_limited_runs_and_shows_and_changes_their_limit(
    shard_map: ShardMap,
) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    app = "shardq.tests.integration.test_concurrency_limits:registry"
    for wid in ("cli-1", "cli-2", "cli-3"):
        started = run_cli("--shards", shards, "workflow", "start", "chore", wid, "--app", app,
                          "--concurrency", "team=blue=1", "--json")
        assert started.returncode == 0, started.stderr
    waiting = json.loads(started.stdout)["execution_id"]
    shown = run_cli("--shards", shards, "workflow", "show", waiting, "--no-history")
    assert "concurrency key 'team=blue': waiting for a slot" in shown.stdout, shown.stderr
    limit = run_cli("--shards", shards, "limits", "show", "team=blue", "--json")
    assert json.loads(limit.stdout) == {"key": "team=blue", "limit": 1, "declared": 1,
                                        "override": None, "running": 1, "waiting": 2}
    raised = run_cli("--shards", shards, "limits", "set", "team=blue", "5")
    assert raised.stdout.strip() == ("team=blue  limit 5 (set by an operator; declared 1)  "
                                     "running 3  waiting 0"), raised.stderr
    listed = run_cli("--shards", shards, "limits", "list")
    assert listed.stdout.strip() == "no run waits for a slot"
    reset = run_cli("--shards", shards, "limits", "reset", "team=blue", "--json")
    assert json.loads(reset.stdout)["limit"] == 1


def test_a_cancel_of_a_waiting_run_and_the_promotion_it_races_strand_no_run(
    client: Client, shard_map: ShardMap,
) -> None:
    """The queue's head is cancelled while the slot holder ends (here: is cancelled too)
    and its slot goes to the head: the promotion waits for the cancel (both hold the
    shard's admission lock), so the next run gets the slot, not a run already gone."""
    holder, head, last = (r.execution_id for r in client.start_many(
        "sync", [(f"q{i}", {"customer": "queue", "limit": 1}) for i in range(3)]))
    shard = shard_map.for_execution(holder)
    with psycopg.connect(shard.url, row_factory=dict_row) as conn:  # one open transaction
        assert statements.run(conn, statements.cancel_attempt(
            head, tenant="default", actor=None)) is State.CANCELLED
        ending = threading.Thread(target=client.cancel, args=(holder,))
        ending.start()
        time.sleep(0.5)  # the holder's cancel reaches the promotion and waits there
        conn.commit()
    ending.join(10)
    assert [client.get(r).state for r in (holder, head, last)] == [
        State.CANCELLED, State.CANCELLED, State.PENDING]
    assert not client.get(last).waiting_for_slot
    assert task_rows_by_key(shard_map, "customer:queue") == {"customer:queue": 1}
    assert queued(shard_map, "customer:queue") == [] and miscounted(shard_map) == []


def test_update_with_start_finds_a_limited_run_in_its_key_s_bucket(
    client: Client, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    """A limited run lives in its key's bucket, not its workflow id's: the lookup by
    workflow id that update_with_start makes goes there (a workflow id whose own bucket
    is on the other shard shows it)."""
    home = shard_map.for_bucket(bucket_for_key("basket:ann"))
    wid = next(w for w in (f"b-{i}" for i in range(1000))
               if shard_map.for_bucket(bucket_for("default", "basket", w)) != home)
    start_worker(registry, poll_interval_s=0.2)
    first = client.update_with_start("basket", wid, {"owner": "ann"}, "add", "apple", wait=10)
    again = client.update_with_start("basket", wid, {"owner": "ann"}, "add", "pear", wait=10)
    assert first.created and not again.created
    assert (first.response, again.response) == (1, 2)
    assert again.execution_id == first.execution_id
    assert shard_map.for_execution(first.execution_id) == home


def keys_on(shard_map: ShardMap) -> dict[str, tuple[int, int]]:
    return {k: (d, h) for k, d, h in all_rows(
        shard_map, "SELECT key, declared, held FROM shardq.concurrency_keys")}


def test_an_idle_key_s_row_is_purged_and_a_woken_run_brings_it_back(
    client: Client, store: Store, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    run = client.start("parks", "idle-1").execution_id
    start_worker(registry, poll_interval_s=0.2)
    wait_until(lambda: client.get(run).state is State.WAITING, what="parked")
    shard = shard_map.for_execution(run)
    plan = RetentionPlan.of(registry)
    purge(store, shard, plan)
    assert keys_on(shard_map) == {"parking": (1, 0)}  # declared a moment ago: kept
    all_rows(shard_map, "UPDATE shardq.concurrency_keys SET updated_at = now() - "
             "make_interval(secs => %s) RETURNING 1", KEY_IDLE_S + 60)
    purge(store, shard, plan)
    assert keys_on(shard_map) == {}
    client.signal(run, "go")  # the wake needs a slot: the key comes back with its limit
    assert client.wait(run, timeout=10).state is State.COMPLETED
    assert keys_on(shard_map) == {"parking": (1, 0)}


def test_a_key_holding_a_slot_with_runs_waiting_or_an_operator_limit_is_never_idle(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    client.start_many("sync", [(f"h{i}", {"customer": "busy", "limit": 1}) for i in range(2)])
    client.start("sync", "o1", {"customer": "ops", "limit": 1})
    client.set_concurrency_limit("customer:ops", 4)
    client.cancel(client.list_runs(limit=100).items[-1].id)  # o1: no slot, no queue left
    all_rows(shard_map, "UPDATE shardq.concurrency_keys SET updated_at = now() - "
             "make_interval(secs => %s) RETURNING 1", KEY_IDLE_S + 60)
    for shard in shard_map.shards:
        purge(store, shard, RetentionPlan.of(registry))
    assert keys_on(shard_map) == {"customer:busy": (1, 1), "customer:ops": (1, 0)}
