"""The floors: the least a PostgreSQL queue can do on this machine, with and without shardq's SQL.

W processes (multiprocessing, spawn), each with one thread and one connection
per shard (as a shardq worker runs one claim loop per shard), claim k rows and
complete them in a second commit (as shardq claims and completes in two),
until nothing is due. Timed from a barrier after every connection is open
until every table is empty or `max_seconds` passed; jobs/s = rows completed /
elapsed. Two loops:

- `raw`: a table `shardq_bench.q (id bigint primary key, locked boolean)`
  filled with `rows` ids;

      UPDATE q SET locked = true WHERE id IN (SELECT id FROM q WHERE NOT locked
          ORDER BY id FOR UPDATE SKIP LOCKED LIMIT k) RETURNING id

  then delete them: the physical floor of a SKIP LOCKED queue.
- `durable`: `noop` runs already started in shardq's own tables, drained by
  shardq's own Store (claim_tasks(), then one commit_turns() of the commits a
  `noop` turn ends with: its step's event, its outcome, task deleted),
  with no worker around it: no turn threads, no replay, no completer. It is
  what shardq's rows and SQL cost, so its rate over the raw floor's bounds
  what any worker could reach, and shardq's drain over it is the worker's
  share.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import psycopg

from shardq.benchmarks.db import SQL, BenchError, query
from shardq.benchmarks.dbcost import DbMeter, Instruments
from shardq.benchmarks.measure import CpuMeter, Progress
from shardq.core.models import Event, NewEvent, State, TaskAction, TurnCommit
from shardq.shards.config import Shard, ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store

Batch = Callable[[], int]
"""Claims and completes one batch; the number of jobs it completed (0: nothing due)."""

DURABLE_LEASE_S = 30.0


@dataclass
class _Run:
    """What one floor process shares with its per-shard threads (and is sent to it)."""

    urls: list[str]
    loop: str
    k: int
    max_seconds: float
    ready: Any  # multiprocessing Queue: one item per process once its connections are open
    go: MpEvent
    release: MpEvent
    results: Any  # multiprocessing Queue of (jobs, end time)
    deadline: float = float("inf")
    done: list[tuple[int, float] | None] = field(default_factory=list)


@contextmanager
def raw_batches(url: str, k: int) -> Iterator[Batch]:
    with psycopg.connect(url, autocommit=True) as conn:
        claim, delete = SQL["floor_claim"], SQL["floor_delete"]
        conn.execute("SELECT 1")

        def batch() -> int:
            ids = [r[0] for r in conn.execute(claim, {"k": k}, prepare=True).fetchall()]
            if ids:
                conn.execute(delete, {"ids": ids}, prepare=True)
            return len(ids)

        yield batch


@contextmanager
def durable_batches(url: str, k: int) -> Iterator[Batch]:
    shard_map = ShardMap.from_urls([url], pool_min=1, pool_max=1)
    (shard,) = shard_map.shards
    # A one-shard map of one shard of the suite's map: the shard's recorded map is the
    # suite's, which a pool checks at its first reach (and refuses); this loop only
    # claims and commits rows already routed there, so it skips that check.
    with ShardPools(shard_map, application_name="shardq-bench-floor",
                    verify=_unchecked) as pools:
        store = Store(pools)
        with pools.connection(shard) as conn:  # opened before the barrier
            conn.execute("SELECT 1")

        def batch() -> int:
            claims, _ = store.claim(shard, owner="durable-floor", limit=k,
                                    lease_s=DURABLE_LEASE_S)
            if not claims:
                return 0
            # What a `noop` turn ends with (worker/turn.py): its one step's event,
            # the run completed with a null output, the task deleted.
            commits = [
                TurnCommit(c.execution_id, c.lease_token,
                           events=[NewEvent(0, Event.STEP_COMPLETED, "run", {"result": None})],
                           state=State.COMPLETED, output_json="null", task=TaskAction.DELETE)
                for c in claims
            ]
            outcomes = store.commit_turns(shard, commits, lease_s=DURABLE_LEASE_S)
            if not all(o.landed for o in outcomes.values()):
                raise BenchError("durable floor: a commit lost its lease")
            return len(claims)

        yield batch


def _unchecked(shard_map: ShardMap, shard: Shard) -> None:
    """The durable floor's verifier: none (see durable_batches)."""


LOOPS = {"raw": raw_batches, "durable": durable_batches}


