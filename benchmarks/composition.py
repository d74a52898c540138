"""The `composition` scenario: child workflows and schedules measured
(docs/composition.md, docs/schedules.md).

`fanin_10k_s`: one `fanin_parent` run on shard 0 starts `fanin_children`
(10,000 at full size) `noop` children in one `start_children` call, their keys
spread over every shard, and waits for all of them; seconds from just before
its `Client.start` to its completion (the run.completed event's time). The
children on the parent's shard start in its commit, the others through the
outbox and the relay; each child's outcome comes back the same way, and the
parent's one wait row counts them down. `fanin_over_drain` (target <= 1.5)
divides it by the time the same fleet takes, in the same run, to drain as many
independent `noop` runs started by one `start_many` call (the same work without
a parent: start, one step, commit). Each is measured twice, alternated (drain,
fan-in, fan-in, drain), and each key is the median of its two: one fan-in against
one drain swung from 1.96 to 2.64 between runs on one machine, mostly with the
drain (`drain_rounds_s`, `fanin_rounds_s`, `fanin_timelines` give every round).

`cancel_tree_s`: a tree of `tree_node` runs, the root on shard 0 with TREE_WIDTHS
children per level (1 + 9 + 990 = 1,000 runs over three levels, on every
shard), whose leaves park; once every run is parked the root is cancelled, and
the time runs from just before `Client.cancel` until no run of the tree is live
(read every POLL_S from every shard: the tree is all they hold, so no task or
wait row left means every run ended). `cancel_tree_left` must be 0: a count
left after CANCEL_TIMEOUT_S is runs that escaped the cancel.

`fanin_cpu_over_drain`: the CPU-seconds the workers, the relay and PostgreSQL spent
during the fan-ins over those they spent during the drains (`fanin_cpu`,
`drain_cpu`: CpuMeter's breakdowns of each round, the relay counted with the
workers). On two cores the fan-in cannot be much faster than its CPU allows: this
says how much of `fanin_over_drain` is work rather than waiting.

The standard fleet, and one relay process (its safety poll 60 s: it moves rows
on the outbox's NOTIFY).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, Poller, query
from shardq.benchmarks.fleet import FleetConfig, RelayFleet
from shardq.benchmarks.measure import CpuMeter, percentiles, wait_for

SCHEDULE_LEAD_S = 8.0
"""How far ahead the schedules' common tick is set: the fleet is up and idle by then."""
SCHEDULE_TIMEOUT_S = 120.0
KILL_AT = 0.25
"""The share of the ticks started when one worker is SIGKILLed."""
TREE_WIDTHS = [9, 110]
"""Children per level below the root: 1 + 9 + 9 * 110 = 1,000 runs."""
POLL_S = 0.05
TICK_POLL_S = 0.5
"""How often the schedules' count is read once a worker is killed: it only ends the wait."""
CANCEL_TIMEOUT_S = 300.0
PAIRS_ORDER = ("drain", "fanin", "fanin", "drain")
"""The drain and the fan-in alternated, each twice, each first once: a drift of the
machine over the scenario weighs on both sides alike."""


