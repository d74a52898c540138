"""Search attributes (schema/0030, core/attributes.py, store/listing.py) and bulk
actions by query (client/bulk.py), as a caller meets them: a workflow sets typed
values in its turns, committed with them; pages and counts by those values are the
answer the definition gives; a bulk cancel or signal acts on exactly the live runs
its filter matches, within its bound, or on none.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.bulk import TooManyRuns
from shardq.client.client import Client
from shardq.core.attributes import parse_filter
from shardq.core.errors import InvalidArgument
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.sqlfile import load_queries
from shardq.store.store import Store
from shardq.worker.retention import RetentionPlan, purge
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import rows, wait_until

BENCH_SQL = load_queries("shardq.benchmarks", "queries.sql")
DAY_MS = 86_400_000
StartWorker = Callable[..., Worker]

registry = Registry()
DUE = datetime(2027, 3, 1, 9, 30, tzinfo=UTC)


@registry.workflow("order", attributes={"region": str, "amount": float, "paid": bool,
                                        "due": datetime, "items": int})
def order(ctx: WorkflowContext) -> Any:
    """Attributes set over three turns: set, changed, one removed; then park."""
    ctx.set_attributes(region=ctx.input["region"], amount=ctx.input["amount"], paid=False,
                       items=3)
    ctx.step("charge", lambda: None)
    ctx.set_attributes(paid=True, due=DUE, items=None)
    return ctx.wait_for_signal("go")


@registry.workflow("undeclared")
def undeclared(ctx: WorkflowContext) -> Any:
    ctx.set_attributes(region="north")


@registry.workflow("mistyped", attributes={"amount": float})
def mistyped(ctx: WorkflowContext) -> Any:
    ctx.set_attributes(amount="a lot")


def _started(client: Client, n: int) -> dict[uuid.UUID, tuple[str, float]]:
    made = {}
    for i in range(n):
        region, amount = ("north", "south", "east")[i % 3], float(i * 10)
        run = client.start("order", f"order-{i}", {"region": region, "amount": amount})
        made[run.execution_id] = (region, amount)
    return made


def test_attributes_are_committed_with_their_turns_and_found_by_value(
    client: Client, start_worker: StartWorker, shard_map: ShardMap,
) -> None:
    start_worker(registry)
    made = _started(client, 12)
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in made),
               what="every order parked", timeout=20)
    some = next(iter(made))
    assert client.get(some).attributes == {
        "region": made[some][0], "amount": made[some][1], "paid": True,
        "due": "2027-03-01T09:30:00.000000+00:00"}  # items removed by its None
    # One event a call, never written again by the replays of later turns.
    sets = [e for e in client.history(some) if e.kind == "attributes.set"]
    assert [e.payload["values"] for e in sets] == [
        {"region": made[some][0], "amount": made[some][1], "paid": False, "items": 3},
        {"paid": True, "due": "2027-03-01T09:30:00.000000+00:00", "items": None}]
    cases: list[tuple[Any, Callable[[str, float], bool]]] = [
        ({"region": "north"}, lambda r, a: r == "north"),
        (["amount>=50", "amount<100"], lambda r, a: 50 <= a < 100),
        (["region=east", "amount>30"], lambda r, a: r == "east" and a > 30),
        ({"paid": True}, lambda r, a: True),
        (["paid=false"], lambda r, a: False),
        (["due>=2027-03-01", "due<2027-03-02"], lambda r, a: True),
        ({"region": "nowhere"}, lambda r, a: False),
        (["items=3"], lambda r, a: False),
    ]
    for where, matches in cases:
        expected = sorted(r for r, (region, amount) in made.items() if matches(region, amount))
        assert [e.id for e in client.iter_all(where=where, limit=5)] == expected, where
        assert [e.id for e in client.iter_all(where=where, state="waiting")] == expected, where
        assert not list(client.iter_all(where=where, state="completed"))
        assert client.count_runs(where=where).by_state[State.WAITING] == len(expected), where
    # A tenant's attributes are its own.
    assert not list(client.iter_all(where={"region": "north"}, tenant="other"))
    assert len(list(client.iter_all(where={"region": "north"}, tenant=None))) == 4

    async def listed() -> list[uuid.UUID]:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            counted = await aclient.count_runs(where=["amount<40"])
            assert counted.by_workflow == {"order": {**dict.fromkeys(State, 0),
                                                     State.WAITING: 4}}
            return [e.id async for e in aclient.iter_all(where=["amount<40"], limit=3)]

    assert asyncio.run(listed()) == sorted(r for r, (_, a) in made.items() if a < 40)


def test_an_undeclared_or_mistyped_attribute_fails_the_run_and_stores_nothing(
    client: Client, start_worker: StartWorker, shard_map: ShardMap,
) -> None:
    start_worker(registry)
    runs = [client.start("undeclared", "u").execution_id,
            client.start("mistyped", "m").execution_id]
    ended = [client.wait(r, timeout=15) for r in runs]
    assert [e.state for e in ended] == [State.FAILED, State.FAILED]
    assert "declares no attribute 'region'" in str(ended[0].error)
    assert "attribute 'amount' is declared float, got str" in str(ended[1].error)
    assert not any(rows(s.url, "SELECT 1 FROM shardq.run_attributes") for s in shard_map.shards)


def test_a_purged_run_leaves_no_attributes(
    client: Client, start_worker: StartWorker, shard_map: ShardMap, store: Store,
) -> None:
    start_worker(registry)
    made = _started(client, 2)
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in made),
               what="every order parked", timeout=20)
    for run in made:
        client.signal(run, "go", 1)
        client.wait(run, timeout=15)
    assert len(list(client.iter_all(where={"paid": True}))) == 2  # ended runs keep theirs
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("UPDATE shardq.history SET recorded_at = now() - interval '40 days'")
    plan = RetentionPlan.of(registry, 30 * 86400)
    assert sum(purge(store, s, plan) or 0 for s in shard_map.shards) == 2
    assert not any(rows(s.url, "SELECT 1 FROM shardq.run_attributes") for s in shard_map.shards)


def _load(shard_map: ShardMap, per_shard: int) -> None:
    now_ms = int(time.time() * 1000)
    for n, shard in enumerate(shard_map.shards):
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute(BENCH_SQL["visibility_load"], {
                "n": per_shard, "first_ms": now_ms - 3 * DAY_MS, "span_ms": 3 * DAY_MS,
                "buckets": [b for b in range(4096) if shard.owns(b)], "salt": 10 + n})
            conn.execute("ANALYZE")


def test_attribute_filters_with_every_other_filter_page_to_the_definitions_answer(
    client: Client, shard_map: ShardMap,
) -> None:
    _load(shard_map, 4000)
    truth = []
    for shard in shard_map.shards:
        truth += rows(shard.url, """
            SELECT x.id, x.tenant, x.workflow_name, shardq.run_state(x.id), r.value #>> '{}',
                   (a.value #>> '{}')::float8
            FROM shardq.executions x
            LEFT JOIN shardq.run_attributes r ON r.execution_id = x.id AND r.name = 'region'
            LEFT JOIN shardq.run_attributes a ON a.execution_id = x.id AND a.name = 'amount'""")
    truth.sort()
    filters: list[tuple[Any, Callable[[Any, Any], bool]]] = [
        ({"region": "rare"}, lambda r, a: r == "rare"),
        (["region=north"], lambda r, a: r == "north"),
        (["amount>=900"], lambda r, a: a is not None and a >= 900),
        (["amount=8", "region=east"], lambda r, a: a == 8 and r == "east"),
        (["region<=east", "amount<100"], lambda r, a: r is not None and r <= "east"
         and a < 100),
        (["region=nowhere"], lambda r, a: False),
    ]
    checked = 0
    for where, matches in filters:
        for tenant in ("default", "rare-tenant", None):
            for workflow in (None, "billing"):
                for state in (None, State.COMPLETED, State.FAILED, State.WAITING, State.PENDING):
                    expected = [i for i, t, w, s, r, a in truth
                                if tenant in (None, t) and workflow in (None, w)
                                and (state is None or s == state.value) and matches(r, a)]
                    query = {"where": where, "tenant": tenant, "workflow": workflow,
                             "state": state}
                    assert [e.id for e in client.iter_all(limit=499, **query)] == expected, query
                    checked += bool(expected)
        counted = client.count_runs(where=where, tenant=None).by_state
        assert counted == {s: sum(1 for _, _, _, st, r, a in truth
                                  if st == s.value and matches(r, a)) for s in State}, where
    assert checked > 40


def _parked(client: Client, start_worker: StartWorker, n: int) -> dict[uuid.UUID, str]:
    start_worker(registry)
    made = {r: region for r, (region, _) in _started(client, n).items()}
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in made),
               what="every order parked", timeout=20)
    return made


def test_a_bulk_cancel_acts_on_its_matches_within_its_bound_or_on_none(
    client: Client, start_worker: StartWorker,
) -> None:
    made = _parked(client, start_worker, 9)
    north = sorted(r for r, region in made.items() if region == "north")
    dry = client.cancel_matching(where={"region": "north"}, dry_run=True)
    assert (dry.matched, dry.done) == (north, [])
    with pytest.raises(TooManyRuns, match="more than 2 live runs match; nothing was cancelled"):
        client.cancel_matching(where={"region": "north"}, max_runs=2)
    assert all(client.get(r).state is State.WAITING for r in made)  # the dry run, the refusal
    done = client.cancel_matching(where={"region": "north"}, max_runs=3, actor="ops")
    assert (done.matched, done.done, done.skipped) == (north, north, {})
    assert {r: client.get(r).state for r in made} == {
        r: State.CANCELLED if region == "north" else State.WAITING for r, region in made.items()}
    # Ended runs are passed over: the same filter again matches nothing.
    assert client.cancel_matching(where={"region": "north"}).matched == []


def test_a_bulk_signal_with_a_key_signals_each_match_once(
    client: Client, start_worker: StartWorker, shard_map: ShardMap,
) -> None:
    made = _parked(client, start_worker, 6)
    south = sorted(r for r, region in made.items() if region == "south")
    sent = client.signal_matching("go", {"ok": 1}, where=["region=south"],
                                  idempotency_key="bulk-1")
    assert (sent.matched, sorted(sent.done)) == (south, south)
    for run in south:
        assert client.wait(run, timeout=15).output == {"ok": 1}

    async def bulk(call: str, *args: Any, **kwargs: Any) -> Any:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            return await getattr(aclient, call)(*args, **kwargs)

    # The others, still parked, get it once; once they ended, nothing matches.
    first = asyncio.run(bulk("signal_matching", "go", 2, workflow="order",
                             idempotency_key="bulk-2"))
    rest = sorted(r for r in made if r not in south)
    assert sorted(first.done) == rest
    for run in rest:
        assert client.wait(run, timeout=15).output == 2
    assert asyncio.run(bulk("cancel_matching", workflow="order", dry_run=True)).matched == []


@pytest.mark.parametrize(("call", "kwargs", "says"), [
    ("list", {"where": ["amount>>3"]}, "is not NAME OP VALUE"),
    ("list", {"where": ["=3"]}, "is not NAME OP VALUE"),
    ("list", {"where": ["bad name=3"]}, "is not NAME OP VALUE"),
    ("list", {"where": {"a\x00b": 1}}, "attribute name"),
    ("list", {"where": {"region": "x" * 257}}, "at most 256 characters"),
    ("list", {"where": {"region": "a\x00b"}}, "NUL"),
    ("list", {"where": {"amount": float("nan")}}, "a finite number"),
    ("list", {"where": {"amount": 2**60}}, "integers within"),
    ("list", {"where": {"due": datetime(2027, 1, 1)}}, "needs a time zone"),
    ("list", {"where": {"amount": [1]}}, "a string, number, boolean or datetime"),
    ("list", {"where": "region=north"}, "where must be a mapping"),
    ("list", {"where": [f"a{i}=1" for i in range(5)]}, "at most 4 attribute filters"),
    ("count", {"where": ["region"]}, "is not NAME OP VALUE"),
    ("cancel", {}, "a bulk action needs a filter"),
    ("cancel", {"tenant": "default"}, "a bulk action needs a filter"),
    ("cancel", {"workflow": "order", "max_runs": 0}, "max_runs must be a whole number"),
    ("cancel", {"workflow": "order", "max_runs": True}, "max_runs must be a whole number"),
    ("cancel", {"workflow": "order", "max_runs": 100_001}, "max_runs must be a whole number"),
    ("cancel", {"workflow": "order", "colour": "red"}, "unknown filter colour"),
    ("cancel", {"state": "completed"}, "a bulk action acts on live runs"),
    ("cancel", {"state": "asleep"}, "state must be one of"),
    ("cancel", {"workflow": "order", "actor": " "}, "actor must be a non-empty string"),
    ("signal", {"where": {"region": 3j}}, "a string, number, boolean or datetime"),
    ("signal", {"workflow": "order", "name": "shardq.x"}, "reserved"),
    ("signal", {"workflow": "order", "payload": {"a": float("inf")}}, "payload"),
])
def test_hostile_attribute_filters_and_bulk_actions_are_refused(
    client: Client, call: str, kwargs: dict[str, Any], says: str,
) -> None:
    started = client.start("order", "stays", {"region": "north", "amount": 1.0}).execution_id
    act: dict[str, Callable[..., Any]] = {
        "list": client.list_runs, "count": client.count_runs,
        "cancel": client.cancel_matching,
        "signal": lambda name="go", payload=None, **kw: client.signal_matching(
            name, payload, **kw)}
    with pytest.raises(InvalidArgument, match=says):
        act[call](**kwargs)
    assert client.get(started).state is State.PENDING  # nothing was done to it


@pytest.mark.parametrize(("declared", "says"), [
    ({"amount": dict}, "declare one of str, int, float, bool, datetime"),
    ({"bad name": str}, "attribute name"),
    ({f"a{i}": str for i in range(33)}, "at most 32 attributes"),
    (["region"], "attributes must be a mapping"),
])
def test_hostile_declarations_are_refused(declared: Any, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        Registry().workflow("w", attributes=declared)(lambda ctx: None)


def test_filters_read_their_values_as_json_or_as_text() -> None:
    assert [(f.name, f.op, f.value) for f in map(parse_filter, [
        "region=eu", "amount>=100", 'order_id="123"', "paid=true", "x=NaN", "y = 2.5 ",
        "due<2027-01-01T00:00:00+00:00"])] == [
        ("region", "=", "eu"), ("amount", ">=", 100.0), ("order_id", "=", "123"),
        ("paid", "=", "true"), ("x", "=", "NaN"), ("y", "=", 2.5),
        ("due", "<", "2027-01-01T00:00:00+00:00")]
