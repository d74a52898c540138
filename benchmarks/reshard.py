"""The `reshard` scenario: a bucket range holding N parked runs moved to the other shard
while a drain of one-step jobs runs on other buckets and a client signals moving runs.

- N runs are parked in buckets MOVED (shard-0's lower half) by SQL, as the `parked`
  scenario writes them (benchmarks/parked.py's statement: half `park` runs waiting on a
  signal, half `nap` runs on a 90-day timer), so a large N costs seconds, not a drain.
- A feeder keeps a backlog of `noop` jobs whose keys fall outside MOVED; the standard
  fleet drains them. Its rate (jobs done per second: started less still queued) is
  measured for `before_s` seconds, then over the move.
- One client thread signals `park` runs of the range (`go`, keyed), one call at a
  time, before and through the move, each run once and then the same keys again (a
  client's retries, which must collapse); each call is timed. The longest call
  during the move is the pause a user of a moving run saw; any exception is an error.
- The move is `shardq shards move FIRST-LAST --to shard-1 --grace 0`, a separate
  process as an operator runs it; its JSON gives runs moved, seconds (cleanup
  included: the grace period is 0 here, 60 s by default) and the pause per batch.
  The drain's window "during" is the command's whole life, its start-up included.
- The suite's two shards are two databases of one server unless it was given URLs
  of two servers (`--shards`); `servers` in the result says which.

Afterwards every drained job and every signalled run must have completed, and the
queue is emptied and the range moved back (an empty move) for the scenarios after.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shardq.benchmarks.bench import Bench, Sizes
from shardq.benchmarks.db import (
    Autoanalyze,
    BenchError,
    Poller,
    analyze_as_autovacuum,
    query,
)
from shardq.benchmarks.measure import Progress, percentiles
from shardq.benchmarks.parked import CHUNK, TENANT, parked_run
from shardq.benchmarks.workflows import NAP_SECONDS
from shardq.shards.routing import bucket_for, new_execution_id

MOVED = (0, 1023)
"""Half of shard-0's buckets in the suite's two-shard map."""
FULL_RUNS, QUICK_RUNS = 100_000, 5_000
RUNS_OVERRIDE: int | None = None
"""Set by `--reshard-runs` (benchmarks/__main__.py)."""
BACKLOG = 1_000
"""Noop jobs the feeder keeps queued outside the range."""
FEED_POLL_S = 0.05


@dataclass(frozen=True)
class ReshardSizes:
    runs: int
    before_s: float


def sizes_for(sizes: Sizes) -> ReshardSizes:
    """Full size unless the suite runs --quick (its `parked` size is the quick one)."""
    quick = sizes.parked <= Sizes.quick().parked
    runs = RUNS_OVERRIDE or (QUICK_RUNS if quick else FULL_RUNS)
    return ReshardSizes(runs=runs, before_s=4.0 if quick or runs < FULL_RUNS else 10.0)


def reshard(b: Bench) -> dict[str, Any]:
    if len(b.urls) != 2:
        raise BenchError("reshard needs the suite's two shards (--shard-count 2)")
    sizes = sizes_for(b.sizes)
    first, last = MOVED
    fleet = b.fleet()
    b.reset(checkpoint=True)
    t = time.perf_counter()
    parked = _insert_in_range(b.urls[0], sizes.runs, first, last)
    insert_s = time.perf_counter() - t
    for url in b.urls:
        query(url, "vacuum_queue")
    b.checkpoint()
    targets = [run for run, on_signal in parked if on_signal]
    feeder = Feeder(b, first, last)
    signaller = Signaller(b, targets)
    with Poller(b.urls) as poller, Autoanalyze(b.urls) as autoanalyze:
        feeder.start(poller)
        signaller.thread.start()
        time.sleep(1.0)  # the backlog filled and the fleet busy before the window opens
        before = feeder.window(sizes.before_s)
        signaller.mark("move")
        moved, move_s, during = _move(b, f"{first}-{last}", "shard-1", feeder)
        signaller.mark("after")
        time.sleep(0.5)
        signaller.stop.set()
        signaller.thread.join(30)
        feeder.stop.set()
        feeder.thread.join(30)
    if feeder.error is not None:
        raise BenchError(f"reshard: the feeder failed: {feeder.error}")
    b.wait_drained(feeder.started, "reshard: drain tail")
    # The tables were analyzed with the parked runs only: the feeder's runs, tens of
    # thousands at full size, would have the check below plan as a nested loop over
    # every finished run (it ran for minutes at 100,000 parked runs).
    for url in b.urls:
        analyze_as_autovacuum(url, feeder.started)
    b.finished("noop", "rs-drain-", feeder.started)
    signalled = len(signaller.acked)
    _wait_completed(b, signalled)
    problems = fleet.errors()[:10]
    b.reset()
    back = subprocess.run(_move_command(f"{first}-{last}", "shard-0"), env=_env(b),
                          capture_output=True, text=True, timeout=600, check=False)
    if back.returncode != 0:
        raise BenchError(f"reshard: moving the (empty) range back failed: {back.stderr.strip()}")
    calls = signaller.calls_in("move")
    ratio = round(during["jobs_per_s"] / before["jobs_per_s"], 3) if before["jobs_per_s"] else None
    return {
        "runs": sizes.runs, "buckets": [first, last], "servers": _servers(b.urls),
        "parked_insert_s": round(insert_s, 2),
        "move_s": round(move_s, 3), "runs_moved": moved["runs_moved"],
        # The mover's own count, from its lock to its cleanup's end: what an operator
        # waits for, less the command's start-up (in move_s and wall_runs_per_s).
        "mover_s": moved["seconds"], "runs_moved_per_s": moved["runs_per_second"],
        "wall_runs_per_s": round(moved["runs_moved"] / move_s, 1) if move_s else None,
        "batches": len(moved["batches"]),
        "batch_pause_ms": _stats([bt["paused_ms"] for bt in moved["batches"]
                                  if bt["paused_ms"] is not None]),
        "rows_moved": sum(bt["rows"] or 0 for bt in moved["batches"]),
        "client_calls_during_move": len(calls),
        "client_max_pause_ms": round(max(calls, default=0.0), 1),
        "client_call_ms_during_move": _stats(calls),
        "client_call_ms_before": _stats(signaller.calls_in("before")),
        "client_errors": len(signaller.errors), "client_error_sample": signaller.errors[:3],
        "signalled_runs_completed": signalled,
        "drain_before": before, "drain_during": during, "drain_ratio": ratio,
        "tables_analyzed": autoanalyze.analyzed,
        "worker_log_problems": problems,
    }


def _insert_in_range(url: str, count: int, first: int, last: int) -> list[tuple[uuid.UUID, bool]]:
    """`count` parked runs of buckets first..last onto shard `url`, written by the
    `parked` fixture's statement; each run's id and whether it waits on a signal."""
    ms0 = time.time_ns() // 1_000_000 - count - 600_000
    out: list[tuple[uuid.UUID, bool]] = []
    bar = Progress("reshard: inserting parked runs", count)
    ids: list[uuid.UUID] = []
    nums: list[int] = []
    signal: list[bool] = []
    i = 0
    while len(out) < count:
        name, workflow_id = parked_run(i)
        bucket = bucket_for(TENANT, name, workflow_id)
        if first <= bucket <= last:
            run = new_execution_id(bucket, now_ms=ms0 + len(out))
            out.append((run, name == "park"))
            ids.append(run)
            nums.append(i)
            signal.append(name == "park")
            if len(ids) == CHUNK or len(out) == count:
                query(url, "insert_parked", {"ids": ids, "nums": nums, "on_signal": signal,
                                             "nap_s": NAP_SECONDS})
                ids, nums, signal = [], [], []
                bar.update(len(out))
        i += 1
    bar.close()
    return out


class Feeder:
    """Keeps BACKLOG `noop` jobs queued on buckets outside the moving range."""

    def __init__(self, b: Bench, first: int, last: int) -> None:
        self.b = b
        self.first, self.last = first, last
        self.started = 0
        self.queued = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._n = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="reshard-feeder", daemon=True)
        self._poller: Poller | None = None

    def start(self, poller: Poller) -> None:
        self._poller = poller
        self.thread.start()

    def done(self) -> int:
        """Jobs finished so far: started less those still queued or leased."""
        with self._lock:
            return self.started - self.queued

    def _keys(self, count: int) -> list[str]:
        keys: list[str] = []
        while len(keys) < count:
            key = f"rs-drain-{self._n}"
            self._n += 1
            if not self.first <= bucket_for("default", "noop", key) <= self.last:
                keys.append(key)
        return keys

    def _loop(self) -> None:
        assert self._poller is not None
        try:
            while not self.stop.is_set():
                polled = time.monotonic()
                queued = self._poller.total("active_tasks")
                with self._lock:
                    self.queued = queued
                if queued < BACKLOG:
                    keys = self._keys(min(500, BACKLOG - queued))
                    self.b.client.start_many("noop", [(k, None) for k in keys])
                    with self._lock:
                        self.started += len(keys)
                        self.queued += len(keys)
                time.sleep(max(0.0, polled + FEED_POLL_S - time.monotonic()))
        except BaseException as exc:  # reported by the scenario
            self.error = exc

    def window(self, seconds: float) -> dict[str, Any]:
        t0, d0 = time.monotonic(), self.done()
        time.sleep(seconds)
        return self.since(t0, d0)

    def since(self, t0: float, d0: int) -> dict[str, Any]:
        seconds, jobs = time.monotonic() - t0, self.done() - d0
        return {"seconds": round(seconds, 3), "jobs": jobs,
                "jobs_per_s": round(jobs / seconds, 1) if seconds > 0 else 0.0}


@dataclass
class Signaller:
    """`go` to each `park` run of the range, keyed, then the keys again; every call timed."""

    b: Bench
    runs: list[uuid.UUID]
    acked: list[uuid.UUID] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: list[tuple[str, float]] = field(default_factory=list)
    phase: str = "before"
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="reshard-signal", daemon=True)

    def mark(self, phase: str) -> None:
        self.phase = phase

    def calls_in(self, phase: str) -> list[float]:
        return [ms for p, ms in self.calls if p == phase]

    def _loop(self) -> None:
        # Each run once, then the same keys again (a client's retries): those must
        # collapse into the first delivery, wherever the run is by then.
        seen: set[uuid.UUID] = set()
        for run in itertools.cycle(self.runs):
            if self.stop.is_set():
                return
            phase = self.phase
            t = time.perf_counter()
            try:
                sent = self.b.client.signal(run, "go", {"n": 1}, idempotency_key=f"rs-{run}")
            except Exception as exc:  # counted: the scenario's must-be-zero figure
                self.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                if run not in seen:
                    seen.add(run)
                    self.acked.append(run)
                elif sent.delivered:
                    self.errors.append(f"a retried key delivered again to {run}")
            self.calls.append((phase, 1000 * (time.perf_counter() - t)))


def _env(b: Bench) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    return {**env, "SHARDQ_SHARDS": ",".join(b.urls)}


def _move_command(buckets: str, target: str) -> list[str]:
    return [sys.executable, "-m", "shardq.bin.cli", "--json", "shards", "move", buckets,
            "--to", target, "--grace", "0"]


def _move(b: Bench, buckets: str, target: str, feeder: Feeder
          ) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """Run the move as an operator would; its JSON, its wall time, the drain meanwhile."""
    t0, d0 = time.monotonic(), feeder.done()
    done = subprocess.run(_move_command(buckets, target), env=_env(b), capture_output=True,
                          text=True, timeout=3600, check=False)
    seconds = time.monotonic() - t0
    during = feeder.since(t0, d0)
    if done.returncode != 0:
        raise BenchError(f"reshard: shards move exited {done.returncode}: "
                         f"{done.stderr.strip()[-600:]}")
    return json.loads(done.stdout), seconds, during


def _wait_completed(b: Bench, signalled: int) -> None:
    deadline = time.monotonic() + max(60.0, signalled / 50)
    while True:
        rows = [query(u, "drain_result", {"workflow": "park", "prefix": "parked-%"})[0]
                for u in b.urls]
        completed = sum(int(r["completed"]) for r in rows)
        failed = sum(int(r["failed"]) for r in rows)
        if failed or completed > signalled:
            raise BenchError(f"reshard: {completed} signalled runs completed, {failed} failed, "
                             f"{signalled} signalled")
        if completed == signalled:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"reshard: {completed} of {signalled} signalled runs completed")
        time.sleep(0.2)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {k: round(v, 1) for k, v in percentiles(values).items()}


def _servers(urls: list[str]) -> str:
    """Whether source and target are one PostgreSQL server (host, port, socket) or two."""
    def where(url: str) -> tuple[str, ...]:
        parts = urlsplit(url)
        return (parts.hostname or "", str(parts.port or ""), parts.query)

    places = {where(u) for u in urls}
    return "separate servers" if len(places) == len(urls) else "one server, two databases"