def _drain_shard(
    run: _Run, index: int, ready: threading.Barrier, finished: threading.Semaphore
) -> None:
    done = 0
    try:
        with LOOPS[run.loop](run.urls[index], run.k) as batch:
            ready.wait()
            run.go.wait()
            while time.time() < run.deadline:
                n = batch()
                if not n:
                    break
                done += n
            run.done[index] = (done, time.time())
            finished.release()
            # Keep the backend alive until the parent has read the CPU counters.
            run.release.wait(60)
    finally:
        if run.done[index] is None:
            run.done[index] = (done, time.time())
            finished.release()


def floor_process(run: _Run) -> None:
    """Child process body: one draining thread per shard; reports (jobs, end time)."""
    run.done = [None] * len(run.urls)
    local_ready = threading.Barrier(len(run.urls) + 1, timeout=60)
    finished = threading.Semaphore(0)
    threads = [
        threading.Thread(target=_drain_shard, args=(run, i, local_ready, finished), daemon=True)
        for i in range(len(run.urls))
    ]
    for t in threads:
        t.start()
    local_ready.wait()
    run.ready.put(1)
    run.go.wait()
    run.deadline = time.time() + run.max_seconds
    for _ in threads:
        finished.acquire()
    ends = [d for d in run.done if d is not None]
    run.results.put((sum(n for n, _ in ends), max(end for _, end in ends)))
    for t in threads:
        t.join(70)


def fill(urls: Sequence[str], rows_per_shard: int) -> None:
    for url in urls:
        query(url, "floor_schema")
        query(url, "floor_create")
        query(url, "floor_truncate")
        query(url, "floor_fill", {"count": rows_per_shard})
        query(url, "floor_vacuum")


def run_floor(urls: Sequence[str], *, k: int, workers: int, rows: int,
              max_seconds: float, instruments: Instruments | None = None) -> dict[str, Any]:
    """The raw floor: fill, drain with `workers` processes at batch `k`, return the rate."""
    per_shard = max(1, rows // len(urls))
    fill(urls, per_shard)
    try:
        result = drain(urls, "raw", k=k, workers=workers, max_seconds=max_seconds,
                       instruments=instruments)
    finally:
        # Emptied, the table would leave its dead rows to an autovacuum that
        # then runs beside whatever the next scenario times.
        for url in urls:
            query(url, "floor_truncate")
    return {**result, "rows_filled": per_shard * len(urls),
            "emptied": result["jobs"] >= per_shard * len(urls)}


def drain(urls: Sequence[str], loop: str, *, k: int, workers: int,
          max_seconds: float, instruments: Instruments | None = None) -> dict[str, Any]:
    """Drain what is queued with `workers` processes running `loop` at batch `k`.

    Besides the rate and CPU: the database's cost per job over the same window
    (dbcost.py: WAL always, per statement where `instruments` allow).
    """
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, release = ctx.Event(), ctx.Event()
    run = _Run(list(urls), loop, k, max_seconds, ready, go, release, results)
    procs = [ctx.Process(target=floor_process, args=(run,), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            try:
                ready.get(timeout=60)
            except queue.Empty:
                raise BenchError("floor processes did not connect within 60 s") from None
        # The floor processes are this phase's "workers"; they stay alive (and
        # readable in /proc) until `release`.
        db = DbMeter(urls, instruments).start()
        meter = CpuMeter([p.pid for p in procs if p.pid is not None]).start()
        started = time.time()
        go.set()
        bar = Progress(f"{loop} floor k={k}", max_seconds, unit=" s", rate=False)
        outcomes: list[tuple[int, float]] = []
        while len(outcomes) < len(procs):
            try:
                outcomes.append(results.get(timeout=0.2))
            except queue.Empty:  # keep the bar moving
                bar.update(min(time.time() - started, max_seconds))
                if not any(p.is_alive() for p in procs) and results.empty():
                    raise BenchError("a floor process died") from None
        bar.close()
        cpu = meter.stop(sum(n for n, _ in outcomes))
        cost = db.stop(sum(n for n, _ in outcomes))
    finally:
        release.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    jobs = sum(n for n, _ in outcomes)
    elapsed = max(end for _, end in outcomes) - started
    return {
        "k": k,
        "jobs": jobs,
        "seconds": round(elapsed, 3),
        "jobs_per_s": round(jobs / elapsed, 1),
        "processes": workers,
        "threads_per_process": len(urls),
        "cpu": cpu,
        **cost,
    }
