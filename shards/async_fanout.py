"""shards/fanout.py and shards/follow.py's rerouting for coroutines.

The same decisions (which shard a request goes to, when a refusal for a moved
bucket is retried, how long to pause, when to give up): the pause is awaited
rather than slept, and the map refresh (a rare, blocking read) runs on a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import NotOwner, ShardUnavailable
from shardq.shards.fanout import Reached, by_shard, settle
from shardq.shards.follow import Rerouting

T = TypeVar("T")
R = TypeVar("R")


class AsyncRerouting:
    """shards.follow.Rerouting for a coroutine: the same decision (what to refresh, how
    long to pause, when to give up), its refresh on a thread and its pause awaited."""

    def __init__(self, pools: AsyncShardPools) -> None:
        self._policy = Rerouting(pools)

    async def after(self, refusal: NotOwner) -> None:
        pause = await asyncio.to_thread(self._policy.pause_after, refusal)
        if pause > 0:
            await asyncio.sleep(pause)


async def rerouted(router: AsyncShardPools, call: Callable[[ShardMap], Awaitable[R]], *,
                   rerouting: AsyncRerouting | None = None) -> R:
    """`await call(current map)` until no shard refuses it for a moved bucket
    (shards.follow.rerouted's loop, with Rerouting's policy)."""
    retry = rerouting
    while True:
        try:
            return await call(router.map)
        except NotOwner as refusal:
            retry = retry or AsyncRerouting(router)
            await retry.after(refusal)


async def fan_out(
    route: AsyncShardPools,
    items: Sequence[T],
    bucket: Callable[[T], int],
    call: Callable[[Shard, list[T]], Awaitable[Sequence[R]]],
    *,
    parallel: bool = False,
) -> list[R]:
    """shards.fanout.fan_out for coroutines: `call(shard, its items)` once per shard
    touched (in turn, or at once when `parallel`), one answer per item in `items` order,
    a refused shard's items sent again where the map now says."""
    results: list[R | None] = [None] * len(items)
    pending = list(range(len(items)))
    retry: AsyncRerouting | None = None
    while pending:
        groups = by_shard(route.map, [items[i] for i in pending], bucket)
        if parallel and len(groups) > 1:
            async with asyncio.TaskGroup() as tasks:
                started = {shard: tasks.create_task(_one(call, shard, members))
                           for shard, members in groups.items()}
            answers = {shard: task.result() for shard, task in started.items()}
        else:
            answers = {shard: await _one(call, shard, members)
                       for shard, members in groups.items()}
        refused, first = settle(groups, answers, pending, results)
        if first is not None:
            retry = retry or AsyncRerouting(route)
            await retry.after(first)
        pending = refused
    return cast(list[R], results)


async def _one(
    call: Callable[[Shard, list[T]], Awaitable[Sequence[R]]], shard: Shard,
    members: list[tuple[int, T]],
) -> Sequence[R] | NotOwner:
    """A group's answer, or the refusal of a shard a bucket moved away from."""
    try:
        return await call(shard, [item for _, item in members])
    except NotOwner as refusal:
        return refusal


async def each_shard(shards: Sequence[Shard], call: Callable[[Shard], Awaitable[R]]) -> (
    Reached[R]
):
    """shards.fanout.each_shard for coroutines: every shard at once, one that raises
    ShardUnavailable listed rather than failing the whole."""
    async def one(shard: Shard) -> R | ShardUnavailable:
        try:
            return await call(shard)
        except ShardUnavailable as exc:
            return exc

    return Reached.of(shards, await asyncio.gather(*(one(shard) for shard in shards)))
