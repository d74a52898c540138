"""How many connections a worker holds at 64 shards: `connections_per_worker_64_shards`.

64 shards on 2 PostgreSQL servers (the suite's, and an embedded one started for the
scenario), as schemas of one database per server (shards/layout.py): 32 each. One
worker process, started as an operator starts it, serves all 64 while the scenario
starts one-step runs on every shard (500 a call) and waits for them; a sampler counts
the worker's sessions on both servers every 20 ms (its pools are `shardq-worker`, its
LISTEN connections `shardq`; the scenario's own client is named otherwise). The same
is measured at 8 shards (4 a server) for the other half of the claim: a process's
connections do not grow with the shards.

A shard per database cannot get there: a connection is bound to one database, so a
worker holds at least a LISTEN and a pooled connection per shard, 128 at 64 (17-20 at
8 shards was the issue's measurement).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import ENV_DSN
from shardq.benchmarks.fleet import Fleet, FleetConfig
from shardq.benchmarks.measure import Progress
from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.layout import with_schema
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.servers import LOCAL_DSN, database_url
from shardq.store.store import Store

DATABASE = "connbench"
POOL_MAX = 6
"""The worker's pool per database: `SHARDQ_POOL_MAX`, what an operator sizes once per
server, whatever the shards on it."""
RUNS_PER_SHARD = 40
SAMPLE_S = 0.02
SESSIONS = """SELECT count(*) FROM pg_stat_activity
WHERE datname = %s AND application_name IN ('shardq', 'shardq-worker')"""


def connections(b: Bench) -> dict[str, Any]:
    b.stop_fleet()  # the suite's workers hold sessions of their own
    admin = b.shards.admin_dsn or os.environ.get(ENV_DSN) or LOCAL_DSN
    out: dict[str, Any] = {"connections_pool_max": POOL_MAX}
    with EmbeddedPostgres() as second, _databases([admin, second.dsn()]) as servers:
        for per_server in (4, 32):
            urls = [with_schema(db, f"c{i:02d}") for db in servers for i in range(per_server)]
            peak, idle, rate = _serve(urls, servers, f"{len(urls)} shards")
            out[f"connections_per_worker_{len(urls)}_shards"] = peak
            out[f"connections_per_worker_{len(urls)}_shards_idle"] = idle
            out[f"connections_{len(urls)}_shards_runs_per_s"] = round(rate, 1)
    return out


@contextmanager
def _databases(admins: Sequence[str]) -> Iterator[list[str]]:
    """A fresh database on each server, dropped on the way out."""
    made: list[tuple[str, str]] = []
    try:
        for admin in admins:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(DATABASE)))
                made.append((admin, DATABASE))
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        yield [database_url(admin, DATABASE) for admin in admins]
    finally:
        for admin, name in made:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))


def _serve(urls: list[str], servers: list[str], label: str) -> tuple[int, int, float]:
    """The worker's peak sessions while it drains runs on every shard, its sessions once
    idle, and the runs it drained a second."""
    shard_map = ShardMap.from_urls(urls)
    migrate(shard_map)
    config = FleetConfig(workers=1, concurrency=16, batch_size=16,
                         env=(("SHARDQ_POOL_MIN", "1"), ("SHARDQ_POOL_MAX", str(POOL_MAX))))
    with Fleet(urls, config) as fleet, ShardPools(shard_map, application_name="bench") as pools, \
            _Sampler(servers) as sampler:
        _wait_serving(fleet)
        client = Client(Store(pools), registry)
        sampler.start()
        n = RUNS_PER_SHARD * len(urls)
        bar = Progress(f"{label}: one worker drains", n)
        started = time.monotonic()
        runs = [r.execution_id for chunk in range(0, n, 500) for r in client.start_many(
            "noop", [(f"c-{i}", None) for i in range(chunk, min(n, chunk + 500))])]
        for i, run in enumerate(runs):
            if client.wait(run, timeout=120).state is not State.COMPLETED:
                raise RuntimeError(f"run {run} did not complete: {fleet.tail()}")
            bar.update(i + 1)
        rate = n / (time.monotonic() - started)
        bar.close()
        peak = sampler.stop()
        time.sleep(2.0)  # idle: claim loops asleep on their wakes
        idle = sum(sampler.count())
    for url in servers:
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(len(urls) // len(servers)):
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(f"c{i:02d}")))
    return peak, idle, rate


def _wait_serving(fleet: Fleet, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all("serving" in log.read_text(errors="replace") for log in fleet.logs):
        fleet.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start: {fleet.tail()}")
        time.sleep(0.05)


class _Sampler:
    """The worker's sessions on every server, counted every SAMPLE_S; the peak kept."""

    def __init__(self, servers: list[str]) -> None:
        self._conns = [psycopg.connect(url, autocommit=True) for url in servers]
        self._names = [str(c.info.dbname) for c in self._conns]
        self._stop = threading.Event()
        self._peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for conn in self._conns:
            conn.close()

    def start(self) -> None:
        self._thread.start()

    def count(self) -> list[int]:
        counts = []
        for conn, name in zip(self._conns, self._names, strict=True):
            row = conn.execute(SESSIONS, (name,)).fetchone()
            counts.append(int(row[0]) if row else 0)
        return counts

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._peak = max(self._peak, sum(self.count()))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self._peak
