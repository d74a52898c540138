"""How a worker's claim loops size their claims from its free turn slots (Worker._reserve).

Deterministic: the slot counts are set by hand and nothing connects (the pools
are never opened). The timing around it (a loop waits COALESCE_S between two
looks) is the drain benchmarks' to measure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from shardq.queue.registry import Registry
from shardq.queue.store import Store
from shardq.queue.worker import Worker, WorkerConfig
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools

URLS = ["postgresql://nobody@127.0.0.1:1/a", "postgresql://nobody@127.0.0.1:1/b"]


@pytest.fixture
def make_worker() -> Iterator[Callable[[int, int], Worker]]:
    made: list[Worker] = []

    def make(concurrency: int, batch_size: int) -> Worker:
        store = Store(ShardPools(ShardMap.from_urls(URLS)))
        worker = Worker(store, Registry(), config=WorkerConfig(
            concurrency=concurrency, batch_size=batch_size))
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.stop(drain_timeout_s=0)  # never started: closes its wake pipes


def busy(worker: Worker, turning: int) -> None:
    with worker._lock:
        worker._turning = turning


@pytest.mark.parametrize(
    ("concurrency", "batch", "turning", "partial", "expected"),
    [
        # (free slots = concurrency - turning) -> (claim limit, free slots still awaited)
        (100, 100, 0, None, (100, None)),    # idle: a full batch at once
        (100, 100, 40, None, (0, 60)),       # 60 free under backlog: wait for more
        (100, 100, 20, 60, (0, 80)),         # the wait freed 20: keep waiting
        (100, 100, 20, 80, (80, None)),      # the wait freed none: claim what is free
        (100, 100, 0, 60, (100, None)),      # the batch filled: claim it
        (4, 10, 0, None, (4, None)),         # a batch larger than the pool: the pool
        (100, 10, 60, None, (10, None)),     # more than a batch free: a batch
        (100, 100, 100, None, (0, None)),    # nothing free: starved until a slot frees
    ],
)
def test_a_claim_waits_for_a_full_batch_while_slots_keep_freeing(
    make_worker: Callable[[int, int], Worker], *, concurrency: int, batch: int, turning: int,
    partial: int | None, expected: tuple[int, int | None],
) -> None:
    worker = make_worker(concurrency, batch)
    busy(worker, turning)
    shard = worker.shards[0]
    assert worker._reserve(shard, partial) == expected
    limit = expected[0]
    assert worker._turning == turning + limit  # what a claim takes is reserved
    assert (shard.name in worker._starved) == (concurrency == turning)


def test_a_reserved_batch_is_not_offered_to_the_other_shard(
    make_worker: Callable[[int, int], Worker],
) -> None:
    worker = make_worker(100, 100)
    first, second = worker.shards
    assert worker._reserve(first, None) == (100, None)
    assert worker._reserve(second, None) == (0, None)
    assert worker._starved == {second.name}
    # The claim found nothing due: its reservation is free again, and the
    # starved loop is told to look (the claiming loop is not: it would spin).
    worker._claimed(first, 100, [])
    assert worker._turning == 0
    assert worker._starved == set()
    assert worker._reserve(second, None) == (100, None)
