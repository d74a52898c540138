"""A batch routed by bucket: one call per shard, the answers back in input order; and a
read of every shard that serves what the reachable ones hold.

The client's starts and signals, the relay's deliveries and the parked-runs page
all split a batch this way; this is the one place that does it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable

T = TypeVar("T")
R = TypeVar("R")


def by_shard(
    shard_map: ShardMap, items: Sequence[T], bucket: Callable[[T], int]
) -> dict[Shard, list[tuple[int, T]]]:
    """`items` grouped by the shard owning each one's bucket, each with its index in `items`."""
    groups: dict[Shard, list[tuple[int, T]]] = defaultdict(list)
    for index, item in enumerate(items):
        groups[shard_map.for_bucket(bucket(item))].append((index, item))
    return groups


def fan_out(
    shard_map: ShardMap,
    items: Sequence[T],
    bucket: Callable[[T], int],
    call: Callable[[Shard, list[T]], Sequence[R]],
    *,
    parallel: bool = False,
) -> list[R]:
    """`call(shard, its items)` once per shard touched; one answer per item, in `items` order.

    `parallel`: the shards' calls overlap on threads (big batches, where each
    shard's commit takes long enough to be worth it) instead of running in
    turn. A call that raises raises here, after the calls before it returned.
    """
    groups = by_shard(shard_map, items, bucket)

    def one(shard: Shard) -> Sequence[R]:
        return call(shard, [item for _, item in groups[shard]])

    if parallel and len(groups) > 1:
        with ThreadPoolExecutor(len(groups), thread_name_prefix="shardq-fan-out") as pool:
            answers = dict(zip(groups, pool.map(one, groups), strict=True))
    else:
        answers = {shard: one(shard) for shard in groups}
    results: list[R | None] = [None] * len(items)
    for shard, members in groups.items():
        for (index, _), answer in zip(members, answers[shard], strict=True):
            results[index] = answer
    return cast(list[R], results)  # every index was filled: each item is in one group


@dataclass(frozen=True)
class Reached(Generic[R]):
    """What `each_shard` read: each reachable shard's answer, and the shards it could not
    read with their errors (both in the order the shards were given)."""

    answers: dict[Shard, R]
    unavailable: dict[Shard, ShardUnavailable]

    @property
    def unavailable_names(self) -> list[str]:
        return [shard.name for shard in self.unavailable]


def each_shard(shards: Sequence[Shard], call: Callable[[Shard], R]) -> Reached[R]:
    """`call(shard)` for every shard, all at once; a shard that raises ShardUnavailable is
    listed rather than failing the whole (an outage of one shard must not hide what the
    others hold), any other error raises.

    At once, so a listing costs the slowest shard's read, not the sum of them.
    """
    def one(shard: Shard) -> R | ShardUnavailable:
        try:
            return call(shard)
        except ShardUnavailable as exc:
            return exc

    if len(shards) > 1:
        with ThreadPoolExecutor(len(shards), thread_name_prefix="shardq-each-shard") as pool:
            outcomes = list(pool.map(one, shards))
    else:
        outcomes = [one(shard) for shard in shards]
    answers: dict[Shard, R] = {}
    unavailable: dict[Shard, ShardUnavailable] = {}
    for shard, outcome in zip(shards, outcomes, strict=True):
        if isinstance(outcome, ShardUnavailable):
            unavailable[shard] = outcome
        else:
            answers[shard] = outcome
    return Reached(answers, unavailable)
