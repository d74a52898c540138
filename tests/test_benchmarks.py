"""The benchmark suite runs end to end at toy sizes (numbers are not judged here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from shardq.benchmarks.floor import durable_batches
from shardq.benchmarks.report import table
from shardq.benchmarks.workflows import registry
from shardq.queue.client import Client
from shardq.queue.worker import Worker
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools

from .conftest import Server
from .support import ROOT


@pytest.mark.slow
def test_claim_and_floor_scenarios_run_and_report(pg_server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["SHARDQ_BENCH_DSN"] = pg_server.admin_dsn
    result = subprocess.run(
        [sys.executable, "-m", "shardq.benchmarks", "floor", "durable", "claim", "cycle", "wake",
         "-n", "300", "--single", "20", "--floor-rows", "3000", "--floor-seconds", "0.5",
         "--floor-batches", "10", "--workers", "1", "--concurrency", "10",
         "--batch-size", "10", "--wake-samples", "20", "--cycles", "40",
         "--signal-threads", "2", "--signal-batch", "10", "--json", "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["failures"] == {}
    assert report["floor_batch"] == 10
    assert report["floor_jobs_per_s"] > 0
    assert report["drain_jobs_per_s"] > 0
    assert report["enqueue_single_per_s"] > 0
    # Every run enqueued before the workers started was drained and checked completed.
    assert report["scenarios"]["claim"]["enqueue_first"]["jobs"] == 300 + 20
    assert report["scenarios"]["cycle"]["runs"] == 40
    assert report["cycles_per_s"] > 0
    assert report["shardq_over_floor"] == pytest.approx(
        report["drain_jobs_per_s"] / report["floor_jobs_per_s"], abs=0.001)
    # The durable floor drained (and the suite checked completed) every one of its runs.
    durable = report["scenarios"]["durable"]
    assert (durable["jobs"], durable["k"]) == (300, 10)
    assert report["durable_over_floor"] == pytest.approx(
        durable["jobs_per_s"] / report["floor_jobs_per_s"], abs=0.001)
    assert report["shardq_over_durable_floor"] == pytest.approx(
        report["drain_jobs_per_s"] / durable["jobs_per_s"], abs=0.001)
    # The headline drain is the backlog's, every run of it checked completed.
    claim = report["scenarios"]["claim"]
    assert claim["backlog"]["jobs"] == 300
    assert report["drain_jobs_per_s"] == claim["backlog"]["jobs_per_s"]
    assert report["drain_workers_first_jobs_per_s"] == claim["workers_first"]["jobs_per_s"]
    assert 0 < report["wake_p50_ms"] <= report["wake_p99_ms"]
    config = report["config"]
    assert (config["shards"], config["worker_processes"], config["batch_size"]) == (2, 1, 10)
    assert report["environment"]["postgres"]["fsync"] in ("on", "off")
    assert report["environment"]["postgres"]["autovacuum"] in ("on", "off")
    wake = report["scenarios"]["wake"]
    # Exactly the timed samples, the warm-up probes left out; the slowest with when
    # in the sampling each came.
    assert wake["samples"] == 20
    slowest = wake["slowest"]
    assert len(slowest) == 10
    assert [s[0] for s in slowest] == sorted((s[0] for s in slowest), reverse=True)
    assert slowest[0][0] == pytest.approx(wake["step_ms"]["max"], abs=0.01)
    assert all(s[2] >= 0 for s in slowest)
    assert wake["completed_ms"]["p50"] >= wake["step_ms"]["p50"]
    # The table a user reads is rendered from the same document.
    text = table(report)
    for line in ("raw SKIP LOCKED k=10", "drain of a backlog", "drain, workers first",
                 "durable cycles",
                 "signal -> resumed step", "shardq / floor at k=10",
                 "shardq's Store, no worker k=10", "durable floor / floor"):
        assert line in text, text


def _written(client: Client, execution_id: object) -> tuple[object, ...]:
    """What a run left behind that a user reads: its ending and its history."""
    run = client.get(str(execution_id))
    assert run is not None
    events = [(e.position, e.kind, e.name, e.payload) for e in client.history(str(execution_id))]
    return run.state, run.output, run.error, events


def test_the_durable_floor_writes_what_a_noop_turn_writes(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    """Else shardq / durable floor would compare the worker with less (or more) work."""
    client = Client(shard_map, registry, pools=pools)
    by_engine = client.start("noop", "by-engine").execution_id
    worker = start_worker(registry)
    client.wait(str(by_engine), timeout=15)
    worker.stop()
    by_floor = client.start("noop", "by-floor").execution_id
    drained = 0
    for shard in shard_map.shards:
        with durable_batches(shard.url, 10) as batch:
            while n := batch():
                drained += n
    assert drained == 1
    assert _written(client, by_floor) == _written(client, by_engine)
    assert _written(client, by_floor)[0] == "completed"
