"""Listing runs at the cost of a page (schema/0028, store/listing.py).

Each filter a page can have is a range of one index in id order. These tests hold
both halves of that: a page is the answer the definition gives (a run's tenant,
workflow, creation time and `run_state`), whatever filters are combined and however
the pages are cut; and at a million runs a shard, every filter shape's page reads
about its own rows, with no sequential scan, where a walk of the wrong index would
read thousands.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.client.reading import shard_rows
from shardq.core.attributes import AttributeFilter, attribute_filter
from shardq.core.errors import InvalidArgument
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.sqlfile import load_queries
from shardq.store import listing
from shardq.store.store import Store
from shardq.worker.retention import RetentionPlan, purge
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import rows, seq_scans, wait_until

BENCH_SQL = load_queries("shardq.benchmarks", "queries.sql")
DAY_MS = 86_400_000
StartWorker = Callable[..., Worker]

registry = Registry()


@registry.workflow("ok")
def ok(ctx: WorkflowContext) -> Any:
    return ctx.step("s", lambda: 1)


@registry.workflow("boom")
def boom(ctx: WorkflowContext) -> Any:
    raise RuntimeError("no")


@registry.workflow("parked")
def parked(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go")


def _load(shard_map: ShardMap, per_shard: int, first_ms: int, span_ms: int) -> None:
    """The benchmark's mix of ended, waiting and pending runs on every shard."""
    for shard in shard_map.shards:
        buckets = [b for b in range(4096) if shard.owns(b)]
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute(BENCH_SQL["visibility_load"], {
                "n": per_shard, "first_ms": first_ms, "span_ms": span_ms, "buckets": buckets,
                "salt": 1})
            conn.execute("ANALYZE")


def _truth(shard_map: ShardMap) -> list[tuple[uuid.UUID, str, str, str]]:
    """Every run's (id, tenant, workflow, state), by the definition, in id order."""
    found = []
    for shard in shard_map.shards:
        found += rows(shard.url, "SELECT id, tenant, workflow_name, shardq.run_state(id) "
                                 "FROM shardq.executions")
    return sorted(found)


def region(value: str) -> AttributeFilter:
    return attribute_filter("region", "=", value)


def _id_ms(ident: uuid.UUID) -> int:
    return ident.int >> 80


def test_every_combination_of_filters_pages_to_the_definitions_answer(
    client: Client, shard_map: ShardMap,
) -> None:
    now_ms = int(time.time() * 1000)
    _load(shard_map, 3000, now_ms - 10 * DAY_MS, 10 * DAY_MS)
    truth = _truth(shard_map)
    since = datetime.fromtimestamp((now_ms - 6 * DAY_MS) / 1000, UTC)
    until = since + timedelta(days=2)
    tenants = (None, "default", "rare-tenant", "nobody")
    workflows = (None, "orders", "rare_workflow", "nope")
    states: tuple[State | None, ...] = (None, State.COMPLETED, State.FAILED, State.CANCELLED,
                                        State.WAITING, State.PENDING, State.RUNNING)
    windows = ((None, None), (since, until), (until, since))
    checked = 0
    for tenant in tenants:
        for workflow in workflows:
            for state in states:
                for after, before in windows:
                    expected = [i for i, t, w, s in truth
                                if tenant in (None, t) and workflow in (None, w)
                                and (state is None or s == state.value)
                                and (after is None or _id_ms(i) >= after.timestamp() * 1000)
                                and (before is None or _id_ms(i) < before.timestamp() * 1000)]
                    filters = {"tenant": tenant, "workflow": workflow, "state": state,
                               "created_after": after, "created_before": before}
                    listed = [e.id for e in client.iter_all(limit=997, **filters)]
                    assert listed == expected, filters
                    checked += bool(expected)
    assert checked > 60  # a fifth of the combinations select runs: not all answers are empty
    # Small pages, cut across both shards: the cursor loses and repeats nothing.
    rare = [i for i, t, _, s in truth if t == "rare-tenant" and s == "completed"]
    assert [e.id for e in client.iter_all(tenant="rare-tenant", state="completed", limit=7)] == rare


