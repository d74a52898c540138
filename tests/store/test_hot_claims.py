"""A claim writes its lease beside the task's due time, not over it (schema/0018).

The lease is `leased_until`, indexed by nothing, so a claim updates its rows in
place (HOT) and they keep their place in tasks_due. These tests hold what that
must not cost: a live lease is never claimed twice, an expired one is, a claim
loop is told when the first lease expires rather than "due now", and a heartbeat
takes a long turn out of the claims' way.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.shards.config import Shard
from shardq.store.params import Lease
from shardq.store.store import Store
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import keys_on, rows, seq_scans

registry = Registry()


@registry.workflow("hot_job")
def hot_job(ctx: WorkflowContext) -> Any:
    return ctx.step("run", lambda: ctx.input)


def _runs_on_shard_0(client: Client, prefix: str, count: int) -> tuple[Shard, list[uuid.UUID]]:
    keys = keys_on(client.map, 0, "hot_job", prefix, count)
    return client.map.shards[0], [client.start("hot_job", key).execution_id for key in keys]


def test_a_claim_updates_its_rows_in_place_and_leaves_their_due_time(
    client: Client, store: Store
) -> None:
    shard, runs = _runs_on_shard_0(client, "hot", 5)
    due = dict(rows(shard.url, "SELECT execution_id, run_at FROM shardq.tasks "
                               "WHERE execution_id = ANY(%s)", runs))
    with psycopg.connect(shard.url) as conn:  # one transaction: its own stats counters
        claimed = conn.execute(
            "SELECT execution_id FROM shardq.claim_tasks('t', 10, 30, 0::smallint, NULL) "
            "WHERE execution_id IS NOT NULL").fetchall()
        updated, hot = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('shardq.tasks'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('shardq.tasks'::regclass)").fetchone() or (0, 0)
    assert sorted(r for (r,) in claimed) == sorted(runs)
    assert (updated, hot) == (5, 5)
    leased = rows(shard.url, "SELECT execution_id, run_at, leased_until - now() "
                             "FROM shardq.tasks WHERE execution_id = ANY(%s)", runs)
    assert {r: at for r, at, _ in leased} == due
    assert all(29 < left.total_seconds() <= 30 for _, _, left in leased)


def test_a_live_lease_is_stepped_over_and_an_expired_one_is_claimed_again(
    client: Client, store: Store
) -> None:
    shard, runs = _runs_on_shard_0(client, "step", 4)
    first, _ = store.claim(shard, owner="a", limit=2, lease_s=30)
    second, _ = store.claim(shard, owner="b", limit=10, lease_s=30)
    assert {c.execution_id for c in first} | {c.execution_id for c in second} == set(runs)
    assert not {c.execution_id for c in first} & {c.execution_id for c in second}
    assert store.claim(shard, owner="c", limit=10, lease_s=30)[0] == []

    expired = first[0].execution_id
    rows(shard.url, "UPDATE shardq.tasks SET leased_until = now() - interval '1 second' "
                    "WHERE execution_id = %s RETURNING 1", expired)
    (again,), _ = store.claim(shard, owner="c", limit=10, lease_s=30)
    assert (again.execution_id, again.claims) == (expired, 2)


def test_a_claim_loop_is_told_when_the_first_lease_expires_not_that_work_is_due(
    client: Client, store: Store
) -> None:
    shard, _ = _runs_on_shard_0(client, "next", 2)
    claims, _ = store.claim(shard, owner="a", limit=10, lease_s=30)
    assert len(claims) == 2
    # Both rows are still at the head of tasks_due (run_at passed), but leased.
    nothing, next_due = store.claim(shard, owner="b", limit=10, lease_s=30)
    assert nothing == []
    assert next_due is not None and 25 < next_due <= 30


def test_a_heartbeat_moves_a_long_turn_out_of_the_claims_way(
    client: Client, store: Store
) -> None:
    shard, runs = _runs_on_shard_0(client, "beat", 1)
    (claim,), _ = store.claim(shard, owner="a", limit=1, lease_s=30)
    assert store.extend_leases(shard, [Lease(claim.execution_id, claim.lease_token)], 60) == {
        claim.execution_id}
    ((run_at, leased_until, ahead),) = rows(
        shard.url, "SELECT run_at, leased_until, run_at - now() FROM shardq.tasks "
                   "WHERE execution_id = %s", runs[0])
    assert run_at == leased_until and 59 < ahead.total_seconds() <= 60


@pytest.mark.parametrize("build", [None, "b1"], ids=["unpinned", "pinned"])
def test_a_claim_scans_no_table_whole_when_statistics_say_it_is_empty(
    client: Client, build: str | None,
) -> None:
    """Statistics taken while the queue was empty (a fresh deployment, a quiet night)
    must not turn a claim into a scan of every task, run and event per claimed run;
    nor a claim of runs pinned to the worker's build (schema/0026)."""
    shard = client.map.shards[0]
    tables = ("tasks", "executions", "history", "signals")
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("ANALYZE " + ", ".join(f"shardq.{t}" for t in tables))
    if build is not None:
        client.set_workflow_build("hot_job", build)
    keys = keys_on(client.map, 0, "hot_job", "stale", 300)
    client.start_many("hot_job", [(k, None) for k in keys])

    with psycopg.connect(shard.url, autocommit=True) as conn:
        before = seq_scans(conn, tables)
        claimed = conn.execute("SELECT count(execution_id) FROM shardq.claim_tasks("
                               "'test', 100, 30, 0::smallint, NULL, %s)", [build]).fetchone()
        after = seq_scans(conn, tables)
    assert claimed == (100,)
    assert {t: after[t] - before[t] for t in tables} == dict.fromkeys(tables, 0)
