"""How a worker's claim loops size their claims from its free turn slots (Worker._reserve).

Deterministic: the slot counts are set by hand and nothing connects (the pools
are never opened). The timing around it (a loop waits COALESCE_S between two
looks) is the drain benchmarks' to measure.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shardq.core.models import Claim, CommitOutcome, State, TaskAction, TurnCommit
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import CLAIM_STALL_S, Worker
from shardq.workflow.registry import Registry

URLS = ["postgresql://nobody@127.0.0.1:1/a", "postgresql://nobody@127.0.0.1:1/b"]


@pytest.fixture
def make_worker() -> Iterator[Callable[..., Worker]]:
    made: list[Worker] = []

    def make(concurrency: int, batch_size: int, commit_batch: int = 500) -> Worker:
        store = Store(ShardPools(ShardMap.from_urls(URLS)))
        worker = Worker(store, Registry(), config=WorkerConfig(
            concurrency=concurrency, batch_size=batch_size, commit_batch=commit_batch))
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.stop(drain_timeout_s=0)  # never started: closes its wake pipes


def busy(worker: Worker, turning: int) -> None:
    with worker._lock:
        worker._turning = turning


@pytest.mark.parametrize(
    ("concurrency", "batch", "turning", "partial", "backlog", "expected"),
    [
        # (free slots = concurrency - turning) -> (claim limit, free slots still awaited)
        (100, 100, 0, None, True, (100, None)),    # idle: a full batch at once
        (100, 100, 40, None, True, (0, 60)),       # 60 free under backlog: wait for more
        (100, 100, 20, 60, True, (0, 80)),         # the wait freed 20: keep waiting
        (100, 100, 20, 80, True, (80, None)),      # the wait freed none: claim what is free
        (100, 100, 0, 60, True, (100, None)),      # the batch filled: claim it
        (100, 100, 40, None, False, (60, None)),   # no backlog: what is free, at once
        (100, 100, 99, None, False, (1, None)),    # ... down to one thread
        (4, 10, 0, None, True, (4, None)),         # a batch larger than the pool: the pool
        (100, 10, 60, None, True, (10, None)),     # more than a batch free: a batch
        (100, 100, 100, None, True, (0, None)),    # nothing free: starved until a slot frees
        (100, 100, 100, None, False, (0, None)),
    ],
)
def test_a_claim_waits_for_a_full_batch_only_under_a_backlog(
    make_worker: Callable[..., Worker], *, concurrency: int, batch: int, turning: int,
    partial: int | None, backlog: bool, expected: tuple[int, int | None],
) -> None:
    worker = make_worker(concurrency, batch)
    busy(worker, turning)
    shard = worker.shards[0]
    assert worker._reserve(shard, partial, backlog) == expected
    limit = expected[0]
    assert worker._turning == turning + limit  # what a claim takes is reserved
    assert (shard.name in worker._starved) == (concurrency == turning)


def test_a_reserved_batch_is_not_offered_to_the_other_shard(
    make_worker: Callable[..., Worker],
) -> None:
    worker = make_worker(100, 100)
    first, second = worker.shards
    assert worker._reserve(first, None, True) == (100, None)
    assert worker._reserve(second, None, True) == (0, None)
    assert worker._starved == {second.name}
    # The claim found nothing due: its reservation is free again, and the
    # starved loop is told to look (the claiming loop is not: it would spin).
    worker._claimed(first, 100, [])
    assert worker._turning == 0
    assert worker._starved == set()
    assert worker._reserve(second, None, True) == (100, None)


def leased(count: int) -> list[Claim]:
    return [Claim(uuid.uuid4(), uuid.uuid4(), 1, "default", "w", 1, f"k{i}", None, False,
                  datetime.now(UTC), (), ()) for i in range(count)]


def test_a_stalled_claim_lends_its_slots_to_the_other_shards(
    make_worker: Callable[..., Worker],
) -> None:
    """A claim to a server that hangs waits for the store to find out (seconds): its
    reservation must not keep every other shard's loop starved meanwhile."""
    worker = make_worker(4, 4)
    hung, healthy = worker.shards
    assert worker._reserve(hung, None, False) == (4, None)
    assert worker._reserve(healthy, None, False) == (0, None)  # not stalled yet: reserved
    assert 0 < worker._starved_sleep() <= CLAIM_STALL_S + 0.01  # looks again when it may lend
    worker._claiming[hung.name].since -= CLAIM_STALL_S  # the claim has been out that long
    assert worker._reserve(healthy, None, False) == (4, None)
    worker._claimed(healthy, 4, leased(4))
    # The stalled claim answers at last with 3 runs: they are counted then, beyond the
    # threads (they wait in the turn queue), and its reservation is not given back twice.
    worker._claimed(hung, 4, leased(3))
    assert worker._turning == 7
    assert worker._reserve(hung, None, False) == (0, None)
    assert worker._starved_sleep() == worker.config.poll_interval_s  # nothing left to lend