def test_a_page_over_many_shards_reads_the_rows_a_crowded_shard_still_owes(
    fresh_databases: Any,
) -> None:
    """Each of three shards reads the rows of its first ids only (about twice its share
    of a page): when one shard holds every run, the page reads the rest of its rows in
    a second round, and loses and repeats nothing, from both clients."""
    shard_map = ShardMap.from_urls(fresh_databases(3))
    migrate(shard_map)
    crowded = ShardMap.from_urls([shard_map.shards[0].url])  # the load's buckets: shard 0's
    buckets = [b for b in range(4096) if shard_map.shards[0].owns(b)]
    with psycopg.connect(crowded.shards[0].url, autocommit=True) as conn:
        conn.execute(BENCH_SQL["visibility_load"], {
            "n": 450, "first_ms": int(time.time() * 1000) - DAY_MS, "span_ms": DAY_MS,
            "buckets": buckets, "salt": 2})
    expected = sorted(i for i, t, _, _ in _truth(shard_map) if t == "default")
    assert shard_rows(100, 3) < 100  # the second round is needed for a full page
    with ShardPools(shard_map) as pools:
        assert [e.id for e in Client(Store(pools), registry).iter_all(limit=100)] == expected

    async def listed() -> list[uuid.UUID]:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            return [e.id async for e in aclient.iter_all(limit=100)]

    assert asyncio.run(listed()) == expected


@pytest.mark.parametrize(("filters", "says"), [
    ({"created_after": datetime(2026, 1, 1)}, "created_after must be a datetime with a time zone"),
    ({"created_before": "2026-01-01"}, "created_before must be a datetime with a time zone"),
    ({"limit": 0}, "page size must be within 1..1000"),
    ({"state": "asleep"}, "asleep"),
    ({"workflow": "bad\x00name"}, "workflow"),
])
def test_hostile_filters_are_refused(client: Client, filters: dict[str, Any], says: str) -> None:
    with pytest.raises((InvalidArgument, ValueError), match=says):
        client.list_runs(**filters)


def test_every_ending_writes_the_run_into_the_ended_index(
    client: Client, start_worker: StartWorker, shard_map: ShardMap,
) -> None:
    """The index listing reads is written by the commits that end runs, in every way a
    run ends: a completed turn, a failed one, a cancel a turn commits, a cancel of a run
    no worker holds (cancel_run)."""
    start_worker(registry)
    done = [client.start("ok", f"ok-{i}").execution_id for i in range(3)]
    failed = client.start("boom", "boom").execution_id
    held = client.start("parked", "held").execution_id
    for run in [*done, failed]:
        client.wait(run, timeout=15)
    wait_until(lambda: client.get(held).state is State.WAITING, what="parked")
    assert client.cancel(held) is State.CANCELLED
    outcomes = set()
    ended = set()
    for shard in shard_map.shards:
        outcomes |= set(rows(shard.url, "SELECT x.tenant, substr(o.kind, 5), x.id, "
                                        "x.workflow_name FROM shardq.history o JOIN "
                                        "shardq.executions x ON x.id = o.execution_id "
                                        "WHERE o.kind LIKE 'run.%%' AND o.kind <> 'run.continued'"))
        ended |= set(rows(shard.url, "SELECT tenant, state, execution_id, workflow_name "
                                     "FROM shardq.ended_runs"))
    assert ended == outcomes
    assert {(s, i) for _, s, i, _ in ended} == {
        *(("completed", r) for r in done), ("failed", failed), ("cancelled", held)}
    assert [e.id for e in client.iter_all(state="completed", workflow="ok")] == sorted(done)
    assert [e.id for e in client.iter_all(state="cancelled")] == [held]


