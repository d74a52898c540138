"""Fairness between tenants, measured for the `limits` scenario (docs/flow-control.md,
"Fairness between tenants").

`fairness_jain` (target >= 0.95): Jain's fairness index over the tenants' shares
of the runs claimed while one tenant floods the queue at FLOOD_FACTOR times the
others' work, every weight equal (1).

The standard fleet is frozen (SIGSTOP), as for the backlog drains of limits.py.
While it sleeps, `fairness_runs` `noop` runs of tenant FLOOD_TENANT are started
first (START_BATCH a `start_many` call), then SMALL_TENANTS other tenants
(`t-1` ... `t-9`) start `fairness_runs` / FLOOD_FACTOR runs each, in that
order; the queue tables are analyzed as autovacuum would after the insert. So
every small tenant's runs are due after all of the flood's: a claim that took
priority-0 work in due order (FIFO), as before fairness, would give them
nothing until the flood was gone. The fleet is then thawed and the whole
backlog drained; every run must complete.

The window runs from the thaw to the moment the first small tenant had no work
left: the recorded time of its last run's `run.completed` event, the earliest
such time among the small tenants. Throughout it every tenant had runs left
(the flood must have some left after it: the scenario fails if it ran dry).
Each tenant's share is its runs completed within the window, read from the
shards after the drain (`tenant_outcomes`: the tenant of each run and when its
outcome was recorded). A run is completed a turn after its claim, alike for
every tenant, so the completions count the claims up to the few turns in
flight at the window's end.

Jain's index over the n = SMALL_TENANTS + 1 counts x_i is
(sum x_i)^2 / (n * sum x_i^2): 1 when every tenant got the same, 1/n when one
got it all. Shared fairly, the flood gets what each small tenant gets (about
`fairness_runs` / FLOOD_FACTOR each) and the index is close to 1; in due order
the flood gets every run until the first small tenant's turn, and the index is
close to 1/n (0.1).

Reported: `fairness_jain`, `fairness_window_runs` (the runs completed in the
window, all tenants), each tenant's count, the window's length, the tenant
that closed it, the flood's runs left after it, and the whole drain.
"""

from __future__ import annotations

import time
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, analyze_as_autovacuum, query
from shardq.benchmarks.measure import CpuMeter

FLOOD_TENANT = "flood"
SMALL_TENANTS = 9
FLOOD_FACTOR = 100
"""The flood tenant starts this many times the runs of each other tenant."""
PREFIX = "fair-"
START_BATCH = 10_000
"""Runs per start_many call."""


def fairness(b: Bench) -> dict[str, Any]:
    flood_n = b.sizes.fairness_runs
    small_n = max(1, flood_n // FLOOD_FACTOR)
    small = [f"t-{i}" for i in range(1, SMALL_TENANTS + 1)]
    tenants = [FLOOD_TENANT, *small]
    runs = {t: flood_n if t == FLOOD_TENANT else small_n for t in tenants}
    total = sum(runs.values())
    fleet = b.fleet()
    b.reset(checkpoint=True)
    time.sleep(1.5)  # every claim loop asleep on its poll; only NOTIFY wakes them
    with fleet.frozen():
        t = time.perf_counter()
        for tenant in tenants:  # the flood first: its runs are due before the others'
            items = [(f"{PREFIX}{tenant}-{i}", None) for i in range(runs[tenant])]
            for lo in range(0, len(items), START_BATCH):
                b.client.start_many("noop", items[lo:lo + START_BATCH], tenant=tenant)
        insert_s = time.perf_counter() - t
        for url in b.urls:
            analyze_as_autovacuum(url, total / len(b.urls))
        meter, t0 = CpuMeter(fleet.pids).start(), time.time()
    b.wait_drained(total, "limits: fairness drain")
    cpu = meter.stop(total)
    finished = _finished(b, runs)
    # The window closes when the first small tenant's last run completed.
    closed_by = min(small, key=lambda t: max(finished[t]))
    end = max(finished[closed_by])
    counts = {t: sum(1 for f in finished[t] if f <= end) for t in tenants}
    flood_left = runs[FLOOD_TENANT] - counts[FLOOD_TENANT]
    if flood_left <= 0:
        raise BenchError(f"limits: fairness: the flood ran dry within the window "
                         f"({counts[FLOOD_TENANT]} of {runs[FLOOD_TENANT]} runs)")
    last = max(max(f) for f in finished.values())
    return {
        "fairness_jain": round(jain(list(counts.values())), 4),
        "fairness_window_runs": sum(counts.values()),
        "window_counts": counts,
        "window_s": round(end - t0, 3),
        "window_closed_by": closed_by,
        "flood_left_after_window": flood_left,
        "flood_runs": flood_n, "small_tenant_runs": small_n, "small_tenants": SMALL_TENANTS,
        "drain_s": round(last - t0, 3), "drain_runs_per_s": round(total / (last - t0), 1),
        "insert_s": round(insert_s, 3), "cpu": cpu,
    }


def jain(counts: list[int]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all are equal."""
    squares = sum(x * x for x in counts)
    return sum(counts) ** 2 / (len(counts) * squares) if squares else 0.0


def _finished(b: Bench, runs: dict[str, int]) -> dict[str, list[float]]:
    """Per tenant, the epoch times its runs' outcomes were recorded; every run must
    have completed."""
    rows = [r for url in b.urls
            for r in query(url, "tenant_outcomes", {"workflow": "noop", "prefix": PREFIX + "%"})]
    failed = [r for r in rows if r["kind"] != "run.completed"]
    finished: dict[str, list[float]] = {t: [] for t in runs}
    for r in rows:
        if r["kind"] == "run.completed":
            finished.setdefault(r["tenant"], []).append(float(r["finished"]))
    short = {t: f"{len(finished[t])} of {n}" for t, n in runs.items() if len(finished[t]) != n}
    if failed or short:
        raise BenchError(f"limits: fairness drain: {len(failed)} runs failed, not all "
                         f"completed: {short}; e.g. {failed[:3]}")
    return finished