def test_a_commit_batch_below_the_claim_batch_caps_what_a_claim_waits_for(
    make_worker: Callable[..., Worker],
) -> None:
    """Free slots never exceed the unsettled commits' room: waiting for more would
    make even an idle worker wait out a poll before every claim."""
    worker = make_worker(100, 100, commit_batch=20)
    assert worker._reserve(worker.shards[0], None, True) == (20, None)


def test_a_commit_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="commit batch must be >= 1"):
        WorkerConfig(commit_batch=0)


def test_a_turn_that_ended_without_a_commit_wakes_the_loop_that_found_no_slot(
    make_worker: Callable[..., Worker],
) -> None:
    """A lost lease or a crashed turn frees a slot too. The loop that had found
    none sleeps until the safety poll unless this wakes it: once off `_starved`,
    nothing else names it until a full batch of slots is free."""
    worker = make_worker(2, 2)
    first, _ = worker.shards
    busy(worker, 2)
    assert worker._reserve(first, None, True) == (0, None)
    assert not worker._wakes[first.name].is_set()
    worker._claimed(first, 1, [claim_of(uuid.uuid4())])
    entry, _ = queued(worker)
    worker._turn_returned(entry, None)
    assert worker._wakes[first.name].is_set()
    assert (worker._turning, worker._starved) == (1, set())


class _AddsAShard:
    """A claim loop's wake source whose poke lands while the map loop adds a shard: what
    a turn thread waking every loop met in the grow-online test, and died of."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.poked = 0

    def set(self) -> None:
        self.poked += 1
        with self.worker._lock:  # as the map loop adds a shard's wake source
            self.worker._wakes[f"added-{self.poked}"] = _AddsAShard(self.worker)  # type: ignore[assignment]


def test_waking_every_claim_loop_survives_a_shard_added_meanwhile(
    make_worker: Callable[..., Worker],
) -> None:
    worker = make_worker(100, 100)
    originals = dict(worker._wakes)
    try:
        worker._wakes = {name: _AddsAShard(worker) for name in originals}  # type: ignore[misc]
        with worker._lock:
            worker._starved = set(originals)  # every loop found no free slot
            woken = worker._claimers_to_wake()  # every slot free: every loop waiting
        worker._wake(woken)  # raised "dictionary changed size during iteration"
        assert set(woken) == set(originals)
    finally:
        worker._wakes = originals


def test_a_freed_batch_wakes_the_loops_waiting_for_slots_not_an_idle_one(
    make_worker: Callable[..., Worker],
) -> None:
    """At 64 shards, waking every loop on each freed batch put 64 empty claims ahead of
    the next wake-up's claim (docs/configuration.md): an idle loop sleeps on, a NOTIFY
    or its timer wakes it."""
    worker = make_worker(100, 100)
    waiting = worker.shards[0]  # the other shard's loop is idle
    for kind in ("starved", "coalescing"):  # found no slot; waits for a batch of them
        with worker._lock:
            setattr(worker, f"_{kind}", {waiting.name})
            woken = worker._claimers_to_wake()  # every slot free
            assert (worker._starved, worker._coalescing) == (set(), set())
        assert set(woken) == {waiting.name}, kind  # not the idle loop


def claim_of(execution_id: uuid.UUID) -> Claim:
    return Claim(execution_id, uuid.uuid4(), 1, "default", "wf", 1, "w-1", None, False,
                 datetime.now(UTC), (), ())


def queued(worker: Worker) -> tuple[Any, Claim]:
    item = worker._turns.get()
    assert item is not None
    return item


def test_a_run_claimed_again_before_its_last_commit_settled_keeps_its_new_lease(
    make_worker: Callable[..., Worker],
) -> None:
    """The race CI met in the demo: a turn's last commit lands (the run parks), a
    signal makes it due, and the claim loop claims it again before the completer's
    callback for that commit ran. The callback releases the turn it settles, never
    the newer claim: its lease stays heartbeated and its turn finds it (a KeyError
    in the turn thread, and a lease left to expire, before)."""
    worker = make_worker(4, 4)
    first, _ = worker.shards
    run = uuid.uuid4()
    worker._claimed(first, 0, [claim_of(run)])
    earlier, claim = queued(worker)
    final = TurnCommit(run, claim.lease_token, state=State.WAITING, task=TaskAction.DELETE)
    worker._turn_returned(earlier, final)  # the turn thread moved on; the commit lands
    again = claim_of(run)
    worker._claimed(first, 0, [again])  # claimed again before the callback below
    newer, _ = queued(worker)
    worker._turn_ended(earlier, final, CommitOutcome(landed=True))
    assert worker._inflight == {run: newer}
    assert newer.token == again.lease_token
    worker._turn_returned(newer, None)
    assert worker._inflight == {}