def test_a_page_reads_its_own_rows_at_a_million_runs(
    fresh_databases: Any,
) -> None:
    """A million runs on one shard, statistics taken: every filter shape's ids read
    about `limit` rows' worth of tuples (~2 each from a range, ~6 from a live table:
    the run's probe and its state's), and a filter that matches nothing reads a
    handful. A walk of the wrong index (the primary key for a rare tenant, the outcome
    events for a failed page) would read tens of thousands. The page's rows are read
    by id afterwards (executions_of), a fixed cost per row kept."""
    (url,) = fresh_databases(1)
    shard_map = ShardMap.from_urls([url])
    migrate(shard_map)
    with psycopg.connect(url, autocommit=True) as conn:
        # Faster to fill, planned the same: the plans depend on indexes and statistics.
        for table in ("executions", "history", "ended_runs", "waits", "tasks",
                      "run_attributes"):
            conn.execute(f"ALTER TABLE shardq.{table} SET UNLOGGED")
    now_ms = int(time.time() * 1000)
    _load(shard_map, 1_000_000, now_ms - 30 * DAY_MS, 30 * DAY_MS)
    window = datetime.fromtimestamp(now_ms / 1000 - 10 * 86400, UTC)
    shapes = {
        "tenant": listing.ListQuery(tenant="default"),
        "rare tenant": listing.ListQuery(tenant="rare-tenant"),
        "workflow": listing.ListQuery(tenant="default", workflow="rare_workflow"),
        "every tenant's workflow": listing.ListQuery(workflow="rare_workflow"),
        "ended state": listing.ListQuery(tenant="default", state=State.FAILED),
        "ended state, rare tenant": listing.ListQuery(tenant="rare-tenant",
                                                      state=State.CANCELLED),
        "ended state and workflow": listing.ListQuery(state=State.FAILED,
                                                      workflow="rare_workflow"),
        "waiting": listing.ListQuery(tenant="default", state=State.WAITING),
        "pending": listing.ListQuery(tenant="default", state=State.PENDING),
        "window": listing.ListQuery(tenant="default", created_after=window,
                                    created_before=window + timedelta(hours=6)),
        "after a cursor": listing.ListQuery(tenant="default", after=listing.Cursor(
            listing.id_floor(window))),
        "attribute": listing.ListQuery(tenant="default", where=(region("rare"),)),
        "attribute, rare tenant": listing.ListQuery(tenant="rare-tenant",
                                                    where=(region("south"),)),
        "attribute and ended state": listing.ListQuery(tenant="default", state=State.COMPLETED,
                                                       where=(region("west"),)),
        "two attributes": listing.ListQuery(tenant="default", where=(
            attribute_filter("amount", "=", 8), region("east"))),
    }
    empty = {
        "no such workflow": listing.ListQuery(tenant="default", workflow="nope"),
        "no such tenant": listing.ListQuery(tenant="nobody", state=State.COMPLETED),
        "a window in the future": listing.ListQuery(
            created_after=datetime.fromtimestamp(now_ms / 1000 + 86400, UTC)),
        "no such attribute value": listing.ListQuery(where=(region("nowhere"),)),
    }
    tables = ["executions", "history", "ended_runs", "waits", "tasks", "key_queue",
              "run_attributes"]
    with psycopg.connect(url) as conn:
        before = seq_scans(conn, tables)
    for name, query in {**shapes, **empty}.items():
        text, params = listing.compile_list(query)
        with psycopg.connect(url) as conn:  # one transaction: its own counters
            found = conn.execute(text, {**params, "mine": "1" * 4096}).fetchall()
            (read,) = conn.execute(
                "SELECT sum(pg_stat_get_xact_tuples_fetched(c.oid)"
                " + pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c"
                " WHERE c.relnamespace = 'shardq'::regnamespace").fetchone() or (0,)
        if name in empty:
            assert not found and read < 50, (name, read)
        else:  # the rare workflow failed 20 times in the million: a range that ends early
            assert len(found) == (20 if name == "ended state and workflow" else 100), name
            # Half of amount=8's runs are in the east: the page walks two hundred of them.
            assert read < (1000 if name == "two attributes" else 800), (name, read)
    with psycopg.connect(url) as conn:
        assert seq_scans(conn, tables) == before
    # A range of values is read whole and sorted by id: its cost is its matches (the
    # thousand runs of amount >= 996), not the shard's million.
    text, params = listing.compile_list(listing.ListQuery(where=(
        attribute_filter("amount", ">=", 996),)))
    with psycopg.connect(url) as conn:
        explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text,
                                 {**params, "mine": "1" * 4096}).fetchone()
    assert explained is not None
    plan = explained[0][0]["Plan"]
    assert plan["Actual Rows"] == 100 and "Seq Scan" not in json.dumps(plan)


