"""The operator's path around a move, on two PostgreSQL servers: rebalancing a split-up
map, how long a move, a resume and an abort keep the terminal, and what is left to
clean. The commands run in-process through click, as `shardq shards ...` would."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from shardq.moves import mover
from shardq.moves.models import MoveOptions
from shardq.shards.routing import BUCKETS, new_execution_id

from .test_move_basics import (
    MOVED,
    Deployment,
    _cli,
    check_ownership,
    check_rows_once,
    dump,
    populate,
    reset,
    two_servers,
)


@pytest.fixture(scope="module")
def base() -> Iterator[Deployment]:
    with two_servers() as deployment:
        yield deployment


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


def journal(dep: Deployment) -> tuple[list[int], tuple[int, int]]:
    """Runs per batch of the move, and its batch limits (runs, rows), from home."""
    with psycopg.connect(dep.urls[0]) as conn:
        runs = [int(r[0]) for r in conn.execute(
            "SELECT runs FROM shardq.move_batches ORDER BY batch")]
        limits = conn.execute("SELECT max_batch_runs, max_batch_rows FROM shardq.moves"
                              ).fetchone()
    assert limits is not None
    return runs, (int(limits[0]), int(limits[1]))


@pytest.mark.parametrize(("max_pause_s", "runs", "limit"), [
    # Every pause is over 1 us: each batch halves the ones after it, down to one run.
    (1e-6, [32, 16, 8, 4, 2, 1, 1], 1),
    (0.0, [32, 32], 32),    # never lowered
    (3600.0, [32, 32], 32),  # never that slow
])
def test_a_batch_paused_past_max_pause_halves_the_batches_after_it(
    deployment: Deployment, max_pause_s: float, runs: list[int], limit: int,
) -> None:
    """The pause of a batch is what its runs wait for; the design bounds it (1 s) by
    lowering the batch size when a batch takes longer."""
    inside, outside = populate(deployment, moved=64, kept=2)  # one run per bucket
    before = {**dump(deployment.urls[0], inside), **dump(deployment.urls[0], outside)}
    lines: list[str] = []
    result = mover.move(deployment.seeds, *MOVED, "shard-1", MoveOptions(
        max_batch_runs=32, grace_s=0.0, rest=0.0, max_pause_s=max_pause_s),
        progress=lines.append)
    assert result.phase == "done"
    assert [b.runs for b in result.batches] == runs, ([b.runs for b in result.batches], lines)
    recorded, limits = journal(deployment)
    assert (recorded, limits[0]) == (runs, limit)  # a resume goes on at the lowered size
    assert [b.phase for b in result.batches] == ["cleaned"] * len(runs)
    check_rows_once(deployment, before)
    lowered = [line for line in lines if "above --max-pause" in line]
    assert len(lowered) == (5 if limit == 1 else 0), lines


def test_rebalance_no_wait_returns_at_the_last_switch_and_names_the_copies_it_left(
    deployment: Deployment,
) -> None:
    """Without --no-wait a rebalance keeps the terminal for its grace period (one, at the
    end); with it, the command returns at the last switch, the runs are already even,
    and it says which copies stay and what deletes them; the next move deletes them."""
    start_runs(deployment, 2000)
    status, out = _cli(deployment, "move", "2048-3000", "--to", "shard-0", "--grace", "0",
                       "--rest", "0")
    assert status == 0, out
    grace = 30.0
    began = time.monotonic()
    status, out = _cli(deployment, "rebalance", "--grace", str(grace), "--rest", "0",
                       "--no-wait", "--json")
    assert status == 0, out
    assert time.monotonic() - began < grace / 2
    doc = json.loads(out[out.index("{"):])
    assert doc["even_after"] and runs_per_shard(deployment) == [1000, 1000]
    assert doc["cleanup"]["batches_cleaned"] == 0
    assert {p["source"] for p in doc["cleanup"]["pending"]} == {"shard-0"}

    status, out = _cli(deployment, "rebalance", "--grace", str(grace), "--rest", "0",
                       "--no-wait")
    assert status == 0, out
    assert "nothing to move: the shards are even" in out
    assert "shard-0 keeps its copy of" in out and "`shardq shards move --resume`" in out
    check_ownership(deployment)
