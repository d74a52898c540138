"""A checkpoint the database refuses fails the run with the reason, end to end."""

from __future__ import annotations

from collections.abc import Callable

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker

from ..support import all_rows
from ..unit.test_turn import ran, registry


def test_a_refused_checkpoint_fails_the_run_with_the_reason(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    client = Client(Store(pools), registry)
    start_worker(registry)
    run = client.start("refused_midway", "r-1")
    done = client.wait(run.execution_id, timeout=15)
    assert done.state is State.FAILED and done.error is not None
    assert done.error["type"] == "StoreRejected"
    assert ran == []  # "after" never ran, and "nul" left no record
    assert [e.kind for e in client.history(run.execution_id) if e.position is not None] == []
    assert all_rows(shard_map, "SELECT count(*) FROM shardq.tasks") == [(0,), (0,)]