def _counted_by_definition(shard_map: ShardMap, tenant: str | None) -> dict[str, dict[str, int]]:
    """Runs per workflow and state, by run_state over every run."""
    found: dict[str, dict[str, int]] = {}
    for shard in shard_map.shards:
        for workflow, state, n in rows(
                shard.url, "SELECT workflow_name, shardq.run_state(id), count(*) "
                           "FROM shardq.executions WHERE %s::text IS NULL OR tenant = %s "
                           "GROUP BY 1, 2", tenant, tenant):
            states = found.setdefault(workflow, {s.value: 0 for s in State})
            states[state] += n
    return found


def _as_values(counts: Any) -> dict[str, dict[str, int]]:
    return {w: {s.value: n for s, n in states.items()} for w, states in counts.items()}


def test_counts_are_the_definitions_answer_through_ends_folds_and_purges(
    client: Client, start_worker: StartWorker, shard_map: ShardMap, store: Any,
) -> None:
    worker = start_worker(registry, count_fold_interval_s=0)
    done = [client.start("ok", f"ok-{i}").execution_id for i in range(4)]
    failed = client.start("boom", "boom").execution_id
    held = [client.start("parked", f"held-{i}").execution_id for i in range(3)]
    client.start("ok", "theirs", tenant="other")
    for run in [*done, failed]:
        client.wait(run, timeout=15)
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in held), what="parked")
    worker.stop()
    client.cancel(held[0])
    client.start_many("ok", [(f"later-{i}", None) for i in range(5)])  # pending: no worker

    def agrees() -> None:
        for tenant in ("default", None):
            assert _as_values(client.count_runs(tenant=tenant).by_workflow) == (
                _counted_by_definition(shard_map, tenant)), tenant
        only = client.count_runs(workflow="parked")
        assert (set(only.by_workflow), only.by_state[State.WAITING] + only.by_state[
            State.RUNNING], only.by_state[State.CANCELLED], only.total) == ({"parked"}, 2, 1, 3)

    agrees()
    counts = client.count_runs()
    assert (counts.by_state[State.COMPLETED], counts.by_state[State.FAILED],
            counts.by_state[State.PENDING], counts.total) == (4, 1, 5, 13)
    # A woken run a worker holds is running, its wait row not yet closed.
    client.signal(held[1], "go", 1)
    shard = client.map.for_execution(held[1])
    assert held[1] in [c.execution_id for c in store.claim(
        shard, owner="t", limit=10, lease_s=60)[0]]
    assert client.get(held[1]).state is State.RUNNING
    assert rows(shard.url, "SELECT kind FROM shardq.waits WHERE execution_id = %s", held[1])
    agrees()
    assert client.count_runs(workflow="parked").by_state[State.RUNNING] == 1
    folded = sum(store.fold_run_counts(shard) for shard in shard_map.shards)
    assert folded > 0
    assert all(not rows(s.url, "SELECT * FROM shardq.run_count_changes")
               for s in shard_map.shards)
    agrees()
    # A purge subtracts what it deleted; a counter that reaches 0 leaves with its fold.
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("UPDATE shardq.history SET recorded_at = now() - interval '40 days' "
                         "WHERE kind = 'run.failed'")
    plan = RetentionPlan.of(registry, 30 * 86400)
    assert sum(purge(store, s, plan) or 0 for s in shard_map.shards) == 1
    agrees()
    assert "boom" not in client.count_runs().by_workflow
    for shard in shard_map.shards:
        store.fold_run_counts(shard)
    assert not [r for s in shard_map.shards
                for r in rows(s.url, "SELECT * FROM shardq.run_counts WHERE n = 0")]
    agrees()


@pytest.mark.parametrize(("filters", "says"), [
    ({"tenant": ""}, "tenant"),
    ({"workflow": "x" * 300}, "workflow"),
    ({"workflow": "bad\x00"}, "workflow"),
])
def test_hostile_count_filters_are_refused(
    client: Client, filters: dict[str, Any], says: str,
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        client.count_runs(**filters)
