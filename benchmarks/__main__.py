"""`python -m shardq.benchmarks [scenario ...] [options]`: shardq against the raw PostgreSQL floor.

Scenarios (default `all`, in this order): floor, durable, claim, steps3, cycle, parked, relay,
http, reshard, limits, composition, wake.
See benchmarks/README.md for what each measures and how.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from shardq.benchmarks import reshard
from shardq.benchmarks.bench import Bench, Sizes
from shardq.benchmarks.db import (
    ENV_SHARDS,
    BenchError,
    commit_latency,
    machine_facts,
    provision,
)
from shardq.benchmarks.fleet import FleetConfig
from shardq.benchmarks.measure import Progress
from shardq.benchmarks.report import headline, table, targets
from shardq.benchmarks.scenarios import SCENARIOS, floor_at
from shardq.shards.errors import ShardqError


def _positive(text: str) -> int:
    (value,) = _ints(text) if "," not in text else (0,)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return value


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shardq.benchmarks",
        description="Benchmark shardq: claim throughput, wake latency, durable cycles, "
                    "parked-run scaling, against the raw PostgreSQL SKIP LOCKED floor.",
    )
    p.add_argument("scenarios", nargs="*", default=["all"], metavar="scenario",
                   help=f"all (default) or any of: {', '.join(SCENARIOS)}")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: every scenario in under a minute")
    p.add_argument("--shards", metavar="URL,URL",
                   help=f"use these (empty) shard databases [env {ENV_SHARDS}]; default: create "
                        "databases on $SHARDQ_BENCH_DSN, 127.0.0.1:5432 or an embedded server")
    p.add_argument("--shard-count", type=int, default=2,
                   help="databases to create when no shards are given (default 2)")
    p.add_argument("--wipe", action="store_true",
                   help="allow emptying given shards that already hold executions")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=100,
                   help="turns in flight per worker process (default 100)")
    p.add_argument("--batch-size", type=int, default=100,
                   help="tasks per claim, and the floor's k (default 100)")
    p.add_argument("-n", "--jobs", type=int, help="runs per drain (claim, parked)")
    p.add_argument("--single", type=int, help="runs enqueued one by one in `claim`")
    p.add_argument("--floor-batches", type=_ints, help="floor k values (default 1,10,100)")
    p.add_argument("--floor-rows", type=int, help="rows the floor table starts with")
    p.add_argument("--floor-seconds", type=float, help="time cap of one floor run")
    p.add_argument("--wake-samples", type=int, help="signals timed in `wake` (>= 200 advised)")
    p.add_argument("--cycles", type=int, help="parked runs signalled in `cycle`")
    p.add_argument("--signal-threads", type=int, help="threads sending signals in `cycle`")
    p.add_argument("--signal-batch", type=_positive,
                   help="signals per Client.signal_many call in `cycle` (1: Client.signal)")
    p.add_argument("--backlogs", type=_ints, help="steps3 backlog depths (default 2000,20000)")
    p.add_argument("--steps3-seconds", type=float, help="closed-loop window per backlog")
    p.add_argument("--parked", type=int, help="parked runs beside the second drain")
    p.add_argument("--parked-repeats", type=int, help="drains per side in `parked` (median)")
    p.add_argument("--relay-signals", type=int,
                   help="signals per side in `relay` throughput (default 4000)")
    p.add_argument("--relay-samples", type=int, help="latency probes per side in `relay`")
    p.add_argument("--reshard-runs", type=_positive,
                   help="parked runs in the range `reshard` moves (default 100000, --quick 5000)")
    p.add_argument("--out", type=Path, help="write the JSON result to this file")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--pg-stat-statements", action="store_true",
                   help="record the top statements of each timed phase (the server must "
                        "preload pg_stat_statements)")
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="sample the workers with py-spy during timed drains (raw stacks in DIR)")
    return p


def sizes_from(args: argparse.Namespace) -> Sizes:
    base = Sizes.quick() if args.quick else Sizes.full()
    overrides = {
        "claim_n": args.jobs, "single_n": args.single, "floor_batches": args.floor_batches,
        "floor_rows": args.floor_rows, "floor_seconds": args.floor_seconds,
        "wake_samples": args.wake_samples, "cycle_runs": args.cycles,
        "signal_threads": args.signal_threads,
        "signal_batch": args.signal_batch, "steps3_backlogs": args.backlogs,
        "steps3_seconds": args.steps3_seconds, "parked": args.parked,
        "parked_repeats": args.parked_repeats, "relay_signals": args.relay_signals,
        "relay_samples": args.relay_samples,
    }
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = list(SCENARIOS) if "all" in args.scenarios else args.scenarios
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser().error(f"unknown scenario {', '.join(unknown)}; choose from all, "
                       + ", ".join(SCENARIOS))
    names = [n for n in SCENARIOS if n in names]
    Progress.enabled = not args.no_progress
    reshard.RUNS_OVERRIDE = args.reshard_runs
    given = args.shards or os.environ.get(ENV_SHARDS, "")
    urls = [u.strip() for u in given.split(",") if u.strip()]

    def log(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    fleet_config = FleetConfig(workers=args.workers, concurrency=args.concurrency,
                               batch_size=args.batch_size)
    sizes = sizes_from(args)
    wall = time.monotonic()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        shards = provision(urls, count=args.shard_count, wipe=args.wipe, log=log)
    except BenchError as exc:
        log(f"error: {exc}")
        return 2
    results: dict[str, Any] = {}
    env: dict[str, Any] = {}
    failures: dict[str, str] = {}
    bench = Bench(shards, sizes, fleet_config, log, pg_stat_statements=args.pg_stat_statements,
                  py_spy=args.py_spy)
    try:
        env = {"postgres": shards.facts(), "machine": machine_facts(),
               "commit_latency": commit_latency(shards.urls[0]), "shards_source": shards.source}
        # Every scenario's result carries what its numbers depend on.
        stamp = {
            "postgres": env["postgres"]["server_version"],
            "fsync": env["postgres"]["fsync"],
            "synchronous_commit": env["postgres"]["synchronous_commit"],
            "cores": env["machine"]["cores"], "shards": len(shards.urls),
            **fleet_config.describe(),
        }
        for name in names:
            if name == "claim" and "floor" not in names:
                # shardq / floor needs the floor of this run, at shardq's own batch size.
                log("claim: measuring the floor at the same batch size first")
                results["floor"] = floor_at(bench, (args.batch_size,))
                results["floor"]["context"] = stamp
            log(f"{name} ...")
            t = time.monotonic()
            # The harness is not what is measured: its own collector must not pause
            # a timed window (by the last scenarios it holds enough objects for a
            # full collection to take tens of ms). Collected between scenarios.
            gc.collect()
            gc.disable()
            try:
                results[name] = SCENARIOS[name](bench)
            except (BenchError, TimeoutError, psycopg.Error, ShardqError) as exc:
                # One scenario's failure (a shard gone, a run not finishing) leaves
                # the others to report.
                failures[name] = str(exc)
                log(f"{name} failed: {exc}")
                bench.stop_fleet()
                continue
            finally:
                gc.enable()
            results[name]["scenario_s"] = round(time.monotonic() - t, 1)
            results[name]["context"] = stamp
            log(f"{name} done in {time.monotonic() - t:.1f} s")
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        bench.close()
        shards.drop()
    head = headline(results)
    doc: dict[str, Any] = {
        "shardq_benchmarks": 1,
        "quick": args.quick,
        "started_at": started_at,
        "total_s": round(time.monotonic() - wall, 1),
        **head,
        "headline": head,
        "targets": targets(head),
        "environment": env,
        "config": {"shards": len(shards.urls), **fleet_config.describe(),
                   "sizes": dataclasses.asdict(sizes)},
        "scenarios": results,
        "failures": failures,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        print(table(doc))
        if failures:
            print("\nfailed: " + "; ".join(f"{k}: {v}" for k, v in failures.items()))
        print(f"\ntotal {doc['total_s']:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
