"""Fairness between tenants, measured for the `limits` scenario (docs/flow-control.md,
"Fairness between tenants").

`fairness_jain` (target >= 0.95): Jain's fairness index over the tenants' shares
of the runs claimed while one tenant floods the queue at FLOOD_FACTOR times the
others' work, every weight equal (1).

The standard fleet is frozen (SIGSTOP), as for the backlog drains of limits.py.
While it sleeps, `fairness_runs` runs of tenant FLOOD_TENANT are started first
(START_BATCH a `start_many` call), then SMALL_TENANTS other tenants (`t-1` ...
`t-9`) start `fairness_runs` / FLOOD_FACTOR runs each, in that order; the queue
tables are analyzed as autovacuum would after the insert. So every small
tenant's runs are due after all of the flood's: a claim that took priority-0
work in due order (FIFO), as before fairness, would give them nothing until
the flood was gone. The fleet is then thawed and the whole backlog drained;
every run must complete.

The runs are `claim_probe` runs (workflows.py): one step, like `noop`, whose
output is the wall time it ran, on the run's first turn right after its claim.
That time stands for the claim. (A run's completion comes later, by its turn
and its commit: a window read from completions holds claims made after it.)

The window runs from the thaw to the first moment a small tenant had no run
left to claim on some shard: per shard and small tenant, the time its last run
there was claimed; the earliest of them. Throughout the window every tenant had
runs to claim on every shard, which is what a claim shares: fairness is kept
per shard, within each claim (docs/flow-control.md). The flood must have runs
left after it (the scenario fails if it ran dry). Each tenant's share is its
runs claimed within the window on all shards, read from the shards after the
drain (`tenant_claims`: each run's tenant and claim time).

Jain's index over the n = SMALL_TENANTS + 1 counts x_i is
(sum x_i)^2 / (n * sum x_i^2): 1 when every tenant got the same, 1/n when one
got it all. Shared fairly, the flood gets what each small tenant gets and the
index is close to 1; in due order the flood gets every run until the first
small tenant's turn, and the index is close to 1/n (0.1).

Also reported (`until_first_done`): the same index over a longer window, to the
moment the first small tenant had no run left on any shard. A tenant's runs
split over the shards by their keys' buckets, not evenly (at 100 runs a
tenant, 36 on one shard and 64 on the other happens), and the shards are not
claimed at one pace (a worker's turns go to whichever shard's loop claims
first); a shard where the small tenants ran out gives the rest of its claims
to the flood, rightly, while the other still shares. That window shows what a
tenant sees over the whole deployment; its index moves with those two splits
from run to run.

Reported: `fairness_jain`, `fairness_window_runs` (the runs claimed in the
window, all tenants), each tenant's count, per shard too, the window's length,
the tenant and shard that closed it, the flood's runs left after it, and
`until_first_done`.
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
WORKFLOW = "claim_probe"
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
                b.client.start_many(WORKFLOW, items[lo:lo + START_BATCH], tenant=tenant)
        insert_s = time.perf_counter() - t
        for url in b.urls:
            analyze_as_autovacuum(url, total / len(b.urls))
        meter, t0 = CpuMeter(fleet.pids).start(), time.time()
    b.wait_drained(total, "limits: fairness drain")
    cpu = meter.stop(total)
    claimed = _claimed(b, runs)
    # Closed when a small tenant first had no run left on some shard ...
    shard, closed_by = min(((sh, t) for (sh, t) in claimed if t != FLOOD_TENANT),
                           key=lambda k: max(claimed[k]))
    end = max(claimed[(shard, closed_by)])
    window = _window(claimed, tenants, end)
    flood_left = runs[FLOOD_TENANT] - window["counts"][FLOOD_TENANT]
    if flood_left <= 0:
        raise BenchError(f"limits: fairness: the flood ran dry within the window "
                         f"({runs[FLOOD_TENANT]} runs)")
    # ... and when a small tenant first had none left anywhere.
    everywhere = {t: max(max(c) for (_, u), c in claimed.items() if u == t) for t in small}
    done_by = min(small, key=lambda t: everywhere[t])
    later = _window(claimed, tenants, everywhere[done_by])
    last = max(max(c) for c in claimed.values())
    return {
        "fairness_jain": window["jain"],
        "fairness_window_runs": window["runs"],
        "window_counts": window["counts"],
        "window_counts_by_shard": window["by_shard"],
        "window_s": round(end - t0, 3),
        "window_closed_by": {"tenant": closed_by, "shard": f"shard-{shard}"},
        "flood_left_after_window": flood_left,
        "until_first_done": {**later, "s": round(everywhere[done_by] - t0, 3),
                             "closed_by": done_by},
        "flood_runs": flood_n, "small_tenant_runs": small_n, "small_tenants": SMALL_TENANTS,
        "runs_by_shard": {f"shard-{sh}": {t: len(claimed.get((sh, t), []))
                                                         for t in tenants}
                          for sh in range(len(b.urls))},
        "last_claim_s": round(last - t0, 3),
        "insert_s": round(insert_s, 3), "cpu": cpu,
    }


def _window(claimed: dict[tuple[int, str], list[float]], tenants: list[str],
            end: float) -> dict[str, Any]:
    """Each tenant's runs claimed up to `end` (all shards, and per shard), their index."""
    by_shard: dict[str, dict[str, int]] = {}
    counts = dict.fromkeys(tenants, 0)
    for (shard, tenant), times in claimed.items():
        n = sum(1 for c in times if c <= end)
        by_shard.setdefault(f"shard-{shard}", {})[tenant] = n
        counts[tenant] += n
    return {"jain": round(jain(list(counts.values())), 4), "runs": sum(counts.values()),
            "counts": counts, "by_shard": by_shard}


def jain(counts: list[int]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all are equal."""
    squares = sum(x * x for x in counts)
    return sum(counts) ** 2 / (len(counts) * squares) if squares else 0.0


def _claimed(b: Bench, runs: dict[str, int]) -> dict[tuple[int, str], list[float]]:
    """Per shard (its index) and tenant, the epoch times its runs were claimed; every run
    must have completed."""
    claimed: dict[tuple[int, str], list[float]] = {}
    failed: list[dict[str, Any]] = []
    for shard, url in enumerate(b.urls):
        for r in query(url, "tenant_claims", {"prefix": PREFIX + "%"}):
            if r["kind"] != "run.completed":
                failed.append(r)
            else:
                claimed.setdefault((shard, r["tenant"]), []).append(float(r["claimed_at"]))
    got = {t: sum(len(c) for (_, u), c in claimed.items() if u == t) for t in runs}
    short = {t: f"{got[t]} of {n}" for t, n in runs.items() if got[t] != n}
    if failed or short:
        raise BenchError(f"limits: fairness drain: {len(failed)} runs failed, not all "
                         f"completed: {short}; e.g. {failed[:3]}")
    return claimed
