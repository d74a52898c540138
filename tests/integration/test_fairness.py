"""Fairness between tenants: under a backlog a claim shares its batch between the tenants
with due runs, by weight (1 unless an operator set one), so a tenant that floods the
queue does not starve the others; every tenant is reached however many there are; a
share a tenant cannot use goes to the others; priorities still come first; weights are
the same on every shard and bad ones are refused with nothing stored."""

from __future__ import annotations

import contextlib
import json
import math
import re
import uuid
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument
from shardq.core.flow import TenantWeights
from shardq.core.models import State
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import TcpProxy, all_rows, run_cli, wait_until

registry = Registry()


@registry.workflow("chore")
def chore(ctx: WorkflowContext) -> str:
    return "done"


def start_on(client: Client, shard_map: ShardMap, shard: Shard, tenant: str, n: int,
             **options: object) -> list[uuid.UUID]:
    """Start `n` chores of `tenant` whose runs land on `shard`; their ids, in start order."""
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        wid = f"{tenant}-{i}"
        i += 1
        if shard_map.for_bucket(bucket_for(tenant, "chore", wid)).name == shard.name:
            ids.append(wid)
    return [r.execution_id for r in client.start_many(
        "chore", [(w, None) for w in ids], tenant=tenant, **options)]  # type: ignore[arg-type]


def claimed_tenants(store: Store, shard: Shard, limit: int) -> Counter[str]:
    claims, _ = store.claim(shard, owner="test", limit=limit, lease_s=30.0)
    return Counter(c.tenant for c in claims)


