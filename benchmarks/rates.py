"""Rate limits, measured for the `limits` scenario (docs/flow-control.md, "Rate limits").

`rate_limit_error` (target <= 0.05): how far the rate a limiter achieves is
from its configured rate, when FLEET_WORKERS worker processes over the suite's
shards share it.

The limiter is `bench` of the suite's registry (workflows.py): RATE_PER_S steps
a second, burst 1, i.e. a slot every 5 ms. The rate is well under what the
fleet drains (thousands of one-step runs a second; a limited run costs about
two turns, the one that parks it and the one that runs its step), so the
limiter, not the fleet, sets the pace. It lives on the home shard; a step whose
slot is at most 0.25 s away waits for it on the turn's thread, a later one
parks its run until the slot, kept for it.

Two drains of `rated_runs` `rated` runs (one step under `bench`, returning
`time.time()` as it starts, so each run's output is its step's start time),
about RUN_SECONDS at the rate at full size, each by a fresh fleet of
FLEET_WORKERS processes (the standard fleet's settings otherwise), started and
ready first; before each, with no worker running, the limiter and its kept
slots are deleted (a fresh cell), and every run must complete.

- **steady** (`rate_limit_error`): the runs are started while the fleet runs,
  OFFERED times faster than the limiter's rate, in batches FEED_TICK_S apart:
  more than the limiter lets through, so a backlog of parked runs builds and
  drains as in use.
- **after a burst** (`rate_limit_burst_error`): the fleet is frozen (SIGSTOP)
  while all the runs are started and the tables analyzed, then thawed. Its
  first claims take far more runs than the limiter lets start, so parked runs
  whose slots come due wait behind the rest of the backlog for a claim: they
  start late, and the limiter does not let them catch up faster than its rate
  (a start an interval after the one before). The slots that passed unused
  meanwhile are lost, so this phase reads below the rate.

For each: the step start times sorted, the first and last TRIM of them dropped
(the fleet starting up, the last slots), achieved = (count - 1) / (t_last -
t_first) over the middle, error = |achieved / configured - 1|, rounded to 4
places. Also reported: the most starts in any 1-second window over all of them
(`worst_1s_starts`: with burst 1 the limiter allows rate + 1), the gaps
between starts, and how far the k-th start came after the k-th slot
(`behind_schedule_ms`, percentiles and at every tenth of the starts), the
slots being the first start plus k intervals.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, analyze_as_autovacuum, query
from shardq.benchmarks.measure import percentiles
from shardq.benchmarks.workflows import RATE_LIMITER, RATE_PER_S

FLEET_WORKERS = 4
"""Worker processes sharing the limiter in this phase (the standard fleet has 2)."""
TRIM = 0.1
"""The share of the start times dropped at each end before the rate is read."""
RUN_SECONDS = 10
"""About how long the full-size drain takes at the limiter's rate."""
OFFERED = 1.25
"""The steady phase starts runs this many times faster than the limiter's rate."""
FEED_TICK_S = 0.1
"""The steady phase starts a batch of runs this often."""


def rates(b: Bench) -> dict[str, Any]:
    n = b.sizes.rated_runs
    if n < 10:
        raise BenchError("limits: rate_limit_error needs at least 10 rated runs")
    steady = _drain(b, n, "rated-s-", fed=True)
    burst = _drain(b, n, "rated-b-", fed=False)
    return {
        "rate_limit_error": steady["error"],
        "rate_limit_achieved_per_s": steady["achieved_per_s"],
        "rate_limit_configured_per_s": RATE_PER_S,
        "rate_limit_worst_1s_starts": max(steady["worst_1s_starts"],
                                          burst["worst_1s_starts"]),
        "rate_limit_burst_error": burst["error"],
        "workers": FLEET_WORKERS, "shards": len(b.urls), "limiter": RATE_LIMITER,
        "burst": 1, "offered_over_rate": OFFERED, "steady": steady, "after_burst": burst,
    }


def _drain(b: Bench, n: int, prefix: str, *, fed: bool) -> dict[str, Any]:
    """`n` rated runs drained by a fresh fleet of FLEET_WORKERS: started at OFFERED x the
    rate while it runs (`fed`), or all at once while it is frozen; the starts' rate."""
    b.stop_fleet()
    b.reset(checkpoint=True)
    for url in b.urls:
        query(url, "rate_limiter_forget", {"name": RATE_LIMITER})
    fleet = b.spawn_fleet(dataclasses.replace(b.fleet_config, workers=FLEET_WORKERS))
    ready_s = fleet.wait_ready()
    time.sleep(1.5)  # every claim loop asleep on its poll; only NOTIFY wakes them
    t0 = time.time()
    if fed:
        _feed(b, n, prefix)
    else:
        with fleet.frozen():
            b.client.start_many("rated", [(f"{prefix}{i}", None) for i in range(n)])
            for url in b.urls:
                analyze_as_autovacuum(url, n / len(b.urls))
            t0 = time.time()
    b.wait_drained(n, f"limits: rated drain ({prefix})", timeout=max(120.0, 5 * n / RATE_PER_S))
    problems = b.stop_fleet()
    end = b.finished("rated", prefix, n)
    starts = sorted(float(r["started_at"]) for url in b.urls
                    for r in query(url, "rated_starts", {"prefix": prefix + "%"}))
    if len(starts) != n:
        raise BenchError(f"limits: rated drain: {len(starts)} start times for {n} runs")
    cut = int(n * TRIM)
    middle = starts[cut:n - cut]
    achieved = (len(middle) - 1) / (middle[-1] - middle[0])
    gaps = [1000 * (later - t) for t, later in itertools.pairwise(starts)]
    # Every slot given was used once (no retries, no crash), so the k-th slot is the
    # first plus k intervals, and the first run started in the first slot.
    behind = [1000 * (t - starts[0] - k / RATE_PER_S) for k, t in enumerate(starts)]
    return {
        "error": round(abs(achieved / RATE_PER_S - 1), 4),
        "achieved_per_s": round(achieved, 2),
        "worst_1s_starts": worst_window(starts, 1.0),
        "runs": n, "measured_runs": len(middle),
        "steady_s": round(middle[-1] - middle[0], 3),
        "first_start_after_start_s": round(starts[0] - t0, 3),
        "fleet_ready_s": round(ready_s, 3),
        "drain_s": round(end - t0, 3),
        "start_gap_ms": {k: round(v, 2) for k, v in percentiles(gaps, (50, 99)).items()},
        "behind_schedule_ms": {k: round(v, 1) for k, v in percentiles(behind).items()},
        "behind_schedule_ms_by_decile": [round(behind[min(n - 1, n * d // 10)], 1)
                                         for d in range(11)],
        "worker_log_problems": problems[:10],
    }


def _feed(b: Bench, n: int, prefix: str) -> None:
    """Start `n` rated runs at OFFERED x the limiter's rate, FEED_TICK_S apart in batches:
    more than the limiter lets through, so a backlog of parked runs builds as in use."""
    per_tick = max(1, round(RATE_PER_S * OFFERED * FEED_TICK_S))
    began = time.monotonic()
    for tick, first in enumerate(range(0, n, per_tick)):
        time.sleep(max(0.0, began + tick * FEED_TICK_S - time.monotonic()))
        b.client.start_many("rated", [(f"{prefix}{i}", None)
                                      for i in range(first, min(n, first + per_tick))])


def worst_window(times: list[float], width: float) -> int:
    """The most of the sorted `times` less than `width` apart from first to last."""
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        most = max(most, hi - lo + 1)
    return most
