"""Pools closed while a shard is reached for the first time open nothing afterwards: no
pool, thread or connection outlives close() (a process that opens and closes clients
would otherwise leak one per race)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from shardq.client.async_client import AsyncClient
from shardq.core.errors import ExecutionNotFound
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.check import verify_shard
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import ShardPools
from shardq.shards.routing import new_execution_id
from shardq.store.async_store import AsyncStore

from ..app import registry
from ..support import all_rows

REACH_S = 0.4
"""How long the first reach of a shard takes here: close() lands in the middle of it."""


def _slow_verify(shard_map: ShardMap, shard: Shard) -> int | None:
    time.sleep(REACH_S)
    return verify_shard(shard_map, shard)


def _connections(shard_map: ShardMap, application: str) -> int:
    time.sleep(1.0)  # a pool opened by mistake would have connected by now
    return sum(n for (n,) in all_rows(
        shard_map, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        application))


def test_sync_pools_closed_during_a_first_reach_open_no_pool(shard_map: ShardMap) -> None:
    pools = ShardPools(shard_map, probe=True, verify=_slow_verify,
                       application_name="shardq-closing-sync").open()
    outcome: list[str] = []

    def use() -> None:
        try:
            with pools.connection(shard_map.shards[0]) as conn:
                conn.execute("SELECT 1")
            outcome.append("used after close")
        except ShardUnavailable as exc:
            outcome.append(str(exc))

    user = threading.Thread(target=use)
    user.start()
    time.sleep(REACH_S / 4)
    pools.close()
    user.join(timeout=10)
    assert len(outcome) == 1 and "pools are closed" in outcome[0], outcome
    assert _connections(shard_map, "shardq-closing-sync") == 0


def test_async_pools_closed_during_a_first_reach_open_no_pool(shard_map: ShardMap) -> None:
    async def run() -> str:
        pools = AsyncShardPools(shard_map, application_name="shardq-closing-async").open()
        client = AsyncClient(AsyncStore(pools), registry)
        reach = pools._verify

        async def slow(shard: Shard) -> None:
            await asyncio.sleep(REACH_S)
            await reach(shard)

        pools._verify = slow  # type: ignore[method-assign]
        call = asyncio.create_task(client.list_runs())
        await asyncio.sleep(REACH_S / 4)
        await pools.close()
        try:
            await call
        except ShardUnavailable as exc:
            return str(exc)
        return "answered after close"

    assert "pools are closed" in asyncio.run(run())
    assert _connections(shard_map, "shardq-closing-async") == 0


def test_close_joins_the_map_poll_thread(shard_map: ShardMap) -> None:
    """A process that opens and closes pools must not keep one poll thread per pools."""
    def polls() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "shardq-map-poll" and t.is_alive()]

    before = len(polls())
    pools = ShardPools(shard_map, follow_every_s=0.05).open()
    time.sleep(0.2)  # polling by now
    assert len(polls()) == before + 1
    pools.close()
    assert len(polls()) == before


def test_closing_a_client_that_used_one_shard_logs_no_outage(
    shard_map: ShardMap, caplog: pytest.LogCaptureFixture,
) -> None:
    """The map follower's first read may still be out on a shard the client never used
    when it closes: that read fails for the closing alone, which is no shard's outage."""
    async def use_one_shard_and_close() -> None:
        async with AsyncClient.connect(shard_map, registry) as client:
            with pytest.raises(ExecutionNotFound):
                await client.get(new_execution_id(shard_map.shards[0].first_bucket))

    caplog.set_level(logging.WARNING, logger="shardq")
    for _ in range(3):  # the follower's read and the close race: give the race its chances
        asyncio.run(use_one_shard_and_close())
    assert [r.getMessage() for r in caplog.records if r.name.startswith("shardq")] == []
