"""A batch routed by bucket: one call per shard, the answers back in input order, the
items of a shard that refused them for a moved bucket sent again where the map now
says; and a read of every shard that serves what the reachable ones hold.

The client's starts and signals, the relay's deliveries and the parked-runs page
all split a batch this way; this is the one place that does it.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import NotOwner, ShardUnavailable
from shardq.shards.follow import Rerouting, Router

T = TypeVar("T")
R = TypeVar("R")


POOL_THREADS = 64
"""Threads the fan-outs of a process share, at most: a call over more shards than that
queues the rest behind the first."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    """The process's one pool of fan-out threads, made on first use and kept. A pool
    made per call started its threads every time: half of a page over 8 shards (6 of
    12 ms) went to starting 16 threads. No call a fan-out runs fans out itself, so
    none waits on a thread its own caller holds."""
    global _pool  # noqa: PLW0603 - the one shared pool, made lazily
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="shardq-fan-out")
        return _pool


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it makes a pool of its own."""
    global _pool  # noqa: PLW0603
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def by_shard(
    shard_map: ShardMap, items: Sequence[T], bucket: Callable[[T], int]
) -> dict[Shard, list[tuple[int, T]]]:
    """`items` grouped by the shard owning each one's bucket, each with its index in `items`."""
    groups: dict[Shard, list[tuple[int, T]]] = defaultdict(list)
    for index, item in enumerate(items):
        groups[shard_map.for_bucket(bucket(item))].append((index, item))
    return groups


def fan_out(
    route: ShardMap | Router,
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

    Routed by a Router (ShardPools), a call a shard refuses because a bucket moved
    (NotOwner, Fenced: its transaction rolled back) is made again for that call's
    items only, by the map the refusal leads to (shards.follow.Rerouting: at once
    for a new owner, after a short backoff for a move in progress), until the
    retry budget runs out (ShardUnavailable). By a plain ShardMap, a refusal raises.
    """
    results: list[R | None] = [None] * len(items)
    pending = list(range(len(items)))
    retry: Rerouting | None = None
    while pending:
        shard_map = route if isinstance(route, ShardMap) else route.map
        groups = by_shard(shard_map, [items[i] for i in pending], bucket)
        answers = _call_groups(groups, call, parallel=parallel)
        refused, first = settle(groups, answers, pending, results)
        if first is not None:
            if isinstance(route, ShardMap):
                raise first
            retry = retry or Rerouting(route)
            retry.after(first)
        pending = refused
    return cast(list[R], results)  # every index was filled: each item is in one group


def settle(
    groups: dict[Shard, list[tuple[int, T]]], answers: Mapping[Shard, Sequence[R] | NotOwner],
    pending: list[int], results: list[R | None],
) -> tuple[list[int], NotOwner | None]:
    """One round of a fan-out: each answered group's values into `results` (at the
    indices `pending` gives its members), and the indices of the refused groups, with
    the first refusal (None when no shard refused)."""
    refused: list[int] = []
    first: NotOwner | None = None
    for shard, members in groups.items():
        answer = answers[shard]
        if isinstance(answer, NotOwner):
            first = first or answer
            refused += [pending[index] for index, _ in members]
            continue
        for (index, _), value in zip(members, answer, strict=True):
            results[pending[index]] = value
    return sorted(refused), first


def _call_groups(
    groups: dict[Shard, list[tuple[int, T]]], call: Callable[[Shard, list[T]], Sequence[R]],
    *, parallel: bool,
) -> dict[Shard, Sequence[R] | NotOwner]:
    """Each group's answer, or the refusal of a shard a bucket moved away from; any other
    error raises (in turn: after the calls before it returned)."""
    def one(shard: Shard) -> Sequence[R] | NotOwner:
        try:
            return call(shard, [item for _, item in groups[shard]])
        except NotOwner as refusal:
            return refusal

    if parallel and len(groups) > 1:
        return dict(zip(groups, _threads().map(one, groups), strict=True))
    return {shard: one(shard) for shard in groups}


@dataclass(frozen=True)
class Reached(Generic[R]):
    """What `each_shard` read: each reachable shard's answer, and the shards it could not
    read with their errors (both in the order the shards were given)."""

    answers: dict[Shard, R]
    unavailable: dict[Shard, ShardUnavailable]

    @property
    def unavailable_names(self) -> list[str]:
        return [shard.name for shard in self.unavailable]

    @property
    def causes(self) -> list[str]:
        """Why each unavailable shard could not be read, in `unavailable_names` order. They
        name hosts and ports: for an operator's eyes, never an API caller's."""
        return [str(exc) for exc in self.unavailable.values()]

    @classmethod
    def of(cls, shards: Sequence[Shard], outcomes: Sequence[R | ShardUnavailable]) -> Reached[R]:
        """Each shard's outcome, in order: an answer, or the error it could not be read with."""
        answers: dict[Shard, R] = {}
        unavailable: dict[Shard, ShardUnavailable] = {}
        for shard, outcome in zip(shards, outcomes, strict=True):
            if isinstance(outcome, ShardUnavailable):
                unavailable[shard] = outcome
            else:
                answers[shard] = outcome
        return cls(answers, unavailable)


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
        outcomes = list(_threads().map(one, shards))
    else:
        outcomes = [one(shard) for shard in shards]
    return Reached.of(shards, outcomes)