def test_a_flooding_tenant_shares_each_claim_with_the_others(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    """The flood's runs were started first: claimed in due order alone, the first claims
    would hold nothing but the flood."""
    shard = shard_map.shards[0]
    start_on(client, shard_map, shard, "flood", 200)
    for tenant in ("acme", "bolt", "cove"):
        start_on(client, shard_map, shard, tenant, 10)
    assert claimed_tenants(store, shard, 20) == {"flood": 5, "acme": 5, "bolt": 5, "cove": 5}
    assert claimed_tenants(store, shard, 20) == {"flood": 5, "acme": 5, "bolt": 5, "cove": 5}
    # The small tenants are down to nothing due: the rest of the batch is the flood's.
    assert claimed_tenants(store, shard, 20) == {"flood": 20}


def test_weights_divide_a_claim_and_an_unused_share_goes_to_the_others(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[1]
    start_on(client, shard_map, shard, "flood", 100)
    start_on(client, shard_map, shard, "acme", 30)
    start_on(client, shard_map, shard, "bolt", 30)
    client.set_tenant_weight("bolt", 2)
    assert claimed_tenants(store, shard, 20) == {"flood": 5, "acme": 5, "bolt": 10}
    # dent has 2 due, fewer than its share: what it cannot use goes, a round later, to
    # the tenants that used all of theirs, by weight again.
    start_on(client, shard_map, shard, "dent", 2)
    got = claimed_tenants(store, shard, 40)
    assert got["dent"] == 2 and sum(got.values()) == 40, got
    assert got["bolt"] > got["acme"] >= got["flood"] - 1, got


def test_every_tenant_is_reached_when_there_are_more_than_a_claim_visits(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    """A claim visits at most 32 tenants; the next one starts where it stopped."""
    shard = shard_map.shards[0]
    tenants = [f"t{i:02d}" for i in range(40)]
    for tenant in tenants:
        start_on(client, shard_map, shard, tenant, 3)
    seen: list[str] = []
    for _ in range(4):
        got = claimed_tenants(store, shard, 10)
        assert sum(got.values()) == 10 and set(got.values()) == {1}, got
        seen.extend(got)
    assert sorted(seen) == tenants  # 40 tenants in 4 claims of 10, none twice


def test_priorities_come_before_fairness(
    client: Client, store: Store, shard_map: ShardMap,
) -> None:
    shard = shard_map.shards[0]
    start_on(client, shard_map, shard, "acme", 10)
    urgent = start_on(client, shard_map, shard, "flood", 6, priority=5)
    claims, _ = store.claim(shard, owner="test", limit=8, lease_s=30.0)
    assert {c.execution_id for c in claims[:6]} == set(urgent)
    assert Counter(c.tenant for c in claims[6:]) == {"acme": 2}


def test_a_flood_does_not_hold_back_other_tenants_in_a_real_drain(
    client: Client, shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    """One worker drains both shards; the small tenants' runs all end while most of the
    flood, started before them, still waits."""
    for shard in shard_map.shards:
        start_on(client, shard_map, shard, "flood", 150)
    small = [(r, t) for shard in shard_map.shards for t in ("acme", "bolt")
             for r in start_on(client, shard_map, shard, t, 8)]
    worker = start_worker(registry, batch_size=8, concurrency=4, poll_interval_s=0.2)
    wait_until(lambda: all(client.get(r, tenant=t).state is State.COMPLETED for r, t in small),
               timeout=60, what="the small tenants' runs")
    worker.stop()
    # Counted when the last small run ended, by the times the shards recorded: the
    # drain goes on while the test polls and stops the worker, longer on a busy machine.
    ended = ("SELECT h.recorded_at FROM shardq.history h JOIN shardq.executions e "
             "ON e.id = h.execution_id WHERE h.kind = 'run.completed' AND e.tenant ")
    last_small = max(at for (at,) in all_rows(shard_map, ended + "IN ('acme', 'bolt')"))
    flood_done = [at for (at,) in all_rows(shard_map, ended + "= 'flood'") if at <= last_small]
    # Fair shares: about as many flood runs as small ones (32) had ended; in due order
    # all 300 would have.
    assert len(flood_done) < 150, len(flood_done)


def test_a_weight_is_written_to_every_shard_and_read_back(
    client: Client, shard_map: ShardMap,
) -> None:
    assert client.tenant_weights() == TenantWeights({}, {})
    client.set_tenant_weight("acme", 3)
    client.set_tenant_weight("bolt", 1000)
    assert all_rows(shard_map, "SELECT tenant, weight FROM shardq.tenant_weights "
                    "ORDER BY tenant") == [("acme", 3), ("bolt", 1000)] * 2
    client.set_tenant_weight("bolt", None)
    assert client.tenant_weights() == TenantWeights({"acme": 3}, {})
    # A set that reached only one shard shows as a difference, not as a weight.
    with psycopg.connect(shard_map.shards[1].url, autocommit=True) as conn:
        conn.execute("UPDATE shardq.tenant_weights SET weight = 7 WHERE tenant = 'acme'")
    assert client.tenant_weights() == TenantWeights(
        {}, {"acme": {"shard-0": 3, "shard-1": 7}})


def test_a_shard_that_does_not_answer_fails_the_set_after_the_others_are_written(
    shard_map: ShardMap, frozen_rig: tuple[TcpProxy, ShardMap],
) -> None:
    proxy, through_proxy = frozen_rig
    with ShardPools(through_proxy) as pools:
        client = Client(Store(pools), registry)
        client.set_tenant_weight("acme", 2)
        proxy.freeze()
        with pytest.raises(ShardUnavailable, match=re.escape(
                "the weight of tenant acme was written on shard-0 and not confirmed by shard-1")):
            client.set_tenant_weight("acme", 5)
        with pytest.raises(ShardUnavailable, match="could not read shard-1"):
            client.tenant_weights()
        written = all_rows(shard_map, "SELECT weight FROM shardq.tenant_weights")[0]
        proxy.thaw()

        def set_again() -> bool:  # what the error tells an operator to do
            with contextlib.suppress(ShardUnavailable):
                client.set_tenant_weight("acme", 5)
                return True
            return False

        wait_until(set_again, what="shard-1 to answer again")
        assert client.tenant_weights().differing == {}
    assert written == (5,)
    assert all_rows(shard_map, "SELECT weight FROM shardq.tenant_weights") == [(5,), (5,)]


@pytest.mark.parametrize(("tenant", "weight", "error"), [
    ("acme", 0, "tenant weight must be a whole number within 1..1000, got 0"),
    ("acme", -1, "within 1..1000, got -1"),
    ("acme", 1001, "within 1..1000, got 1001"),
    ("acme", 2**63, "within 1..1000"),
    ("acme", 1.5, "got 1.5"),
    ("acme", math.nan, "got nan"),
    ("acme", True, "got True"),
    ("acme", "3", "got '3'"),
    ("", 3, "tenant name must be a non-empty string"),
    ("ac\x00me", 3, "tenant name 'ac\\x00me' is invalid"),
    ("a" * 10_000, 3, "at most 128 characters"),
    (None, 3, "tenant name must be a non-empty string, got None"),
    (7, 3, "got 7"),
])
def test_bad_weights_and_tenants_are_refused_and_store_nothing(
    client: Client, shard_map: ShardMap, tenant: object, weight: object, error: str,
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(error)):
        client.set_tenant_weight(tenant, weight)  # type: ignore[arg-type]
    assert all_rows(shard_map, "SELECT count(*) FROM shardq.tenant_weights") == [(0,), (0,)]


@pytest.mark.parametrize(("args", "error"), [
    (["set", "acme", "0"], "tenant weight must be a whole number within 1..1000, got 0"),
    (["set", "acme", "1001"], "got 1001"),
    (["set", "acme", "many"], "'many' is not a valid integer"),
    (["set", "acme", "nan"], "'nan' is not a valid integer"),
    (["set", "", "3"], "tenant name must be a non-empty string"),
    (["set", "a" * 10_000, "3"], "at most 128 characters"),
    (["set", "acme"], "Missing argument 'WEIGHT'"),
    (["reset"], "Missing argument 'TENANT'"),
])
def test_the_command_line_refuses_bad_weights_with_exit_2_and_stores_nothing(
    shard_map: ShardMap, args: list[str], error: str,
) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    done = run_cli("--shards", shards, "fairness", *args)
    assert done.returncode == 2, done
    assert error in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert all_rows(shard_map, "SELECT count(*) FROM shardq.tenant_weights") == [(0,), (0,)]


def test_the_command_line_sets_shows_and_resets_a_weight(shard_map: ShardMap) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    assert run_cli("--shards", shards, "fairness", "show").stdout.strip() == (
        "every tenant weighs 1")
    done = run_cli("--shards", shards, "fairness", "set", "acme", "4")
    assert done.returncode == 0 and done.stdout.strip() == "acme  weight 4", done.stderr
    shown = run_cli("--shards", shards, "fairness", "show", "--json")
    assert json.loads(shown.stdout) == {"weights": {"acme": 4}, "differing": {}}
    with psycopg.connect(shard_map.shards[0].url, autocommit=True) as conn:
        conn.execute("DELETE FROM shardq.tenant_weights")
    assert run_cli("--shards", shards, "fairness", "show").stdout.strip() == (
        "acme  differs between shards: shard-0 1, shard-1 4 (set it again)")
    reset = run_cli("--shards", shards, "fairness", "reset", "acme", "--json")
    assert json.loads(reset.stdout) == {"weights": {}, "differing": {}}
