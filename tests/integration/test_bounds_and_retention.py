"""Bounds that stop a run from growing without end, and retention of finished runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.retention import RetentionPlan, purge, purgeable
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..conftest import TABLES as ALL_TABLES
from ..support import all_rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()


@registry.workflow("runaway", max_history=20)
def runaway(ctx: WorkflowContext) -> None:
    i = 0
    while True:  # a bug: it never ends
        ctx.step(f"s{i}", lambda: None)
        i += 1


@registry.workflow("long_nap", max_wait_s=3600)
def long_nap(ctx: WorkflowContext) -> None:
    ctx.sleep("nap", 7200)


@registry.workflow("quick")
def quick(ctx: WorkflowContext) -> str:
    return "done"


@registry.workflow("kept", retention_s=90 * 86400)
def kept(ctx: WorkflowContext) -> str:
    return "done"


@registry.workflow("parked")
def parked(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("never")


def test_a_runaway_run_fails_at_its_history_bound_with_a_clear_error(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("runaway", "r").execution_id
    done = client.wait(run, timeout=20)
    assert done.state is State.FAILED and done.error is not None
    assert done.error["type"] == "LimitExceeded"
    assert "limit of 20 recorded calls (max_history) at step 's20'" in done.error["message"]
    assert len([e for e in client.history(run) if e.kind == "step.completed"]) == 20


def test_a_wait_longer_than_the_definition_allows_fails_the_run(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    done = client.wait(client.start("long_nap", "n").execution_id, timeout=20)
    assert done.state is State.FAILED and done.error is not None
    assert "longer than the definition's max_wait_s (3600 s)" in done.error["message"]


@pytest.mark.parametrize(("settings", "says"), [
    ({"max_history": 0}, "max_history"), ({"max_wait_s": -1}, "max_wait_s"),
    ({"retention_s": float("inf")}, "retention_s"), ({"retain": 5}, "unknown setting"),
])
def test_bad_limits_are_refused_when_registered(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        Registry().register(lambda ctx: None, name="w", **settings)


TABLES = tuple(t for t in ALL_TABLES if t not in ("run_counts", "run_count_changes"))
"""The tables of runs' rows (a purge appends to the counters': test_listing.py's)."""


def rows_of(shard_map: ShardMap) -> dict[str, set[str]]:
    """Every row of every table, as its JSON text."""
    found: dict[str, set[str]] = {}
    for shard in shard_map.shards:
        with psycopg.connect(shard.url) as conn:
            for table in TABLES:
                found.setdefault(table, set()).update(
                    r for (r,) in conn.execute(f"SELECT to_jsonb(t)::text FROM shardq.{table} t"))
    return found


def age(shard_map: ShardMap, run: object, days: int) -> None:
    """Make a finished run look `days` old (its outcome event is when it finished)."""
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("UPDATE shardq.history SET recorded_at = now() - make_interval(days => "
                         "%s) WHERE execution_id = %s", [days, run])


def test_purge_deletes_only_finished_runs_past_retention(
    client: Client, start_worker: StartWorker, shard_map: ShardMap
) -> None:
    worker = start_worker(registry)
    old = [client.start("quick", f"old-{i}").execution_id for i in range(4)]
    recent = client.start("quick", "recent").execution_id
    kept_old = client.start("kept", "kept").execution_id
    live = client.start("parked", "live").execution_id
    for run in [*old, recent, kept_old]:
        client.wait(run, timeout=10)
    wait_until(lambda: client.get(live).state is State.WAITING, what="parked")
    worker.stop()
    client.signal(live, "other", {"buffered": True})
    for run in [*old, kept_old]:
        age(shard_map, run, 40)
    age(shard_map, live, 400)  # a live run, however old its events, is never purged
    before = rows_of(shard_map)
    plan = RetentionPlan.of(registry)
    assert sum(purgeable(client.store, s, plan) for s in shard_map.shards) == 4
    assert sum(purge(client.store, s, plan, batch=3) or 0 for s in shard_map.shards) == 4
    after = rows_of(shard_map)
    gone = {t: before[t] - after[t] for t in TABLES}
    assert {json.loads(r)["id"] for r in gone["executions"]} == {str(r) for r in old}
    assert {json.loads(r)["execution_id"] for r in gone["history"]} == {str(r) for r in old}
    assert {json.loads(r)["execution_id"] for r in gone["ended_runs"]} == {str(r) for r in old}
    assert all(after[t] <= before[t] for t in TABLES)
    assert after["signals"] == before["signals"]
    assert client.get(live).state is State.WAITING


def test_one_purger_at_a_time_per_shard(client: Client, shard_map: ShardMap) -> None:
    shard = shard_map.shards[0]
    with psycopg.connect(shard.url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('shardq.purge'))")
        assert purge(client.store, shard, RetentionPlan.of(registry)) is None


def test_a_worker_purges_on_its_own_schedule(
    client: Client, pools: ShardPools, shard_map: ShardMap
) -> None:
    run = client.start("quick", "housekept").execution_id
    worker = Worker(Store(pools), registry, config=WorkerConfig(
        poll_interval_s=1.0, housekeeping_interval_s=0.2, default_retention_s=3600)).start()
    try:
        client.wait(run, timeout=10)
        age(shard_map, run, 1)
        wait_until(lambda: all_rows(shard_map, "SELECT count(*) FROM shardq.executions "
                                               "WHERE id = %s", run) == [(0,), (0,)],
                   timeout=10, what="purged by housekeeping")
    finally:
        worker.stop()
