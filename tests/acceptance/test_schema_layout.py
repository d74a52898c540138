"""Shards as schemas (shards/layout.py): four shards in two databases, two schemas each,
run by a worker and a relay as an operator runs them. Each daemon's safety poll is
30 s, so a run woken within seconds was woken by a NOTIFY its database's shared
LISTEN connection heard; every run's rows are in its own shard's schema; and the
worker's connections to a database do not grow with the shards in it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.layout import with_schema
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker

from ..app import registry
from ..conftest import Server
from ..support import Daemon, keys_on, run_cli, wait_until

pytestmark = pytest.mark.slow
APP = "shardq.tests.app:registry"
SCHEMAS = ("s00", "s01")


@pytest.fixture(scope="module")
def schema_map(pg_server: Server) -> ShardMap:
    """Two databases, each holding shards in schemas s00 and s01: four shards."""
    databases = pg_server.create_databases(2, tag="schemas")
    urls = [with_schema(db, schema) for db in databases for schema in SCHEMAS]
    shard_map = ShardMap.from_urls(urls, pool_min=1, pool_max=3)
    migrate(shard_map)
    return shard_map


@pytest.fixture
def client(schema_map: ShardMap) -> Iterator[Client]:
    with ShardPools(schema_map, application_name="tests") as pools:
        yield Client(Store(pools), registry)


def _env(shard_map: ShardMap) -> dict[str, str]:
    return {"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards),
            "SHARDQ_POOL_MIN": "1", "SHARDQ_POOL_MAX": "3"}


def _rows_by_schema(shard_map: ShardMap, table: str) -> dict[str, int]:
    counts = {}
    for shard in shard_map.shards:
        with psycopg.connect(shard.conninfo) as conn:
            row = conn.execute(f"SELECT count(*) FROM {shard.schema}.{table}").fetchone()
            assert row is not None
            counts[shard.name] = int(row[0])
    return counts


def _daemon_connections(shard_map: ShardMap) -> dict[str, int]:
    """Sessions of shardq's daemons (named shardq*; the tests' client is not) by database."""
    with psycopg.connect(shard_map.shards[0].conninfo) as conn:
        rows = conn.execute(
            "SELECT datname, count(*) FROM pg_stat_activity WHERE application_name LIKE "
            "'shardq%%' AND datname = ANY(%s) GROUP BY datname",
            ([str(conninfo_to_dict(s.conninfo)["dbname"]) for s in shard_map.shards],))
        return {str(db): int(n) for db, n in rows}


def test_schema_shards_run_signal_and_relay_with_shared_connections(
    schema_map: ShardMap, client: Client, daemons: Callable[..., Daemon],
    test_pooler: str | None,
) -> None:
    env = _env(schema_map)
    worker = daemons(["worker", "--app", APP, "--poll-interval", "30", "--lease", "5"], env)
    relay = daemons(["outbox-relay", "--poll-interval", "30"], env)
    runs = [client.start("noop", f"n-{i}").execution_id for i in range(40)]
    for run in runs:
        assert client.wait(run, timeout=30).state is State.COMPLETED
    # Every shard got runs, and each run's rows are in its shard's schema alone.
    placed = _rows_by_schema(schema_map, "executions")
    assert all(placed.values()) and sum(placed.values()) == 40, placed
    for run in runs[:8]:
        shard = client.map.for_execution(run)
        with psycopg.connect(shard.conninfo) as conn:
            found = conn.execute(f"SELECT count(*) FROM {shard.schema}.executions WHERE id = %s",
                                 (run,)).fetchone()
        assert found == (1,), (run, shard.name)

    parked = [client.start("park", f"p-{i}").execution_id for i in range(12)]
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in parked),
               what="parked", timeout=20)
    for run in parked[:4]:
        signalled = time.monotonic()
        client.signal(run, "go", 1)
        assert client.wait(run, timeout=20).output == 1
        assert time.monotonic() - signalled < 10  # the 30 s poll did not wake it
    # Signals to runs on the other shards: same schema, another schema of the same
    # database, another database (outbox and relay).
    sender = client.start("tenant_cancel", "sender",
                          {"runs": [str(r) for r in parked[4:]]}).execution_id
    sent = client.wait(sender, timeout=20).output
    assert sent["queued"], sent
    wait_until(lambda: all(
        [s.name for s in client.waiting(r)[1]] == ["tenant_cancelled"] for r in parked[4:]),
        what="every signal delivered, the relay's included", timeout=15)
    family = client.start("family", "fam", {"tag": "t"}).execution_id
    assert client.wait(family, timeout=30).state is State.COMPLETED

    for daemon in (worker, relay):
        assert daemon.proc.poll() is None, daemon.stderr()[-2000:]
        assert "Traceback" not in daemon.stderr(), daemon.stderr()[-3000:]
    if test_pooler is not None:
        return  # the worker's pools are PgBouncer's clients: it holds the server's sessions
    relay.kill()
    # The worker alone: one pool (at most 3) and one LISTEN per database, not per shard.
    def worker_alone() -> dict[str, int] | None:
        counts = _daemon_connections(schema_map)
        return counts if sum(counts.values()) <= 2 * (3 + 1) else None

    held = wait_until(worker_alone, what="the relay's sessions gone", timeout=10)
    assert len(held) == 2 and all(2 <= n <= 3 + 1 for n in held.values()), held


def test_runs_move_from_a_database_onto_a_schema_shard_while_a_worker_runs(
    fresh_databases: Callable[[int], list[str]], daemons: Callable[..., Daemon],
) -> None:
    """shard-0 a database of its own, shard-1 schema s00 of another; `shards add` puts
    shard-2 in schema s01 beside shard-1 (not "a database that is not empty") and
    `shards move` carries shard-0's buckets onto it: the parked runs wake there."""
    plain, shared = fresh_databases(2)
    urls = [plain, with_schema(shared, "s00")]
    env = {"SHARDQ_SHARDS": ",".join(urls), "SHARDQ_MAP_POLL_S": "1"}
    migrated = run_cli("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    shard_map = ShardMap.from_urls(urls)
    worker = daemons(["worker", "--app", APP, "--poll-interval", "30"], env)
    with Client.connect(shard_map, registry) as client:
        parked = [client.start("park", key).execution_id
                  for key in keys_on(shard_map, 0, "park", "m", 12)]
        wait_until(lambda: all(client.get(r).state is State.WAITING for r in parked),
                   what="parked", timeout=20)
        added = run_cli("--json", "shards", "add", "shard-2", with_schema(shared, "s01"), env=env)
        assert added.returncode == 0, added.stderr
        moved = run_cli("--json", "shards", "move", "0-2047", "--to", "shard-2", "--grace",
                        "1", env=env, timeout=120)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert json.loads(moved.stdout)["runs_moved"] == 12
        for run in parked:
            client.signal(run, "go", 2)
        for run in parked:
            assert client.wait(run, timeout=20).output == 2
        fresh = client.start("noop", keys_on(shard_map, 0, "noop", "after", 1)[0])
        assert client.wait(fresh.execution_id, timeout=20).state is State.COMPLETED
    with psycopg.connect(shared) as conn:
        in_s01 = conn.execute("SELECT count(*) FROM s01.executions").fetchone()
        in_s00 = conn.execute("SELECT count(*) FROM s00.executions").fetchone()
    with psycopg.connect(plain) as conn:
        left = conn.execute("SELECT count(*) FROM shardq.executions").fetchone()
    assert (in_s01, in_s00, left) == ((13,), (0,), (0,))
    assert worker.proc.poll() is None, worker.stderr()[-2000:]


def test_the_async_client_shares_a_pool_per_database_and_reads_each_schema(
    schema_map: ShardMap,
) -> None:
    from shardq.client.async_client import AsyncClient

    async def scenario() -> None:
        async with AsyncClient.connect(schema_map, registry) as aclient:
            started = await aclient.start_many("noop", [(f"a-{i}", None) for i in range(24)])
            for run in started:
                assert (await aclient.wait(run.execution_id, timeout=20)).state \
                    is State.COMPLETED
            for i, run in enumerate(started[:4]):
                assert (await aclient.get(run.execution_id)).workflow_id == f"a-{i}"
            pools = aclient.store.pools
            s00a, s01a, s00b, s01b = schema_map.shards
            assert pools.pool(s00a) is pools.pool(s01a) is not None
            assert pools.pool(s00b) is pools.pool(s01b) is not pools.pool(s00a)

    with ShardPools(schema_map) as pools:
        worker = Worker(Store(pools), registry, config=WorkerConfig(poll_interval_s=0.2))
        worker.start()
        try:
            asyncio.run(scenario())
        finally:
            worker.stop(drain_timeout_s=5)
    placed = _rows_by_schema(schema_map, "executions")
    assert sum(placed.values()) >= 24 and all(placed.values()), placed
