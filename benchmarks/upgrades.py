"""The `upgrades` scenario: the offline replay check (docs/versioning.md) and what
tracing costs (docs/operations.md, "Tracing").

`otel_overhead` (target >= 0.9): a backlog of `claim_n` one-step `noop` runs drained
by the standard fleet with tracing on (every worker's spans to the OpenTelemetry
SDK's in-memory exporter through a batch processor: a turn, a step and a share of
a batch commit's span per run) over the same drain with tracing off, the two
alternated (off, on, on, off) in one run; the medians' ratio.

`replay_runs_per_s` (target >= 5,000): `shardq replay` run as an operator runs it
in CI, over `replay_runs` (100,000 at full size) finished three-step `steps3`
histories spread over every shard, against the benchmark's own app; runs replayed
over the command's whole wall time, its start-up included. The histories are
copies of one run the fleet really ran (its rows as the engine wrote them, under
fresh ids of each shard's buckets), inserted in bulk: recording 100,000 runs
through the engine would take minutes and measure the drain, not the check.
`replay_check_runs_per_s` is the command's own count (reading and replaying,
without its start-up). Every run must pass: a divergence is an error here.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError, analyze_as_autovacuum, query
from shardq.benchmarks.workflows import TRACING_ENV
from shardq.core.models import State
from shardq.shards.routing import new_execution_id

CLONE_BATCH = 20_000
APP = "shardq.benchmarks.workflows:registry"


def upgrades(b: Bench) -> dict[str, Any]:
    return {**_tracing_cost(b), **_replay(b)}


def _tracing_cost(b: Bench) -> dict[str, Any]:
    n = b.sizes.claim_n
    plain = b.fleet_config
    traced = dataclasses.replace(plain, env=((TRACING_ENV, "memory"),))
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for round_, (side, config) in enumerate((("off", plain), ("on", traced), ("on", traced),
                                             ("off", plain))):
        b.stop_fleet()
        b.reset()
        b.fleet_config = config
        try:
            drained = b.timed_drain("noop", f"ot{round_}-",
                                    [(f"ot{round_}-{i}", None) for i in range(n)],
                                    f"drain, tracing {side}", backlog=True)
        finally:
            b.fleet_config = plain
        rates[side].append(float(drained["jobs_per_s"]))
    b.stop_fleet()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {"otel_runs": n, "otel_off_jobs_per_s": off, "otel_on_jobs_per_s": on,
            "otel_overhead": round(on / off, 3) if off else None}


def _replay(b: Bench) -> dict[str, Any]:
    n = b.sizes.replay_runs
    b.fleet()
    b.reset()
    template = b.client.start("steps3", "replay-template")
    if b.client.wait(template.execution_id, timeout=60).state is not State.COMPLETED:
        raise BenchError("replay: the template run did not complete")
    b.stop_fleet()
    home = b.client.map.for_execution(template.execution_id).url
    events = [[r["position"], r["kind"], r["name"], r["payload"]] for r in query(
        home, "template_history", {"workflow": "steps3", "workflow_id": "replay-template"})]
    shards = b.client.map.shards
    rng = random.Random(7)
    made = 0
    for index, shard in enumerate(shards):
        buckets = [bucket for low, high in shard.ranges for bucket in range(low, high + 1)]
        share = n // len(shards) + (1 if index < n % len(shards) else 0)
        for start in range(0, share, CLONE_BATCH):
            ids = [new_execution_id(rng.choice(buckets))
                   for _ in range(min(CLONE_BATCH, share - start))]
            query(shard.url, "clone_runs", {"ids": ids, "workflow": "steps3",
                                            "prefix": f"r{index}-{start}-",
                                            "events": json.dumps(events)})
            made += len(ids)
        # What autovacuum does after such an insert (the bench server runs without it).
        analyze_as_autovacuum(shard.url, share * len(events))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli", "--shards", ",".join(b.urls), "--json",
         "replay", "--app", APP, "--workflow", "steps3"],
        capture_output=True, text=True, check=False, timeout=max(600.0, n / 100))
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise BenchError(f"shardq replay exited {done.returncode}: {done.stderr.strip()[-500:]}")
    report = json.loads(done.stdout)
    if report["runs"] != made + 1 or report["diverged"]:
        raise BenchError(f"shardq replay checked {report['runs']} runs of {made + 1}, "
                         f"{report['diverged']} diverged")
    return {"replay_runs": report["runs"], "replay_s": round(seconds, 3),
            "replay_runs_per_s": round(report["runs"] / seconds, 1),
            "replay_check_runs_per_s": round(report["runs_per_s"], 1),
            "replay_events_per_run": len(events)}
