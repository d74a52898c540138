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

With no worker running, the limiter and its kept slots are deleted from every
shard (a fresh cell: nothing a previous run left). A fleet of FLEET_WORKERS
processes (the standard fleet's settings otherwise) is started, and declares
the limiter as it starts; once it is ready, it is frozen (SIGSTOP, as for the
backlog drains of limits.py: its start-up is not in the measurement) while
`rated_runs` `rated` runs are started (one step under `bench`, returning
`time.time()` as it starts, so each run's output is its step's start time),
about RUN_SECONDS at the rate at full size, and the tables analyzed. Thawed, it
drains them: the first turns take slots up to 0.25 s ahead and wait, the rest
of the backlog takes slots further ahead and parks, and the parked runs come
back as their slots come due. Every run must complete.

The steady state: the step start times sorted, the first and last TRIM of them
dropped (the fleet starting up, the last slots), achieved = (count - 1) /
(t_last - t_first) over the middle; `rate_limit_error` = |achieved /
configured - 1|, rounded to 4 places. Also reported: `rate_limit_achieved_per_s`,
`rate_limit_configured_per_s`, and the most starts in any 1-second window over
all of them (`worst_1s_starts`; with burst 1 the limiter gives at most rate + 1
slots in a second; starts come a little after their slots, so a late claim may
bunch a few), the gaps between starts, and how far the k-th start came after
the k-th slot (`behind_schedule_ms`, percentiles and at every tenth of the
starts): the slots are the first start plus k intervals, since every slot given
was used once. A start's lateness that shrinks over the window squeezes the
middle's starts together, and reads as a rate above the limiter's: parked runs
come due at their park's commit time plus their wait (commit_turns schedules a
task by a delay, not at the slot's time), so a park that committed late (the
fleet's first claims park hundreds of runs at once) starts its step late by as
much.
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
PREFIX = "rated-"


def rates(b: Bench) -> dict[str, Any]:
    n = b.sizes.rated_runs
    if n < 10:
        raise BenchError("limits: rate_limit_error needs at least 10 rated runs")
    b.stop_fleet()
    b.reset(checkpoint=True)
    for url in b.urls:
        query(url, "rate_limiter_forget", {"name": RATE_LIMITER})
    fleet = b.spawn_fleet(dataclasses.replace(b.fleet_config, workers=FLEET_WORKERS))
    ready_s = fleet.wait_ready()
    time.sleep(1.5)  # every claim loop asleep on its poll; only NOTIFY wakes them
    with fleet.frozen():
        b.client.start_many("rated", [(f"{PREFIX}{i}", None) for i in range(n)])
        for url in b.urls:
            analyze_as_autovacuum(url, n / len(b.urls))
        t0 = time.time()
    b.wait_drained(n, "limits: rated drain", timeout=max(120.0, 5 * n / RATE_PER_S))
    problems = b.stop_fleet()
    end = b.finished("rated", PREFIX, n)
    starts = sorted(float(r["started_at"]) for url in b.urls
                    for r in query(url, "rated_starts", {"prefix": PREFIX + "%"}))
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
        "rate_limit_error": round(abs(achieved / RATE_PER_S - 1), 4),
        "rate_limit_achieved_per_s": round(achieved, 2),
        "rate_limit_configured_per_s": RATE_PER_S,
        "worst_1s_starts": worst_window(starts, 1.0),
        "runs": n, "measured_runs": len(middle), "workers": FLEET_WORKERS,
        "shards": len(b.urls), "limiter": RATE_LIMITER, "burst": 1,
        "steady_s": round(middle[-1] - middle[0], 3),
        "first_start_after_thaw_s": round(starts[0] - t0, 3),
        "fleet_ready_s": round(ready_s, 3),
        "drain_s": round(end - t0, 3),
        "start_gap_ms": {k: round(v, 2) for k, v in percentiles(gaps, (50, 99)).items()},
        "behind_schedule_ms": {k: round(v, 1) for k, v in percentiles(behind).items()},
        "behind_schedule_ms_by_decile": [round(behind[min(n - 1, n * d // 10)], 1)
                                         for d in range(11)],
        "worker_log_problems": problems[:10],
    }


def worst_window(times: list[float], width: float) -> int:
    """The most of the sorted `times` less than `width` apart from first to last."""
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        most = max(most, hi - lo + 1)
    return most
