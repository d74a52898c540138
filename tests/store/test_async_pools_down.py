"""AsyncShardPools and a shard that does not answer: the first call waits out the connect
timeout and names the shard; the calls after it, until the next probe, fail at once with
the same error instead of each waiting again (an HTTP server must not spend a request's
whole budget on a down shard); the reachable shard serves meanwhile. A server that hangs
with its connections open fails a call within the liveness bound (shards/liveness.py)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from shardq.client.async_client import AsyncClient
from shardq.core.errors import ExecutionNotFound
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.config import ShardMap
from shardq.shards.connections import CONNECT_TIMEOUT_S
from shardq.shards.errors import ShardUnavailable
from shardq.shards.liveness import HUNG_NOTICE_S
from shardq.shards.pools import DOWN_PROBE_INTERVAL_S
from shardq.shards.routing import new_execution_id
from shardq.store.async_store import AsyncStore

from ..app import registry
from ..support import TcpProxy


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener never accepts: connections open, and nothing answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def test_a_silent_shard_costs_one_connect_timeout_then_fails_at_once(
    shard_map: ShardMap, silent_port: int
) -> None:
    up = shard_map.shards[0]
    silent_url = f"postgresql://nobody@127.0.0.1:{silent_port}/nothing"
    two = ShardMap.from_urls([up.url, silent_url])

    async def run() -> list[tuple[float, str]]:
        pools = AsyncShardPools(two).open()
        try:
            client = AsyncClient(AsyncStore(pools), registry)
            on_silent = new_execution_id(two.shards[1].first_bucket)
            timings = []
            for _ in range(3):
                began = time.monotonic()
                with pytest.raises(ShardUnavailable) as refused:
                    await client.get(on_silent)
                timings.append((time.monotonic() - began, str(refused.value)))
            # The reachable shard answers meanwhile.
            on_up = new_execution_id(two.shards[0].first_bucket)
            with pytest.raises(ExecutionNotFound):
                await client.get(on_up)
            return timings
        finally:
            await pools.close()

    timings = asyncio.run(run())
    first, *later = timings
    assert first[0] >= CONNECT_TIMEOUT_S / 2, first  # it did wait for the shard once
    assert "shard-1" in first[1] and "timed out" in first[1], first
    for seconds, message in later:  # within one probe interval: no second wait
        assert seconds < DOWN_PROBE_INTERVAL_S / 2, (seconds, message)
        assert message == first[1]


def test_a_hung_shard_fails_a_call_within_the_bound_while_the_other_answers(
    shard_map: ShardMap,
) -> None:
    """A server that keeps TCP alive and answers nothing (a proxy that stops forwarding):
    `shardq serve`'s calls to it fail within HUNG_NOTICE_S, naming it; calls to the other
    shard, made meanwhile on the same event loop, answer at once."""
    proxy = TcpProxy.to(shard_map.shards[1].url)
    two = ShardMap.from_urls([shard_map.shards[0].url, proxy.url(shard_map.shards[1].url)])

    async def run() -> tuple[float, str, float]:
        pools = AsyncShardPools(two).open()
        try:
            client = AsyncClient(AsyncStore(pools), registry)
            on_hung = new_execution_id(two.shards[1].first_bucket)
            on_up = new_execution_id(two.shards[0].first_bucket)
            with pytest.raises(ExecutionNotFound):
                await client.get(on_hung)  # reached before the freeze
            proxy.freeze()

            async def hung_call() -> tuple[float, str]:
                began = time.monotonic()
                with pytest.raises(ShardUnavailable) as refused:
                    await client.get(on_hung)
                return time.monotonic() - began, str(refused.value)

            pending = asyncio.ensure_future(hung_call())
            await asyncio.sleep(0.5)
            began = time.monotonic()
            with pytest.raises(ExecutionNotFound):
                await client.get(on_up)
            healthy_s = time.monotonic() - began
            seconds, message = await asyncio.wait_for(pending, HUNG_NOTICE_S + 5)
            return seconds, message, healthy_s
        finally:
            proxy.thaw()
            await pools.close()

    try:
        seconds, message, healthy_s = asyncio.run(run())
    finally:
        proxy.stop()
    assert healthy_s < 1.0, healthy_s
    assert seconds <= HUNG_NOTICE_S + 1.0, (seconds, message)
    assert "shard-1" in message and "not answering" in message, message