def composition(b: Bench) -> dict[str, Any]:
    """fanin_10k_s beside the drain of as many runs, cancel_tree_s, then the schedules."""
    if len(b.urls) < 2:
        raise BenchError("children needs two shards or more")
    fleet = b.fleet()
    relays = RelayFleet(b.urls, FleetConfig(workers=1, concurrency=0, batch_size=500,
                                            poll_interval=60.0)).start()
    try:
        relays.wait_ready()
        n = b.sizes.fanin_children
        processes = [*fleet.pids, *relays.pids]
        took: dict[str, list[float]] = {"drain": [], "fanin": []}
        cpu: dict[str, list[dict[str, Any]]] = {"drain": [], "fanin": []}
        timelines: list[dict[str, Any]] = []
        for side in PAIRS_ORDER:
            b.reset()
            meter = CpuMeter(processes).start()
            if side == "drain":
                took[side].append(_drain(b, n))
            else:
                seconds, timeline = _fanin(b, n)
                took[side].append(seconds)
                timelines.append(timeline)
            cpu[side].append(meter.stop(n))
        drain_s, fanin_s = statistics.median(took["drain"]), statistics.median(took["fanin"])
        b.reset()
        same_s = _fanin_one_shard(b, n)
        b.reset()
        tree = _cancel_tree(b)
        problems = relays.errors()
    finally:
        relays.stop()
    ticks = _schedules(b, b.sizes.schedules)
    if problems:
        raise BenchError(f"the relay failed: {problems}")
    return {"fanin_children": n, "fanin_10k_s": round(fanin_s, 3),
            "drain_same_runs_s": round(drain_s, 3),
            "fanin_over_drain": round(fanin_s / drain_s, 3) if drain_s > 0 else None,
            "drain_rounds_s": [round(t, 3) for t in took["drain"]],
            "fanin_rounds_s": [round(t, 3) for t in took["fanin"]],
            "fanin_timelines": timelines, "drain_cpu": cpu["drain"], "fanin_cpu": cpu["fanin"],
            "fanin_cpu_over_drain": _cpu_ratio(cpu["fanin"], cpu["drain"]),
            "fanin_one_shard_s": round(same_s, 3),
            "fanin_one_shard_over_drain": round(same_s / drain_s, 3) if drain_s > 0 else None,
            **tree, **ticks}


def _cpu_ratio(fanin: list[dict[str, Any]], drain: list[dict[str, Any]]) -> float | None:
    """The fan-ins' CPU-seconds (workers, relay, PostgreSQL) over the drains', summed
    over the rounds of each."""
    def spent(cpus: list[dict[str, Any]]) -> float:
        return sum(float(cpu["workers_cpu_s"]) + float(cpu["postgres_cpu_s"]) for cpu in cpus)
    return round(spent(fanin) / spent(drain), 3) if spent(drain) > 0 else None


def _schedules(b: Bench, n: int) -> dict[str, Any]:
    """`n` schedules due at one second, started by the fleet's tickers while one worker
    is SIGKILLed: lag p99, duplicates and misses (one run per tick, no more, no less).

    The progress polls count rows over held connections (every POLL_S until the kill,
    every TICK_POLL_S after); the lags and the per-schedule count are read once, at
    the end: reading 60,000 lags every 50 ms from fresh connections loaded the very
    shards the tickers write to (a fifth of their busy backends' samples)."""
    b.stop_fleet()
    b.reset()
    prefix = "bs-"
    home = b.client.map.home_shard.url
    (row,) = query(home, "bulk_schedules", {"n": n, "prefix": prefix,
                                            "lead_s": SCHEDULE_LEAD_S})
    tick = float(row["tick"])
    fleet = b.fleet()
    time.sleep(max(0.0, tick - time.time()))

    def counted() -> tuple[int, int, list[float]]:
        found = [query(u, "tick_runs", {"prefix": prefix + "%", "tick": tick})[0]
                 for u in b.urls]
        return (sum(int(r["runs"]) for r in found), sum(int(r["schedules"]) for r in found),
                [float(x) for r in found for x in r["lags"]])

    with Poller(b.urls) as poller:
        wait_for(lambda: poller.total("tick_count"), int(n * KILL_AT),
                 label="schedules: first ticks", timeout=120.0, interval=POLL_S)
        victim = fleet.procs[0]
        victim.kill()
        victim.wait()
        killed_at = time.time() - tick
        deadline = time.time() + SCHEDULE_TIMEOUT_S
        while poller.total("tick_count") < n and time.time() < deadline:
            time.sleep(TICK_POLL_S)
    time.sleep(1.0)  # a duplicate would be a second run of a tick already counted
    runs, schedules, lags = counted()
    while schedules < n and time.time() < deadline:  # n runs, but a tick twice: wait on
        time.sleep(1.0)
        runs, schedules, lags = counted()
    b.stop_fleet()  # one worker down: the next scenario starts a whole fleet
    lag = percentiles(lags)
    return {"schedules": n, "schedules_due_lag_p99_s": round(lag.get("p99", math.nan), 3),
            "schedules_due_lag_p50_s": round(lag.get("p50", math.nan), 3),
            "schedule_duplicates": runs - schedules, "schedule_misses": n - schedules,
            "schedule_killed_worker_at_s": round(killed_at, 3)}


