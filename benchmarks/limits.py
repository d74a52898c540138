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
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, Poller, query
from shardq.benchmarks.measure import percentiles, wait_for

PROBE_PRIORITY = 5
PROBE_GAP_S = 0.02
FLOOD_BATCH = 1_000


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
    return {
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
