"""The benchmark suite runs end to end at toy sizes (numbers are not judged here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shardq.benchmarks.floor import durable_batches
from shardq.benchmarks.parked import INPUT, insert_parked, parked_run
from shardq.benchmarks.pgbouncer import pgbouncer_binary
from shardq.benchmarks.report import table
from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for, bucket_of
from shardq.store.store import Store
from shardq.worker.worker import Worker

from ..conftest import TABLES, Server
from ..support import ROOT, all_rows, rows, wait_until


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
    # What no worker could beat: the floor's CPU per job over shardq's PostgreSQL's.
    floor_k10 = next(r for r in report["scenarios"]["floor"]["runs"] if r["k"] == 10)["cpu"]
    floor_us = floor_k10["workers_us_per_job"] + floor_k10["postgres_us_per_job"]
    assert report["floor_cpu_us_per_job"] == pytest.approx(floor_us, abs=0.05)
    assert report["durable_pg_ceiling"] == pytest.approx(
        floor_us / durable["cpu"]["postgres_us_per_job"], abs=0.001)
    assert report["drain_pg_ceiling"] == pytest.approx(
        floor_us / report["scenarios"]["claim"]["backlog"]["cpu"]["postgres_us_per_job"],
        abs=0.001)
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
    if pgbouncer_binary() is not None:  # the same samples through PgBouncer
        assert wake["pgbouncer"]["samples"] == 20
        assert report["wake_p99_pgbouncer_over_direct"] == pytest.approx(
            wake["pgbouncer"]["p99_ms"] / wake["p99_ms"], abs=0.001)
    # The table a user reads is rendered from the same document.
    text = table(report)
    for line in ("raw SKIP LOCKED k=10", "drain of a backlog", "drain, workers first",
                 "durable cycles",
                 "signal -> resumed step", "shardq / floor at k=10",
                 "shardq's Store, no worker k=10", "durable floor / floor",
                 "with a client that cost no CPU: durable floor <= "):
        assert line in text, text


@pytest.mark.slow
def test_the_reshard_scenario_moves_a_range_under_load_and_reports(pg_server: Server) -> None:
    """A range of parked runs moved while a drain and a signalling client run; afterwards
    the suite's map is back as it was (the scenario moves the emptied range home)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["SHARDQ_BENCH_DSN"] = pg_server.admin_dsn
    result = subprocess.run(
        [sys.executable, "-m", "shardq.benchmarks", "reshard", "--reshard-runs", "400",
         "--workers", "1", "--concurrency", "10", "--json", "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["failures"] == {}
    r = report["scenarios"]["reshard"]
    assert r["runs"] == r["runs_moved"] == 400
    assert r["client_errors"] == 0 and r["client_calls_during_move"] > 0
    assert r["signalled_runs_completed"] > 0
    assert r["drain_before"]["jobs"] > 0 and r["drain_during"]["jobs"] > 0
    assert r["servers"] == "one server, two databases"
    for key in ("reshard_runs_moved_per_s", "reshard_max_pause_ms", "reshard_client_errors",
                "reshard_drain_ratio"):
        assert report[key] is not None, key
    assert report["reshard_max_pause_ms"] == r["client_max_pause_ms"] > 0
    met = {t["metric"]: t["met"] for t in report["targets"]}
    assert met["reshard_client_errors"] is True
    text = table(report)
    for line in ("move of 400 parked runs", "signalling a moving run", "drain on other buckets"):
        assert line in text, text


@pytest.mark.slow
def test_what_one_job_costs_the_database_is_reported(pg_server: Server) -> None:
    """WAL per job always; the per-statement split only where pg_stat_statements is loaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["SHARDQ_BENCH_DSN"] = pg_server.admin_dsn
    result = subprocess.run(
        [sys.executable, "-m", "shardq.benchmarks", "floor", "durable", "claim", "--quick",
         "--floor-batches", "100", "--json", "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["failures"] == {}
    sc = report["scenarios"]
    floor = next(r for r in sc["floor"]["runs"] if r["k"] == report["floor_batch"])
    drains = {"floor": floor, "durable": sc["durable"], "drain": sc["claim"]["backlog"]}
    for prefix, drain in drains.items():
        wal = drain["wal"]
        assert wal["bytes"] > 0
        assert report[f"{prefix}_wal_bytes_per_job"] == wal["bytes_per_job"] > 0
        assert wal["bytes_per_job"] == pytest.approx(wal["bytes"] / drain["jobs"], abs=0.05)
        if "by_rmgr" in wal:  # pg_walinspect: the same bytes by relation, named
            relations = wal["by_relation"]
            assert sum(e["bytes"] for e in relations.values()) == sum(
                e["bytes"] for e in wal["by_rmgr"].values())
            written = {"q"} if prefix == "floor" else {"tasks", "history", "history_pkey"}
            assert written <= set(relations), (prefix, list(relations))
    for prefix in ("durable", "drain"):
        assert report[f"{prefix}_pg_us_per_job"] == drains[prefix]["cpu"]["postgres_us_per_job"]
        assert report[f"{prefix}_pg_us_per_job"] > 0
    assert report["floor_cpu_us_per_job"] > 0
    for key, prefix in (("wal_over_floor", "drain"), ("durable_wal_over_floor", "durable")):
        assert report[key] == pytest.approx(
            report[f"{prefix}_wal_bytes_per_job"] / report["floor_wal_bytes_per_job"], abs=0.001)
    for key, prefix in (("pg_cpu_over_floor", "drain"), ("durable_pg_cpu_over_floor", "durable")):
        assert report[key] == pytest.approx(
            report[f"{prefix}_pg_us_per_job"] / report["floor_cpu_us_per_job"], abs=0.001)
    met = {t["metric"]: t["met"] for t in report["targets"]}
    assert met["wal_over_floor"] is not None
    assert met["pg_cpu_over_floor"] is not None
    # A shardq job writes the rows a raw queue job does and more.
    assert report["wal_over_floor"] > 1
    with psycopg.connect(pg_server.admin_dsn) as conn:
        row = conn.execute("SHOW shared_preload_libraries").fetchone()
    preloaded = row is not None and "pg_stat_statements" in str(row[0])
    said = [line for line in result.stderr.splitlines() if "no per-statement split" in line]
    if preloaded:
        assert said == []
        for prefix, names in (("floor", ("floor claim", "floor completion")),
                              ("drain", ("claim: shardq.claim_tasks()",
                                         "commit: shardq.commit_turns_v2()"))):
            split = drains[prefix]["by_statement"]
            found = {s["statement"] for s in split["statements"] if s["toplevel"]}
            assert all(any(f.startswith(n) for f in found) for n in names), found
            assert all(s["exec_us_per_job"] >= 0 for s in split["statements"])
    else:
        # Said once, in one line; the split is skipped, nothing failed.
        assert len(said) == 1, result.stderr
        assert all("by_statement" not in d for d in drains.values())
    text = table(report)
    for line in ("what one job cost the database", "WAL per job / raw floor's",
                 "PostgreSQL CPU per job / raw floor's whole-job CPU", "wal_over_floor",
                 "pg_cpu_over_floor"):
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
    client = Client(Store(pools), registry)
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


PARKED = 8
"""Fixture runs compared: four `park`, four `nap` (parked_run alternates)."""


def _snapshot(shard_map: ShardMap) -> dict[tuple[str, str], list[str]]:
    """Every row of every table of schema shardq on every shard, made comparable.

    Read generically, so that a table or column the engine gains is compared
    too. Per column what cannot match between two runs of the same workflow
    is replaced: an execution id by its run's key (so rows that point at a run
    still say which), any other uuid by `<uuid>`, an identity column by
    `<identity>`, and a time (a timestamp column or an ISO time inside JSON)
    by its distance from the database's now in whole hours (so a timer 90
    days out stays distinguishable from one due now). NULL stays NULL. The count
    changes are folded first: their rows follow the writing statements (one a
    batch), their sums are what must match.
    """
    out: dict[tuple[str, str], list[str]] = {}
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("SELECT shardq.fold_run_counts()")
            now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            runs = {r[0]: f"<run {r[1]}/{r[2]}/{r[3]}>" for r in conn.execute(
                "SELECT id, tenant, workflow_name, workflow_id FROM shardq.executions")}
            tables = [r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'shardq'"
                " AND table_type = 'BASE TABLE' ORDER BY table_name")]
            # What a worker declares when it starts (its registry's rate limiters), not
            # what the runs left: the fixture starts no worker.
            tables.remove("rate_limiters")
            for table in tables:
                identity = {r[0] for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema ="
                    " 'shardq' AND table_name = %s AND is_identity = 'YES'", (table,))}
                cur = conn.execute(sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier("shardq", table)))
                names = [c.name for c in cur.description or []]

                out[shard.name, table] = sorted(
                    json.dumps({n: "<identity>" if n in identity and v is not None
                                else _comparable(v, runs, now)
                                for n, v in zip(names, row, strict=True)}, sort_keys=True)
                    for row in cur.fetchall()
                )
    return out


def _comparable(value: Any, runs: dict[uuid.UUID, str], now: datetime) -> Any:
    """`value` with what differs between two runs of one workflow replaced (see _snapshot)."""
    value = _as_time(value)
    if isinstance(value, datetime):
        return f"<now{round((value - now).total_seconds() / 3600):+d}h>"
    if isinstance(value, uuid.UUID):
        return runs.get(value, "<uuid>")
    if isinstance(value, dict):
        return {k: _comparable(v, runs, now) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v, runs, now) for v in value]
    return value


def _as_time(value: Any) -> Any:
    """An ISO time with a zone (as JSON carries timestamps) parsed, anything else as it is."""
    if not isinstance(value, str) or "T" not in value:
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    return parsed if parsed.tzinfo is not None else value


def _differences(engine: dict[tuple[str, str], list[str]],
                 fixture: dict[tuple[str, str], list[str]]) -> str:
    lines = []
    for key in sorted(engine.keys() | fixture.keys()):
        ours, theirs = Counter(engine.get(key, [])), Counter(fixture.get(key, []))
        if ours != theirs:
            lines.append(f"{key[0]} shardq.{key[1]}:")
            lines += [f"  engine only:  {r}" for r in (ours - theirs).elements()][:6]
            lines += [f"  fixture only: {r}" for r in (theirs - ours).elements()][:6]
    return "\n".join(lines)


def _idle(shard_map: ShardMap) -> bool:
    """No task due or leased on any shard: every started run has had its turn."""
    return not any(all_rows(shard_map, "SELECT 1 FROM shardq.tasks"
                                       " WHERE run_at < now() + interval '1 day'"))


def test_the_parked_fixture_writes_what_the_engine_writes(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    """The `parked` scenario writes its million runs by SQL (benchmarks/parked.py),
    not through the engine. Those rows must be the ones the engine leaves for the
    same runs, table by table and shard by shard, or the scenario measures the
    drain beside something no real system holds: when the engine changes what it
    writes, this fails until queries.sql's insert_parked follows."""
    client = Client(Store(pools), registry)
    runs = [parked_run(i) for i in range(PARKED)]
    for name in ("park", "nap"):
        client.start_many(name, [(key, INPUT) for n, key in runs if n == name])
    worker = start_worker(registry)
    wait_until(lambda: _idle(shard_map), timeout=15, what="the runs' first turns")
    worker.stop()
    by_engine = _snapshot(shard_map)

    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("TRUNCATE " + ", ".join(f"shardq.{t}" for t in TABLES))
    landed = insert_parked(shard_map, PARKED, chunk=3)
    by_fixture = _snapshot(shard_map)
    assert sum(landed.values()) == PARKED
    assert by_fixture == by_engine, _differences(by_engine, by_fixture)

    # Its ids are the engine's: each routes, by its own bits, to the shard it sits
    # on and to the bucket of its key, so the client finds the run by key and by id.
    for shard in shard_map.shards:
        for id_, tenant, name, key in rows(
                shard.url, "SELECT id, tenant, workflow_name, workflow_id FROM shardq.executions"):
            assert bucket_of(id_) == bucket_for(tenant, name, key)
            assert shard_map.for_execution(id_) == shard
    park_name, park_key = parked_run(0)
    again = client.start(park_name, park_key, INPUT)
    assert not again.created
    # And a worker resumes it like any parked run.
    start_worker(registry)
    client.signal(again.execution_id, "go", {"n": 1})
    assert client.wait(again.execution_id, timeout=15).output == {"n": 1}