def _drain(b: Bench, n: int) -> float:
    prefix = "fd-"
    started = time.time()
    b.client.start_many("noop", [(f"{prefix}{i}", None) for i in range(n)])
    # Polled as the fan-in is (a light query over held connections): a join of
    # runs and history every 20 ms from fresh connections slowed the drain it
    # timed. The time is the last run's completion event's, not the poll's.
    b.wait_drained(n, "children: drain", timeout=max(120.0, n / 50))
    return b.finished("noop", prefix, n) - started


def _fanin(b: Bench, n: int) -> tuple[float, dict[str, Any]]:
    """The parent's seconds, and where they went: from its start to each shard's
    first and last child created and ended, the last child ended, and the parent
    ended. A child is created at its creating transaction's start: the children
    on the parent's shard all read as created when the parent's commit began,
    and are first seen by workers when it ends, which their first end bounds."""
    started = time.time()
    run = b.client.start("fanin_parent", "fanin-root", {"n": n, "prefix": "fc-"})
    done = b.client.wait(run.execution_id, timeout=max(300.0, n / 20), poll=0.05)
    if done.output != n:
        raise BenchError(f"fanin: the parent ended {done.state} with {done.output!r}, "
                         f"expected {n} children completed")
    ended = b.finished("fanin_parent", "fanin-root", 1)
    last_child = b.finished("noop", "fc-", n)
    timeline: dict[str, Any] = {"last_child_ended_s": round(last_child - started, 3),
                                "parent_ended_s": round(ended - started, 3)}
    for index, url in enumerate(b.urls):
        (span,) = query(url, "children_span", {"workflow": "noop", "prefix": "fc-%"})
        for what in ("created", "ended"):
            if span[f"first_{what}"] is not None:
                timeline[f"shard{index}_children_{what}_s"] = [
                    round(span[f"first_{what}"] - started, 3),
                    round(span[f"last_{what}"] - started, 3)]
    return ended - started, timeline


def _fanin_one_shard(b: Bench, n: int) -> float:
    """fanin_10k_s with every child on the parent's shard: no outbox, no relay."""
    ids = b.keys_on(0, "noop", "f1", n)
    (root,) = b.keys_on(0, "fanin_parent", "fanin-one", 1)
    started = time.time()
    run = b.client.start("fanin_parent", root, {"ids": ids})
    done = b.client.wait(run.execution_id, timeout=max(300.0, n / 20), poll=0.05)
    if done.output != n:
        raise BenchError(f"fanin on one shard: the parent ended {done.state} with "
                         f"{done.output!r}, expected {n} children completed")
    return b.finished("fanin_parent", root, 1) - started


def _cancel_tree(b: Bench) -> dict[str, Any]:
    total = 1 + TREE_WIDTHS[0] + TREE_WIDTHS[0] * TREE_WIDTHS[1]
    leaves = TREE_WIDTHS[0] * TREE_WIDTHS[1]
    root = b.client.start("tree_node", "tree", {"widths": TREE_WIDTHS}).execution_id
    # Every run parked: the leaves on their signal, the others on their children.
    wait_for(lambda: _parked(b), total, label="children: tree parked", timeout=300.0)
    started = time.time()
    b.client.cancel(root)
    deadline = started + CANCEL_TIMEOUT_S
    live = total
    while live and time.time() < deadline:
        time.sleep(POLL_S)
        live = _open(b)
    seconds = time.time() - started
    return {"cancel_tree_runs": total, "cancel_tree_leaves": leaves,
            "cancel_tree_s": round(seconds, 3), "cancel_tree_left": live}


def _parked(b: Bench) -> int:
    """Wait rows over every shard: the tree is all they hold."""
    return sum(int(r["n"]) for u in b.urls for r in query(u, "parked_runs", {}))


def _open(b: Bench) -> int:
    """Task and wait rows over every shard: none left, every run of the tree ended."""
    return sum(int(r["n"]) for u in b.urls for r in query(u, "open_runs", {}))
