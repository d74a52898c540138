"""A million parked runs in seconds: the `parked` scenario's fixture.

Starting that many runs and letting workers park them would take longer than
the rest of the suite, so the rows are written straight into the engine's
tables. Python decides each run and mints its id exactly as `Client.start`
does (`shards.routing`: the key's bucket, its shard, a fresh execution id), so
the id layout has one definition; the statement `insert_parked` in
queries.sql writes the rows a run's first turn leaves when it parks, one
`INSERT ... SELECT unnest(...)` per chunk:

- even `i`: a `park` run waiting on signal "go" (a wait, no task);
- odd `i`: a `nap` run on its 90-day timer (a wait and a task whose `run_at`
  is the wake time).

Workflow ids are `parked-<i>`, inputs `{"parked": true}`, ids milliseconds
older than any run the benchmark starts afterwards. tests/acceptance/test_benchmarks.py
builds a few runs this way and a few the real way (started, parked by a
worker) and fails when their rows differ: when the engine changes what it
writes, this fixture must follow.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from shardq.benchmarks.db import query
from shardq.benchmarks.workflows import NAP_SECONDS
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for, new_execution_id

CHUNK = 100_000
"""Rows per statement."""
TENANT = "default"
INPUT = {"parked": True}
"""Every parked run's input (the literal the statement writes; the test starts
its real runs with this)."""


def parked_run(i: int) -> tuple[str, str]:
    """Run `i` of the fixture: its workflow name and workflow id."""
    return ("park" if i % 2 == 0 else "nap"), f"parked-{i}"


def insert_parked(
    shard_map: ShardMap, count: int, *, first: int = 0,
    progress: Callable[[int], None] | None = None, chunk: int = CHUNK,
) -> dict[str, int]:
    """Write runs `first` .. `first + count - 1`; how many landed on each shard.

    Minting is Python's work and inserting the server's, so a chunk is inserted
    (one thread per shard) while the next ones are minted: a million runs on
    two shards take about as long as the SQL alone.
    """
    ms0 = time.time_ns() // 1_000_000 - count - 600_000
    shards = {s.name: s for s in shard_map.shards}
    chunks: dict[str, _Chunk] = {name: _Chunk() for name in shards}
    landed = dict.fromkeys(shards, 0)
    lock = threading.Lock()

    def insert(name: str, rows: _Chunk) -> None:
        query(shards[name].url, "insert_parked", {
            "ids": rows.ids, "nums": rows.nums, "on_signal": rows.on_signal,
            "nap_s": NAP_SECONDS,
        })
        with lock:
            landed[name] += len(rows.ids)
            if progress is not None:
                progress(sum(landed.values()))

    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        sent: list[Future[None]] = []
        for n, i in enumerate(range(first, first + count)):
            name, workflow_id = parked_run(i)
            bucket = bucket_for(TENANT, name, workflow_id)
            shard = shard_map.for_bucket(bucket).name
            rows = chunks[shard]
            rows.ids.append(new_execution_id(bucket, now_ms=ms0 + n))
            rows.nums.append(i)
            rows.on_signal.append(name == "park")
            if len(rows.ids) == chunk:
                sent.append(pool.submit(insert, shard, rows))
                chunks[shard] = _Chunk()
        sent += [pool.submit(insert, shard, rows) for shard, rows in chunks.items() if rows.ids]
        for future in sent:
            future.result()  # the first failure, raised here
    return landed


@dataclass
class _Chunk:
    """The arrays of one `insert_parked` statement."""

    ids: list[uuid.UUID] = field(default_factory=list)
    nums: list[int] = field(default_factory=list)
    on_signal: list[bool] = field(default_factory=list)
