"""The scenarios. Each takes the Bench and returns a JSON-able dict of its numbers."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.composition import composition
from shardq.benchmarks.connections import connections
from shardq.benchmarks.db import BenchError, Poller, analyze_as_autovacuum, query
from shardq.benchmarks.dbcost import DbMeter
from shardq.benchmarks.fleet import FleetConfig, RelayFleet
from shardq.benchmarks.floor import drain, run_floor
from shardq.benchmarks.http import http_signals
from shardq.benchmarks.limits import limits
from shardq.benchmarks.measure import CpuMeter, Progress, percentiles, wait_for
from shardq.benchmarks.parked import insert_parked
from shardq.benchmarks.pgbouncer import pgbouncer_binary, running_pgbouncer
from shardq.benchmarks.reshard import reshard
from shardq.benchmarks.upgrades import upgrades
from shardq.benchmarks.visibility import visibility
from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.core.models import SignalRequest
from shardq.shards.config import ShardMap

Scenario = Callable[[Bench], dict[str, Any]]


def floor(b: Bench) -> dict[str, Any]:
    """The raw SKIP LOCKED loop at each batch size (and at shardq's own batch size)."""
    return floor_at(b, b.sizes.floor_batches)


def floor_at(b: Bench, batches_wanted: tuple[int, ...]) -> dict[str, Any]:
    batches = sorted({*batches_wanted, b.fleet_config.batch_size})
    runs = [
        run_floor(b.urls, k=k, workers=b.fleet_config.workers, rows=b.sizes.floor_rows,
                  max_seconds=b.sizes.floor_seconds, instruments=b.instruments())
        for k in batches
    ]
    return {"runs": runs, "batch_size": b.fleet_config.batch_size,
            "jobs_per_s": next(r["jobs_per_s"] for r in runs
                               if r["k"] == b.fleet_config.batch_size)}


def durable(b: Bench) -> dict[str, Any]:
    """shardq's Store with no worker: `noop` runs drained by bare loops (floor.py, `durable`).

    Same runs, batch size and processes as the claim drain, and like it (and
    the raw floor) timed over the drain alone: the runs are queued first.
    """
    n, k = b.sizes.claim_n, b.fleet_config.batch_size
    b.stop_fleet()  # nothing but the bare loops may take these runs
    b.reset(checkpoint=True)
    inserted = DbMeter(b.urls).start()
    t = time.perf_counter()
    b.client.start_many("noop", [(f"df-{i}", None) for i in range(n)])
    insert_s = time.perf_counter() - t
    insert_wal = inserted.stop(n)["wal"]
    for url in b.urls:
        analyze_as_autovacuum(url, n / len(b.urls))
    result = drain(b.urls, "durable", k=k, workers=b.fleet_config.workers,
                   max_seconds=max(60.0, n / 100), instruments=b.instruments())
    b.finished("noop", "df-", n)  # every run completed, or the scenario fails
    b.reset()
    # The enqueue's WAL, outside the drain's (the floors' fills are not counted either).
    return {**result, "insert_s": round(insert_s, 3),
            "insert_wal_bytes_per_job": insert_wal["bytes_per_job"]}


def claim(b: Bench) -> dict[str, Any]:
    """`noop` runs: enqueue rates, then drains: enqueue first, of a backlog, workers first."""
    n, single = b.sizes.claim_n, b.sizes.single_n
    b.stop_fleet()
    b.reset(checkpoint=True)
    # Enqueue first, no worker running: both enqueue rates, then spawn the workers.
    t = time.perf_counter()
    b.client.start_many("noop", [(f"ef-{i}", None) for i in range(n)])
    bulk_s = time.perf_counter() - t
    bar = Progress("enqueue one by one", single)
    t = time.perf_counter()
    for i in range(single):
        b.client.start("noop", f"ef-single-{i}")
        bar.update(i + 1)
    single_s = time.perf_counter() - t
    bar.close()
    total = n + single
    spawned = time.time()
    fleet = b.spawn_fleet()
    meter = CpuMeter(fleet.pids).start()
    startup_s = fleet.wait_ready()
    b.wait_drained(total, "drain (enqueue first)")
    cpu_first = meter.stop(total)
    end = b.finished("noop", "ef-", total)
    # At small sizes the first worker up can drain everything before the last
    # one reports serving: then there is no "after start-up" to time.
    after_startup = end - spawned - startup_s
    enqueue_first = {
        "jobs": total, "seconds": round(end - spawned, 3),
        "jobs_per_s": round(total / (end - spawned), 1),
        "worker_startup_s": round(startup_s, 3),
        "jobs_per_s_after_startup": (round(total / after_startup, 1)
                                     if after_startup > 0.01 else None),
        "cpu": cpu_first,
    }
    # A backlog: the same processes, now idle, frozen while N runs are queued,
    # timed from their thaw to the last commit. The floors' windows hold their
    # drains alone too: this is the drain the ratios compare.
    b.reset(checkpoint=True)
    time.sleep(1.5)  # every claim loop back asleep on its poll; only NOTIFY wakes them
    backlog = b.timed_drain("noop", "bl-", [(f"bl-{i}", None) for i in range(n)],
                            "drain (backlog)", backlog=True)
    # Workers first: idle again; one bulk insert, timed with it to the last commit.
    b.reset(checkpoint=True)
    time.sleep(1.5)
    workers_first = b.timed_drain("noop", "wf-", [(f"wf-{i}", None) for i in range(n)],
                                  "drain (workers first)")
    return {
        "enqueue_bulk_per_s": round(n / bulk_s, 1),
        "enqueue_bulk_n": n,
        "enqueue_single_per_s": round(single / single_s, 1),
        "enqueue_single_n": single,
        "backlog": backlog,
        "workers_first": workers_first,
        "enqueue_first": enqueue_first,
        "drain_jobs_per_s": backlog["jobs_per_s"],
        "worker_log_problems": b.fleet().errors()[:10],
    }


def steps3(b: Bench) -> dict[str, Any]:
    """Three no-op steps per run, fed closed-loop to keep a constant backlog.

    The feeder tops the backlog up with start_many in chunks of at most 1,000 runs.
    """
    return {"backlogs": [_steps3_at(b, backlog) for backlog in b.sizes.steps3_backlogs]}


FEED_POLL_S = 0.025
"""How often the steps3 feeder counts the backlog: a count over 20,000 task rows
costs the server ~1.5 ms, and the depth moves by ~50 runs in this time."""


def _input(i: int) -> dict[str, Any]:
    return {"customer": f"c-{i:06d}", "amount": 1000 + i % 9000}  # ~40 bytes of JSON


def _steps3_at(b: Bench, backlog: int) -> dict[str, Any]:
    fleet = b.fleet()
    b.reset(checkpoint=True)
    time.sleep(1.0)
    prefix = f"s3-{backlog}-"
    started = 0

    def feed(count: int) -> None:
        nonlocal started
        b.client.start_many("steps3", [(f"{prefix}{started + i}", _input(started + i))
                                       for i in range(count)])
        started += count

    chunk = max(100, min(backlog // 4, 1_000))
    with Poller(b.urls) as poller, b.statements() as top:
        feed(backlog)
        t0 = time.time()
        done0 = started - poller.total("active_tasks")
        meter = CpuMeter(fleet.pids).start()
        bar = Progress(f"steps3 backlog {backlog:,}", b.sizes.steps3_seconds, unit=" s",
                       rate=False)
        depths = []
        while time.time() - t0 < b.sizes.steps3_seconds:
            polled = time.monotonic()
            remaining = poller.total("active_tasks")
            depths.append(remaining)
            if remaining < backlog:
                feed(min(chunk, backlog - remaining))
            bar.update(time.time() - t0)
            time.sleep(max(0.0, polled + FEED_POLL_S - time.monotonic()))
        t1 = time.time()
        done1 = started - poller.total("active_tasks")
        bar.close()
        cpu = meter.stop(done1 - done0)
        # Stop feeding and let the backlog drain: a plain drain-from-backlog figure.
        tail_n = started - done1
        b.wait_drained(tail_n, f"steps3 tail {backlog:,}")
    end = b.finished("steps3", prefix, started)
    rate = (done1 - done0) / (t1 - t0)
    return {
        "backlog": backlog, "seconds": round(t1 - t0, 3), "completed": done1 - done0,
        "workflows_per_s": round(rate, 1), "steps_per_s": round(3 * rate, 1),
        "mean_depth": round(sum(depths) / max(1, len(depths))),
        "tail_workflows": tail_n, "tail_per_s": round(tail_n / max(1e-9, end - t1), 1),
        "input_bytes": len(json.dumps(_input(123456))), "cpu": cpu, **top,
    }


def cycle(b: Bench) -> dict[str, Any]:
    """start -> park on a signal -> signal -> resume -> complete, M runs at once."""
    m, threads, batch = b.sizes.cycle_runs, b.sizes.signal_threads, b.sizes.signal_batch
    fleet = b.fleet()
    b.reset(checkpoint=True)
    time.sleep(1.0)
    with b.statements() as top:
        meter = CpuMeter(fleet.pids).start()
        t0 = time.time()
        started = b.client.start_many("park", [(f"cy-{i}", None) for i in range(m)])
        t_started = time.time()
        with Poller(b.urls) as poller:
            wait_for(lambda: poller.total("parked_runs"), m,
                     label="cycle: parking", timeout=max(60.0, m / 100))
            t_parked = time.time()
            ids = [r.execution_id for r in started]
            _signal_all(b, ids, threads, batch)
            t_signalled = time.time()
            wait_for(lambda: max(0, m - poller.total("open_runs")), m,
                     label="cycle: completing", timeout=max(60.0, m / 100), interval=0.05)
        cpu = meter.stop(m)
    end = b.finished("park", "cy-", m)
    return {
        "runs": m, "signal_threads": threads, "signal_batch": batch, "seconds": round(end - t0, 3),
        "cycles_per_s": round(m / (end - t0), 1),
        "start_s": round(t_started - t0, 3), "park_s": round(t_parked - t_started, 3),
        "signal_s": round(t_signalled - t_parked, 3),
        "signals_per_s": round(m / (t_signalled - t_parked), 1),
        "resume_tail_s": round(end - t_signalled, 3),
        "cpu": cpu, **top,
    }


def _signal_all(b: Bench, ids: list[uuid.UUID], threads: int, batch: int) -> None:
    """Each thread sends its share one by one (batch 1) or `batch` per signal_many call."""
    failures: list[BaseException] = []
    sent = [0] * threads

    def send(part: int) -> None:
        mine = ids[part::threads]
        try:
            for i in range(0, len(mine), batch):
                chunk = mine[i:i + batch]
                if batch == 1:
                    b.client.signal(chunk[0], "go", {"n": 1})
                else:
                    results = b.client.signal_many([SignalRequest(x, "go", {"n": 1})
                                                    for x in chunk])
                    refused = [r.error for r in results if r.error is not None]
                    if refused:
                        raise refused[0]
                sent[part] += len(chunk)
        except BaseException as exc:  # reported below
            failures.append(exc)

    workers = [threading.Thread(target=send, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    bar = Progress("cycle: signalling", len(ids))
    while any(w.is_alive() for w in workers):
        bar.update(sum(sent))
        time.sleep(0.05)
    bar.close()
    if failures:
        raise BenchError(f"signal failed: {failures[0]!r}")


def wake(b: Bench) -> dict[str, Any]:
    """Signal -> resumed-step latency with one idle worker whose safety poll is 60 s; then
    the same with the worker and the client through PgBouncer in transaction mode (the
    worker's LISTEN still to the server: docs/configuration.md, "Behind PgBouncer"),
    when Debian's pgbouncer is installed: `pgbouncer_over_direct_p99`."""
    direct = _wake(b, b.client, ())
    if pgbouncer_binary() is None:
        return {**direct, "pgbouncer": {"skipped": "Debian's pgbouncer is not installed"}}
    pooled = ShardMap.from_urls(b.urls, pool_max=b.client.map.pool_max)
    with running_pgbouncer(b.urls[0]) as pooler, Client.connect(
            replace(pooled, pooler=pooler.address), registry) as client:
        through = _wake(b, client, (("SHARDQ_POOLER", pooler.address),))
    return {**direct, "pgbouncer": {k: through[k] for k in (
        "p50_ms", "p95_ms", "p99_ms", "after_commit_ms", "signal_call_ms", "samples")},
            "pgbouncer_over_direct_p99": round(through["p99_ms"] / direct["p99_ms"], 3)}


def _wake(b: Bench, client: Client, env: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The wake samples, signalled by `client`, the worker's environment given `env`."""
    samples = b.sizes.wake_samples
    probes = WAKE_WARMUP + samples
    b.reset()
    # The standard fleet parks the probes; then a single worker with a 60 s safety poll
    # takes over, so nothing but a NOTIFY can wake it within the measurement.
    b.fleet()
    started = client.start_many("wake_probe", [(f"wk-{i}", None) for i in range(probes)])
    with Poller(b.urls) as poller:
        wait_for(lambda: poller.total("parked_runs"), probes,
                 label="wake: parking", timeout=60)
    b.stop_fleet()
    config = FleetConfig(workers=1, concurrency=b.fleet_config.concurrency,
                         batch_size=b.fleet_config.batch_size, poll_interval=60.0, env=env)
    b.spawn_fleet(config).wait_ready()
    b.checkpoint()  # not one started by the earlier scenarios' WAL while latency is timed
    time.sleep(1.5)  # the worker's claim loop is asleep on its 60 s poll
    sent: dict[str, tuple[float, float]] = {}
    bar = Progress("wake samples", probes)
    for i, run in enumerate(started):
        time.sleep(0.01)
        t0 = time.time()
        client.signal(run.execution_id, "go")
        t_signal = time.time()
        # Off the server while the worker wakes: a poll racing its claim for the two
        # cores would slow what is being measured.
        time.sleep(QUIET_S)
        client.wait(run.execution_id, timeout=10.0, poll=0.005)
        if i >= WAKE_WARMUP:
            sent[f"wk-{i}"] = (t0, t_signal)
        bar.update(i + 1)
    bar.close()
    problems = b.stop_fleet()
    resumed, stepped, finished, signal_call, after_commit = [], [], [], [], []
    slowest: list[tuple[float, float, float]] = []  # (step ms, signal call ms, s into sampling)
    outputs = [r for url in b.urls for r in query(url, "wake_outputs")
               if r["workflow_id"] in sent]
    first = min(t0 for t0, _ in sent.values())
    for row in outputs:
        t0, t_signal = sent[row["workflow_id"]]
        out = json.loads(row["output"])
        resumed.append(1000 * (out["resumed_at"] - t0))
        stepped.append(1000 * (out["step_at"] - t0))
        finished.append(1000 * (row["finished"] - t0))
        signal_call.append(1000 * (t_signal - t0))
        after_commit.append(1000 * (out["step_at"] - t_signal))
        slowest.append((round(stepped[-1], 2), round(signal_call[-1], 2), round(t0 - first, 2)))
    if len(outputs) != samples:
        raise BenchError(f"wake: {len(outputs)} of {samples} probes completed")
    step = _ms(percentiles(stepped))
    return {
        "samples": samples, "worker": config.describe(),
        "step_ms": step, "resumed_ms": _ms(percentiles(resumed)),
        "completed_ms": _ms(percentiles(finished)),
        "signal_call_ms": _ms(percentiles(signal_call)),
        # The part after the signal's commit returned: NOTIFY -> claim -> replay -> step.
        # The signal call is one durable commit, whose tail is the disk's (CHANGELOG.md).
        "after_commit_ms": _ms(percentiles(after_commit)),
        "p50_ms": step["p50"], "p95_ms": step["p95"], "p99_ms": step["p99"],
        # Whether the tail is scattered or one stall: when in the sampling each came.
        "slowest": sorted(slowest, reverse=True)[:10],
        # Every sample, for the distribution plot of the docs' performance page.
        "step_ms_samples": sorted(round(v, 3) for v in stepped),
        "worker_log_problems": problems[:10],
    }


def _ms(stats: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in stats.items()}


WAKE_WARMUP = 20
"""Probes signalled, untimed, before the samples: a fresh worker's and client's
connections each plan shardq's functions on first use (several ms, once)."""

QUIET_S = 0.02
"""How long the client keeps off the server after a wake signal."""


def parked(b: Bench) -> dict[str, Any]:
    """The backlog drain of `noop` runs with 0 and with many parked runs beside it.

    A backlog's drain, not the workers-first one: the question is whether parked
    runs slow the claim path, and a workers-first window also times the bulk
    insert, which is the enqueue path (a third of that window). Each side drains
    `repeats` times (fresh run ids each time; the completed rows of earlier
    drains stay) and the median counts. The parked rows are inserted by SQL,
    then VACUUM ANALYZEd and CHECKPOINTed, as autovacuum and the checkpointer
    would have done long before a real million runs had parked.
    """
    n, count, repeats = b.sizes.claim_n, b.sizes.parked, b.sizes.parked_repeats
    b.fleet()
    b.reset(checkpoint=True)
    time.sleep(1.0)

    def one_drain(side: str, label: str, r: int) -> dict[str, Any]:
        # Both sides start each drain from vacuumed tables: left to pile up
        # (the machine's autovacuum may be off), the dead tasks of earlier
        # drains slowed the empty side's later drains more than a million
        # parked runs slowed the other's (ratio 1.08-1.24).
        b.vacuum()
        items = [(f"{side}{r}-{i}", None) for i in range(n)]
        return b.timed_drain("noop", f"{side}{r}-", items,
                             f"drain beside {label} parked ({r + 1}/{repeats})", backlog=True)

    empty = [one_drain("p0", "0", r) for r in range(repeats)]
    b.reset()
    insert_s = _insert_parked(b, count)
    for url in b.urls:
        query(url, "vacuum_queue")
    b.checkpoint()
    time.sleep(1.0)
    sizes = [r for url in b.urls for r in query(url, "table_sizes")]
    full = [one_drain("pN", f"{count:,}", r) for r in range(repeats)]
    b.reset()
    without, with_parked = (statistics.median(r["jobs_per_s"] for r in side)
                            for side in (empty, full))
    return {
        "parked": count, "jobs": n, "repeats": repeats,
        "parked_insert_s": round(insert_s, 2),
        "parked_insert_per_s": round(count / insert_s, 1),
        "without_jobs_per_s": without, "with_jobs_per_s": with_parked,
        "ratio": round(with_parked / without, 3),
        "without_runs": empty, "with_runs": full,
        "tables_with_parked": _sum_sizes(sizes),
    }


def _sum_sizes(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        entry = out.setdefault(r["name"], {"rows": 0, "mb": 0})
        entry["rows"] += max(0, int(r["rows"]))
        entry["mb"] += round(int(r["bytes"]) / 2**20)
    return out


def _insert_parked(b: Bench, count: int) -> float:
    """Parked runs straight into the tables (benchmarks/parked.py); seconds it took."""
    bar = Progress("inserting parked runs", count)
    t = time.perf_counter()
    insert_parked(b.shards.map, count, progress=bar.update)
    bar.close()
    return time.perf_counter() - t


RELAY_FANOUT = 10
"""Signals each `relay_source` run sends (one per sink), each call its own commit."""
RELAY_WARMUP = 5
"""Untimed probes first: fresh connections plan shardq's functions on first use."""


def relay(b: Bench) -> dict[str, Any]:
    """Signals between runs: on one shard (in the sender's commit) beside through the relay.

    Throughput: `relay_signals` sinks are parked on the target shard, then
    sources on shard 0 signal them, RELAY_FANOUT each; the rate is signals
    over the time from the sources' start to the last sink's completion
    (sender commit -> target consumed and finished). Latency: one probe at a
    time, from the sender's call to the target's code resuming, with the relay
    idle between probes (its safety poll is 60 s, so only its LISTEN explains a
    fast delivery), beside the same on one shard. One relay process.
    """
    if len(b.urls) < 2:
        raise BenchError("relay needs two shards or more")
    b.fleet()
    relays = RelayFleet(b.urls, FleetConfig(workers=1, concurrency=0, batch_size=200,
                                            poll_interval=60.0)).start()
    try:
        relays.wait_ready()
        out: dict[str, Any] = {}
        for label, target in (("same_shard", 0), ("cross_shard", 1)):
            b.reset()
            out[label] = _relay_throughput(b, target, label)
        for label, target in (("same_shard", 0), ("cross_shard", 1)):
            b.reset()
            out[f"{label}_latency_ms"] = _relay_latency(b, target, label)
        for label, batch in (("fanout_single_calls", False), ("fanout_one_call", True)):
            b.reset()
            out[label] = _fanout(b, batch, label)
        problems = relays.errors()
    finally:
        relays.stop()
        b.reset()
    single, many = (out["fanout_single_calls"]["sender_seconds"],
                    out["fanout_one_call"]["sender_seconds"])
    out["fanout_one_call_speedup"] = round(single / many, 1) if many else None
    same, cross = out["same_shard"]["signals_per_s"], out["cross_shard"]["signals_per_s"]
    out["cross_over_same_throughput"] = round(cross / same, 3) if same else None
    p99s = out["same_shard_latency_ms"].get("p99"), out["cross_shard_latency_ms"].get("p99")
    out["cross_over_same_p99"] = round(p99s[1] / p99s[0], 2) if p99s[0] and p99s[1] else None
    out["relay_log_problems"] = problems[:10]
    return out


def _parked(b: Bench, count: int, label: str) -> None:
    wait_for(lambda: sum(int(r["n"]) for u in b.urls for r in query(u, "open_waits")),
             count, label=f"{label}: parking", timeout=max(60.0, count / 20))


def _relay_throughput(b: Bench, target: int, label: str) -> dict[str, Any]:
    n = b.sizes.relay_signals - b.sizes.relay_signals % RELAY_FANOUT
    prefix = f"rs-{label}-"
    sinks = b.client.start_many("relay_sink", [(k, None) for k in b.keys_on(
        target, "relay_sink", prefix, n)])
    _parked(b, n, label)
    ids = [str(s.execution_id) for s in sinks]
    sources = [(k, {"targets": ids[i * RELAY_FANOUT:(i + 1) * RELAY_FANOUT]})
               for i, k in enumerate(b.keys_on(0, "relay_source", f"src-{label}",
                                              n // RELAY_FANOUT))]
    started = time.time()
    b.client.start_many("relay_source", sources)
    wait_for(lambda: sum(int(r["completed"]) for u in b.urls for r in query(
        u, "drain_result", {"workflow": "relay_sink", "prefix": prefix + "%"})),
        n, label=f"{label}: signals consumed", timeout=max(120.0, n / 10))
    last = b.finished("relay_sink", prefix, n)
    seconds = last - started
    return {"signals": n, "seconds": round(seconds, 3),
            "signals_per_s": round(n / seconds, 1) if seconds > 0 else None}


FANOUT_TARGETS = 1_000


def _fanout(b: Bench, batch: bool, label: str) -> dict[str, Any]:
    """One run on shard 0 signals FANOUT_TARGETS parked runs of its shard; timed from its
    start to the last target's completion."""
    prefix = f"fo-{label}-"
    sinks = b.client.start_many("relay_sink", [(k, None) for k in b.keys_on(
        0, "relay_sink", prefix, FANOUT_TARGETS)])
    _parked(b, FANOUT_TARGETS, label)
    (key,) = b.keys_on(0, "fanout_source", f"fos-{label}", 1)
    started = time.time()
    source = b.client.start("fanout_source", key, {
        "targets": [str(s.execution_id) for s in sinks], "batch": batch}).execution_id
    wait_for(lambda: sum(int(r["completed"]) for u in b.urls for r in query(
        u, "drain_result", {"workflow": "relay_sink", "prefix": prefix + "%"})),
        FANOUT_TARGETS, label=f"{label}: signals consumed", timeout=120.0)
    seconds = b.finished("relay_sink", prefix, FANOUT_TARGETS) - started
    sender = b.client.get(source)
    assert sender.finished_at is not None
    # The sender's own time, its start to the commit that finished it: what the
    # batch form changes. The targets' turns after it are the same work both ways.
    sending = (sender.finished_at - sender.created_at).total_seconds()
    return {"signals": FANOUT_TARGETS, "seconds": round(seconds, 3),
            "signals_per_s": round(FANOUT_TARGETS / seconds, 1) if seconds > 0 else None,
            "sender_seconds": round(sending, 3)}


def _relay_latency(b: Bench, target: int, label: str) -> dict[str, float]:
    samples = b.sizes.relay_samples + RELAY_WARMUP
    targets = b.keys_on(target, "wake_probe", f"rl-{label}", samples)
    senders = b.keys_on(0, "relay_probe", f"rp-{label}", samples)
    latencies = []
    bar = Progress(f"{label}: relay latency", samples)
    for i, (target_key, sender_key) in enumerate(zip(targets, senders, strict=True)):
        probe = b.client.start("wake_probe", target_key).execution_id
        _parked(b, 1, label)  # the probes before it finished: this one is the only wait
        sender = b.client.start("relay_probe", sender_key, {"target": str(probe)})
        resumed = b.client.wait(probe, timeout=30, poll=0.005).output["resumed_at"]
        sent = b.client.wait(sender.execution_id, timeout=30).output["sent_at"]
        if i >= RELAY_WARMUP:
            latencies.append((resumed - sent) * 1000)
        bar.update(i + 1)
    bar.close()
    return _ms(percentiles(latencies))


SCENARIOS: dict[str, Scenario] = {
    "floor": floor,
    "durable": durable,
    "claim": claim,
    "steps3": steps3,
    "cycle": cycle,
    "parked": parked,
    "relay": relay,
    "http": http_signals,
    "reshard": reshard,
    "limits": limits,
    "composition": composition,
    "upgrades": upgrades,
    "visibility": visibility,
    "connections": connections,
    "wake": wake,
}
"""In the order `all` runs them: wake last, as it replaces the fleet with a single worker."""
