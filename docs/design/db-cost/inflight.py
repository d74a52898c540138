"""Claim + commit cost per job with M leases in flight at the head of tasks_due.

The probe behind db-cost.md's measurement of B with leases in flight (not part
of the suite). One database on 127.0.0.1:5432, migrated by the shardq on
PYTHONPATH (a `git archive` of a revision with a root `__init__.py`, as
benchmarks/ab.py exports one). M runs are started and claimed first (lease
600 s, never committed: turns in flight; with a third argument, heartbeated
once), then N noop runs are started and drained in one backend by the durable
floor's loop. Prints one JSON line: backend CPU us/job (from /proc of the
drain's backend), wall us/job, WAL B/job.

    PYTHONPATH=TREE/.pkgroot .venv/bin/python docs/design/db-cost/inflight.py N M [beat]
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time

import psycopg

from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.core.models import Event, NewEvent, State, TaskAction, TurnCommit
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.store.params import Lease
from shardq.store.store import Store

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    n, m, k = int(sys.argv[1]), int(sys.argv[2]), 100
    name = f"inflight_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    try:
        shard_map = ShardMap.from_urls([url], pool_min=1, pool_max=1)
        migrate(shard_map)
        with ShardPools(shard_map) as pools:
            store = Store(pools)
            client = Client(store, registry)
            (shard,) = shard_map.shards
            for i in range(0, m, 1000):
                client.start_many("noop", [(f"f{j}", None) for j in range(i, min(m, i + 1000))])
            if m:
                claimed, _ = store.claim(shard, owner="inflight", limit=m, lease_s=600)
                assert len(claimed) == m
                if len(sys.argv) > 3:  # heartbeated once: the turns outlived a heartbeat
                    store.extend_leases(shard, [Lease(c.execution_id, c.lease_token)
                                                for c in claimed], 600)
            for i in range(0, n, 5000):
                client.start_many("noop", [(f"j{j}", None) for j in range(i, min(n, i + 5000))])
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE shardq.tasks, shardq.executions, shardq.history")
                conn.execute("CHECKPOINT")
            with pools.connection(shard) as conn:
                pid = conn.execute("SELECT pg_backend_pid() AS p").fetchone()["p"]
                lsn0 = conn.execute("SELECT pg_current_wal_insert_lsn() AS l").fetchone()["l"]
            done, cpu0, t0 = 0, cpu_of(pid), time.perf_counter()
            while True:
                claims, _ = store.claim(shard, owner="drain", limit=k, lease_s=30)
                if not claims:
                    break
                store.commit_turns(shard, [
                    TurnCommit(c.execution_id, c.lease_token,
                               events=[NewEvent(0, Event.STEP_COMPLETED, "run", {"result": None})],
                               state=State.COMPLETED, output_json="null", task=TaskAction.DELETE)
                    for c in claims], lease_s=30)
                done += len(claims)
            wall, cpu = time.perf_counter() - t0, cpu_of(pid) - cpu0
            with pools.connection(shard) as conn:
                wal = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn AS w",
                                   (lsn0,)).fetchone()["w"]
        assert done == n, (done, n)
        print(json.dumps({"cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n,
                          "wal_b": float(wal) / n, "m": m, "beat": len(sys.argv) > 3}))
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
