"""Real PostgreSQL for every test: uniquely named shard databases, dropped at the end.

The tests are in layers, one folder each, and each test is marked with its
folder's name: `unit` (no database; tests/unit/conftest.py refuses one),
`store` (SQL and the Store against real PostgreSQL), `integration` (workers
and relays in this process), `acceptance` (real daemons and the `shardq`
command as subprocesses) and `migration`. `bash bin/test.sh tests/unit` is
the quick loop.

The server is, in order: $SHARDQ_TEST_DSN; the local server on 127.0.0.1:5432;
an embedded throw-away server started for this session when neither answers
(SHARDQ_TEST_DSN=embedded forces that one, to check the path a fresh machine takes).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shardq.queue.registry import Registry
from shardq.queue.store import Store
from shardq.queue.worker import Worker, WorkerConfig
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.servers import LOCAL_DSN, answers, database_url

from .support import Daemon

TABLES = ("history", "signals", "waits", "tasks", "outbox", "executions")
LAYERS = ("unit", "store", "integration", "acceptance", "migration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = item.path.parent.name
        if layer in LAYERS:
            item.add_marker(layer)


class Server:
    """A PostgreSQL server the session may create and drop databases on."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.prefix = f"shardq_t{os.getpid()}_{secrets.token_hex(3)}"
        self.created: list[str] = []

    def url(self, dbname: str) -> str:
        return database_url(self.admin_dsn, dbname)

    def create_databases(self, count: int, tag: str = "") -> list[str]:
        names = [f"{self.prefix}{tag}_s{i}_{secrets.token_hex(2)}" for i in range(count)]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                self.created.append(name)
        return [self.url(n) for n in names]

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in self.created:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    explicit = os.environ.get("SHARDQ_TEST_DSN")
    embedded = None
    if explicit and explicit != "embedded":
        dsn = explicit
    elif not explicit and answers(LOCAL_DSN):
        dsn = LOCAL_DSN
    else:
        from shardq.shards.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres().start()
        dsn = embedded.dsn("postgres")
    server = Server(make_conninfo(dsn))
    try:
        yield server
    finally:
        server.drop_all()
        if embedded is not None:
            embedded.stop()


@pytest.fixture(scope="session")
def shard_urls(pg_server: Server) -> list[str]:
    """Two migrated shard databases shared by the session's store and engine tests."""
    return pg_server.create_databases(2, tag="main")


@pytest.fixture(scope="session")
def migrated_map(shard_urls: list[str]) -> ShardMap:
    shard_map = ShardMap.from_urls(shard_urls, pool_max=20)
    migrate(shard_map)
    return shard_map


@pytest.fixture
def shard_map(migrated_map: ShardMap) -> ShardMap:
    """The session's shards, emptied before the test."""
    for shard in migrated_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("TRUNCATE " + ", ".join(f"shardq.{t}" for t in TABLES))
    return migrated_map


@pytest.fixture
def fresh_databases(pg_server: Server) -> Callable[[int], list[str]]:
    """Empty, unmigrated databases for tests that migrate or break things themselves."""
    return pg_server.create_databases


@pytest.fixture
def pools(shard_map: ShardMap) -> Iterator[ShardPools]:
    with ShardPools(shard_map) as opened:
        yield opened


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start `shardq` processes (args after `shardq`); each still running is killed after."""
    started: list[Daemon] = []

    def start(args: Sequence[str], env: dict[str, str] | None = None) -> Daemon:
        daemon = Daemon(f"daemon-{len(started)}", args, tmp_path, env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


@pytest.fixture
def start_worker(pools: ShardPools) -> Iterator[Callable[..., Worker]]:
    """Start in-process workers for a registry; every one is stopped after the test."""
    started: list[Worker] = []

    def start(registry: Registry, **config: Any) -> Worker:
        settings = {"poll_interval_s": 30.0, "lease_s": 5.0, "drain_timeout_s": 2.0, **config}
        worker = Worker(Store(pools), registry, config=WorkerConfig(**settings)).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
