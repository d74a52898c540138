"""The operator's path around a move, on two PostgreSQL servers: rebalancing a split-up
map, how long a move, a resume and an abort keep the terminal, and what is left to
clean. The commands run in-process through click, as `shardq shards ...` would."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.routing import BUCKETS, new_execution_id

from .test_move_basics import Deployment, _cli, check_ownership, new_deployment, reset


@pytest.fixture(scope="module")
def base() -> Iterator[Deployment]:
    servers = [EmbeddedPostgres().start(), EmbeddedPostgres().start()]
    try:
        yield new_deployment(servers)
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def deployment(base: Deployment) -> Deployment:
    reset(base)
    return base


def start_runs(dep: Deployment, count: int) -> None:
    """`count` bare runs (their executions rows), spread evenly over the buckets and
    written to the shard that owns each bucket at version 1 (shard-0 the lower half)."""
    per_shard: list[list[uuid.UUID]] = [[] for _ in dep.urls]
    for i in range(count):
        bucket = i * BUCKETS // count
        per_shard[bucket * len(dep.urls) // BUCKETS].append(new_execution_id(bucket))
    for url, ids in zip(dep.urls, per_shard, strict=True):
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version,"
                " workflow_id, input) SELECT id, 'default', 'w', 1, id::text, '{}'"
                " FROM unnest(%s::uuid[]) AS id", (ids,))


def runs_per_shard(dep: Deployment) -> list[int]:
    counted = []
    for url in dep.urls:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM shardq.executions e, shardq.ownership o"
                " WHERE get_bit(o.owned, shardq.bucket(e.id)) = 1").fetchone()
        assert row is not None
        counted.append(int(row[0]))
    return counted


def test_rebalance_evens_a_map_whose_bordering_range_is_one_bucket(
    deployment: Deployment,
) -> None:
    """The issue's reproduction: 2,000 runs on two shards, bucket 4095 and then
    2048-3000 moved to shard-0. Before the fix, `rebalance --dry-run` printed 1,460
    against 540 and "nothing to move: the shards are even", and rebalance moved nothing."""
    start_runs(deployment, 2000)
    for args in (["4095"], ["2048-3000"]):
        status, out = _cli(deployment, "move", *args, "--to", "shard-0", "--grace", "0",
                           "--rest", "0")
        assert status == 0, out
    assert runs_per_shard(deployment) == [1466, 534]

    status, out = _cli(deployment, "rebalance", "--dry-run")
    assert status == 0, out
    assert "runs per shard: shard-0 1466, shard-1 534" in out
    assert "-3000 from shard-0 to shard-1 (466 runs)" in out  # the end that borders shard-1
    assert "afterwards: shard-0 1000, shard-1 1000: the shards are even" in out
    assert "nothing to move" not in out

    status, out = _cli(deployment, "rebalance", "--grace", "0", "--rest", "0", "--json")
    assert status == 0, out
    doc = json.loads(out[out.index("{"):])
    assert doc["runs_after"] == {"shard-0": 1000, "shard-1": 1000} and doc["even_after"]
    assert runs_per_shard(deployment) == [1000, 1000]
    check_ownership(deployment)

    status, out = _cli(deployment, "rebalance", "--dry-run")
    assert status == 0, out
    assert "nothing to move: the shards are even (each within 10% of the mean)" in out
