"""The `limits` scenario: flow control measured (docs/flow-control.md).

Priorities: `claim_probe` runs of priority PROBE_PRIORITY are started one at a
time, PROBE_GAP_S apart, first on an idle fleet and then during a flood of
priority-0 `noop` runs that a feeder keeps above FLOOD_FLOOR due tasks. Time to
claim is the wall time of the probe's first step (its first turn, right after
the claim) minus the time just before its `Client.start`.
`priority_p99_ratio` is the flood's p99 over the idle p99 (target <= 2). The
same probes at priority 0 during the flood show what the priority buys: they
wait behind the backlog. The flood's backlog is read when the priority probes
end: a flood that ran dry under them would measure nothing, and the scenario
fails then (the priority-0 probes wait for the backlog ahead of them, and a
feeder slowed by a busy machine may let it run low by their end: that is
reported, not refused).

Concurrency limits (issue 37), two measurements:

- `limited_over_unlimited` (target >= 0.9): the backlog drain of `noop_keyed`
  runs (one no-op step, limit 1 per key, `limited_runs` spread round robin over
  `limited_keys` keys) over the backlog drain of as many `noop` runs with the
  same inputs, same fleet, same run. As `claim`'s backlog drain: the fleet is
  frozen (SIGSTOP) while the runs are started (start_many, START_BATCH a call)
  and the tables analyzed, and the window runs from its SIGCONT to the last
  run's completion. Of a limited backlog only one run per key holds a task
  row; the rest wait in key_queue and are promoted as slots free.
- `limit_violations` (target 0): `violation_runs` `noop_keyed` runs over
  `violation_keys` keys are started, then a fleet (the standard one, but with a
  VIOLATION_LEASE_S lease, so the killed worker's leases expire within the
  drain) drains them while a sampler reads every shard every SAMPLE_S: per key,
  its task rows under a live lease, summed over the shards. A sample where any
  key holds more than its limit is a violation. During the drain one worker is
  SIGKILLed (at KILL_AT of the drain) and then the bucket range holding the
  most of the runs is moved to another shard by `shardq shards move` (as
  `reshard` does); every run must then complete exactly once. The range is
  moved back (empty) afterwards.

Then fairness between tenants (`fairness_jain`, the standard fleet; its method
in fairness.py) and rate limits (`rate_limit_error`, a fleet of four workers;
rates.py), each a module of its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import threading
import time
from collections import Counter
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, Poller, analyze_as_autovacuum, query
from shardq.benchmarks.fairness import fairness
from shardq.benchmarks.measure import CpuMeter, percentiles, wait_for
from shardq.benchmarks.rates import rates
from shardq.benchmarks.reshard import _env, _move_command
from shardq.benchmarks.workflows import KEYED_LIMIT, key_of
from shardq.shards.routing import bucket_for_key

PROBE_PRIORITY = 5
PROBE_GAP_S = 0.02
FLOOD_BATCH = 1_000
START_BATCH = 10_000
"""Runs per start_many call when a keyed or unkeyed backlog is started."""
SAMPLE_S = 0.01
"""How often the limit_violations sampler reads every shard."""
VIOLATION_LEASE_S = 10.0
"""The lease of the fleet of the violations drain: the killed worker's runs are
claimed again this long after their last heartbeat (the standard 30 s would make
the drain that much longer)."""
KILL_AT = 0.1
"""The share of the violations drain done when one worker is SIGKILLed."""
RANGE_BUCKETS = 256
"""The bucket ranges the busiest is picked from (16 at the suite's 4,096 buckets)."""
"""The bucket ranges the busiest is picked from (16 at the suite's 4,096 buckets)."""
MAX_EXAMPLES = 1_000
"""Violating samples kept with their rows (the count goes on past it)."""


def limits(b: Bench) -> dict[str, Any]:
    probes = b.sizes.limit_probes
    floor = b.sizes.flood_floor
    b.stop_fleet()
    b.reset(checkpoint=True)
    b.fleet()
    idle = _probe(b, "idle", probes)
    flood_started = time.perf_counter()
    stop = threading.Event()
    fed = itertools.count()
    feeder = threading.Thread(target=_feed, args=(b, floor, stop, fed), daemon=True)
    feeder.start()
    with Poller(b.urls) as poller:
        wait_for(lambda: poller.total("due_tasks"), floor, label="limits: flooding",
                 timeout=120)
        flooded = _probe(b, "flood", probes)
        left = poller.total("due_tasks")
        unprioritised = _probe(b, "flood-p0", probes, priority=0)
        left_after_p0 = poller.total("due_tasks")
    stop.set()
    feeder.join(30)
    flood_s = time.perf_counter() - flood_started
    b.stop_fleet()
    b.reset()
    if left < FLOOD_BATCH:
        raise BenchError(f"limits: the flood ran dry ({left} due tasks after the priority "
                         "probes)")
    ratio = flooded["p99"] / idle["p99"] if idle["p99"] else None
    unlimited = _backlog_drain(b, "noop", "unl-")
    limited = _backlog_drain(b, "noop_keyed", "lim-")
    b.reset()
    violations = _violations(b)
    fair = fairness(b)
    rated = rates(b)
    b.reset()
    drains = limited["jobs_per_s"], unlimited["jobs_per_s"]
    return {
        "limited_over_unlimited": round(drains[0] / drains[1], 3) if drains[1] else None,
        "limited_runs_per_s": drains[0], "unlimited_runs_per_s": drains[1],
        "limited_drain": limited, "unlimited_drain": unlimited,
        "limit_violations": violations["violations"],
        "limit_most_live": violations["most_live"],
        "limit_samples": violations["samples"],
        "violations_drain": violations,
        "fairness_jain": fair["fairness_jain"],
        "fairness_window_runs": fair["fairness_window_runs"],
        "fairness": fair,
        **{k: rated[k] for k in ("rate_limit_error", "rate_limit_achieved_per_s",
                                 "rate_limit_configured_per_s", "rate_limit_burst_error",
                                 "rate_limit_worst_1s_starts")},
        "rates": rated,
        "probes": probes, "probe_priority": PROBE_PRIORITY, "flood_floor": floor,
        "flood_runs_started": next(fed) * FLOOD_BATCH, "flood_s": round(flood_s, 1),
        "flood_due_after_priority_probes": left, "flood_due_at_end": left_after_p0,
        "idle_time_to_claim_ms": idle, "flood_time_to_claim_ms": flooded,
        "flood_p0_time_to_claim_ms": unprioritised,
        "priority_p99_ratio": round(ratio, 3) if ratio is not None else None,
    }


def _probe(b: Bench, label: str, count: int,
           priority: int = PROBE_PRIORITY) -> dict[str, float]:
    """Start `count` probes one at a time; their time to claim, in ms."""
    sent: dict[str, float] = {}
    for i in range(count):
        key = f"{label}-{i}"
        sent[key] = time.time()
        b.client.start("claim_probe", key, priority=priority)
        time.sleep(PROBE_GAP_S)

    def done() -> int:
        return sum(1 for url in b.urls for r in query(url, "claim_probe_outputs")
                   if r["workflow_id"] in sent)

    wait_for(done, count, label=f"limits: {label} probes", timeout=120)
    waited = [1000 * (r["claimed_at"] - sent[r["workflow_id"]])
              for url in b.urls for r in query(url, "claim_probe_outputs")
              if r["workflow_id"] in sent]
    return {k: round(v, 3) for k, v in percentiles(waited).items()}


def _feed(b: Bench, floor: int, stop: threading.Event, fed: itertools.count[int]) -> None:
    """Keep at least `floor` priority-0 `noop` runs due until `stop`."""
    with Poller(b.urls) as poller:
        while not stop.is_set():
            if poller.total("due_tasks") >= 2 * floor:
                stop.wait(0.05)
                continue
            batch = next(fed)
            b.client.start_many("noop", [(f"flood-{batch}-{i}", None)
                                         for i in range(FLOOD_BATCH)])


def _inputs(prefix: str, n: int, keys: int) -> list[tuple[str, Any]]:
    """Run i has key i % keys: every key gets n / keys runs, started interleaved."""
    return [(f"{prefix}{i}", {"k": i % keys}) for i in range(n)]


def _start(b: Bench, workflow: str, items: list[tuple[str, Any]]) -> float:
    """Start `items` in START_BATCH calls of start_many; seconds it took."""
    t = time.perf_counter()
    for lo in range(0, len(items), START_BATCH):
        b.client.start_many(workflow, items[lo:lo + START_BATCH])
    return time.perf_counter() - t


def _analyze(b: Bench, n: int) -> None:
    """Statistics after a bulk start, as autovacuum keeps them; both sides alike."""
    for url in b.urls:
        analyze_as_autovacuum(url, n / len(b.urls))
        query(url, "analyze_keyed")


def _backlog_drain(b: Bench, workflow: str, prefix: str) -> dict[str, Any]:
    """`limited_runs` runs of `workflow` (inputs keyed over `limited_keys`) started while
    the standard fleet is frozen, timed from its thaw to the last completion."""
    n, keys = b.sizes.limited_runs, b.sizes.limited_keys
    fleet = b.fleet()
    b.reset(checkpoint=True)
    time.sleep(1.5)  # every claim loop asleep on its poll; only NOTIFY wakes them
    items = _inputs(prefix, n, keys)
    with fleet.frozen():
        insert_s = _start(b, workflow, items)
        _analyze(b, n)
        meter, t0 = CpuMeter(fleet.pids).start(), time.time()
    b.wait_drained(n, f"limits: {workflow} drain")
    cpu = meter.stop(n)
    end = b.finished(workflow, prefix, n)
    _check_empty(b, workflow)
    seconds = end - t0
    return {"workflow": workflow, "jobs": n, "keys": keys,
            "limit": KEYED_LIMIT if workflow == "noop_keyed" else None,
            "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds, 1),
            "insert_s": round(insert_s, 3), "cpu": cpu}


def _check_empty(b: Bench, label: str) -> None:
    left = [query(u, "keyed_leftovers")[0] for u in b.urls]
    if any(int(r["tasks"]) or int(r["waiting"]) for r in left):
        raise BenchError(f"limits: {label}: rows left after the drain: {left}")


class Sampler:
    """Every SAMPLE_S, every shard's keyed task rows under a live lease, per key, summed
    over the shards; a sample where a key holds more than `limit` is a violation."""

    def __init__(self, urls: list[str], limit: int) -> None:
        self.limit = limit
        self.samples = 0
        self.violations = 0
        self.most_live = 0
        self.errors: list[str] = []
        self.examples: list[dict[str, Any]] = []
        self.gaps: list[float] = []
        self.stop = threading.Event()
        self._poller = Poller(urls)
        self.thread = threading.Thread(target=self._loop, name="limits-sampler", daemon=True)

    def _loop(self) -> None:
        due = last = time.monotonic()
        try:
            while not self.stop.is_set():
                began = time.time()
                try:
                    per_shard = self._poller.each("keyed_live_leases")
                except Exception as exc:  # reported; a sample missed
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    per_shard = None
                now = time.monotonic()
                if per_shard is not None:
                    self._record(per_shard, began)
                    self.gaps.append(1000 * (now - last))
                    last = now
                due += SAMPLE_S
                due = max(due, now)
                time.sleep(max(0.0, due - time.monotonic()))
        finally:
            self._poller.close()

    def _record(self, per_shard: list[list[dict[str, Any]]], started: float) -> None:
        # A run counts once: during a move its task row is on the source and on the
        # target (a keyed run's lease moves with it), one run holding one slot.
        live: dict[str, set[str]] = {}
        for rows in per_shard:
            for r in rows:
                live.setdefault(r["key"], set()).update(r["ids"])
        self.samples += 1
        most = max((len(ids) for ids in live.values()), default=0)
        self.most_live = max(self.most_live, most)
        over = {k: sorted(ids) for k, ids in live.items() if len(ids) > self.limit}
        if over:
            self.violations += 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append({"at": round(started, 3), "over": over})

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _busiest_range(b: Bench, n: int, keys: int) -> tuple[int, int, str, str, int, int]:
    """The RANGE_BUCKETS-wide range holding the most of the runs: its first and last
    bucket, its shard, another shard to move it to, its runs and its keys."""
    per_key = Counter(i % keys for i in range(n))
    ranges: Counter[tuple[int, int]] = Counter()
    key_count: Counter[tuple[int, int]] = Counter()
    for k, runs in per_key.items():
        bucket = bucket_for_key(key_of({"k": k})[0])
        first = bucket - bucket % RANGE_BUCKETS
        ranges[(first, first + RANGE_BUCKETS - 1)] += runs
        key_count[(first, first + RANGE_BUCKETS - 1)] += 1
    (first, last), runs = ranges.most_common(1)[0]
    shards = b.client.map.shards
    owner = b.client.map.for_bucket(first)
    if b.client.map.for_bucket(last) != owner:
        raise BenchError(f"limits: buckets {first}-{last} span two shards")
    target = next(s for s in shards if s != owner)
    return first, last, owner.name, target.name, runs, key_count[(first, last)]


def _violations(b: Bench) -> dict[str, Any]:
    n, keys = b.sizes.violation_runs, b.sizes.violation_keys
    if len(b.urls) < 2:
        raise BenchError("limits: the violations drain moves a range: it needs two shards")
    prefix = "lv-"
    b.stop_fleet()
    b.reset(checkpoint=True)
    _start(b, "noop_keyed", _inputs(prefix, n, keys))
    _analyze(b, n)
    first, last, source, target, range_runs, range_keys = _busiest_range(b, n, keys)
    config = dataclasses.replace(b.fleet_config, lease_s=VIOLATION_LEASE_S)
    with Sampler(b.urls, KEYED_LIMIT) as sampler, Poller(b.urls) as poller:
        t0 = time.time()
        fleet = b.spawn_fleet(config)
        fleet.wait_ready()

        def done() -> int:
            return n - poller.total("keyed_open")

        wait_for(done, int(n * KILL_AT), label="limits: violations drain",
                 timeout=max(120.0, n / 20))
        victim = fleet.procs[0]
        victim.kill()
        victim.wait()
        killed_at, done_at_kill = time.time() - t0, done()
        moved_at = time.time() - t0
        moving = subprocess.run(_move_command(f"{first}-{last}", target), env=_env(b),
                                capture_output=True, text=True, timeout=3600, check=False)
        move_s = time.time() - t0 - moved_at
        done_after_move = done()
        if moving.returncode != 0:
            raise BenchError(f"limits: shards move exited {moving.returncode}: "
                             f"{moving.stderr.strip()[-600:]}")
        moved = json.loads(moving.stdout)
        wait_for(done, n, label="limits: violations drain", timeout=max(120.0, n / 20),
                 interval=0.1)
    problems = b.stop_fleet()
    end = b.finished("noop_keyed", prefix, n)
    _check_empty(b, "violations drain")
    b.reset()
    back = subprocess.run(_move_command(f"{first}-{last}", source), env=_env(b),
                          capture_output=True, text=True, timeout=600, check=False)
    if back.returncode != 0:
        raise BenchError(f"limits: moving the (empty) range back failed: "
                         f"{back.stderr.strip()[-600:]}")
    gaps = percentiles(sampler.gaps)
    return {
        "runs": n, "keys": keys, "limit": KEYED_LIMIT, "lease_s": VIOLATION_LEASE_S,
        "violations": sampler.violations, "most_live": sampler.most_live,
        "samples": sampler.samples, "sample_errors": len(sampler.errors),
        "sample_error_sample": sampler.errors[:3],
        "sample_gap_ms": {k: round(v, 1) for k, v in gaps.items()},
        "violation_examples": sampler.examples[:10],
        "seconds": round(end - t0, 3),
        "killed_worker_at_s": round(killed_at, 3), "done_at_kill": done_at_kill,
        "moved_buckets": [first, last], "moved_from": source, "moved_to": target,
        "range_runs": range_runs, "range_keys": range_keys,
        "move_began_at_s": round(moved_at, 3), "move_s": round(move_s, 3),
        "runs_moved": moved.get("runs_moved"), "done_after_move": done_after_move,
        "completed": n, "worker_log_problems": problems[:10],
    }
