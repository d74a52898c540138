"""Real PostgreSQL for every test: uniquely named shard databases, dropped at the end.

The tests are in layers, one folder each, and each test is marked with its
folder's name: `unit` (no database; tests/unit/conftest.py refuses one),
`store` (SQL and the Store against real PostgreSQL), `integration` (workers
and relays in this process), `acceptance` (real daemons and the `shardq`
command as subprocesses) and `migration`. `bash bin/test.sh tests/unit` is
the quick loop.

The server is, in order: $SHARDQ_TEST_DSN; the local server on 127.0.0.1:5432,
when it answers and has the connections the suite needs free; an embedded
throw-away server started for this session (one per xdist worker) otherwise
(SHARDQ_TEST_DSN=embedded forces that one, to check the path a fresh machine
takes). The choice is made once, before xdist starts its workers, and a fallback
says why in one line at the end of the run.

Every database a session creates is named `shardq_t{pid}_...` and dropped at its
end, failed or interrupted; a session killed outright leaves them, and the next
session on the same machine drops those whose process is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shardq.client.client import Client
from shardq.outbox.relay import Relay, RelayConfig
from shardq.shards.config import ShardMap
from shardq.shards.layout import split_schema
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.servers import LOCAL_DSN, answers, database_url
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker
from shardq.workflow.registry import Registry

from .support import Daemon, TcpProxy

ENV_TEST_POOLER = "SHARDQ_TEST_POOLER"
TABLES = ("history", "signals", "waits", "tasks", "outbox", "executions", "concurrency_keys",
          "key_queue", "tenant_weights", "rate_limiters", "rate_reservations", "children",
          "schedules", "workflow_builds", "ended_runs", "run_counts", "run_count_changes",
          "run_attributes")
STORED = tuple(t for t in TABLES if t not in ("run_counts", "run_count_changes"))
"""The tables a request that stores nothing leaves as they were: a worker folds the
count changes into the counts every few seconds (schema/0029), whatever requests come."""
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
        # A counter, not a random suffix: two calls of one session drew the same two
        # random bytes once (a 16-bit birthday collision over a few hundred databases).
        self._made = itertools.count()

    def url(self, dbname: str) -> str:
        return database_url(self.admin_dsn, dbname)

    def create_databases(self, count: int, tag: str = "") -> list[str]:
        names = [f"{self.prefix}{tag}_s{i}_{next(self._made)}" for i in range(count)]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in names:
                # Noted before it exists: a CREATE interrupted after the server ran it is
                # still dropped (IF EXISTS), and so is every one a crashing fixture made.
                self.created.append(name)
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return [self.url(n) for n in names]

    def drop_all(self, *, retry_for: float = 10.0) -> None:
        """Drop every database this session created, each on its own.

        A server still full (the "too many clients" that left a failed run's databases
        behind) is retried for `retry_for` seconds; what cannot be dropped is a warning,
        and the next session's sweep_leftovers() finds it.
        """
        if not self.created:
            return
        deadline = time.monotonic() + retry_for
        while True:
            try:
                conn = psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5)
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    warnings.warn(f"could not drop the session's databases {self.created}: "
                                  f"{exc}", stacklevel=1)
                    return
                time.sleep(0.2)
        failed: list[str] = []
        with conn:
            for name in list(self.created):
                try:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                                 .format(sql.Identifier(name)))
                    self.created.remove(name)
                except psycopg.Error as exc:
                    failed.append(f"{name} ({str(exc).strip()})")
        if failed:
            warnings.warn(f"could not drop {', '.join(failed)}", stacklevel=1)


# -- which server ----------------------------------------------------------------

CONNECTIONS_PER_WORKER = 80
"""Connections one xdist worker holds at its peak; the suite needs this times the workers.

Counted from the pools: a worker runs one test file at a time (--dist loadfile), so its
peak is its heaviest test. That is test_outbox_faults' ten thousand signals: a Client and
an in-process Worker (concurrency 40), each with its own pools over three shards at
pool_max=20 (2 x 3 x 20 = 120 if every pool filled), and two `outbox-relay` daemons, each
with the CLI's default pool_max 10 per shard plus a LISTEN connection per shard (2 x 33 =
66). Pools grow only to the connections used at once, so 186 is a bound no test reaches.
Measured (pg_stat_activity's client backends sampled every 2 ms, one process, its own
server): that file peaked at 75; the next heaviest (test_worker_processes: the session
map's 2 x 20 and two `shardq worker` daemons at 2 x (10 + 1) per shard; test_engine;
test_store; the benchmarks) at 16. 80 is that peak, rounded up for what a 2 ms sample
misses. With the two workers bin/test.sh runs the suite needs 160: more than a stock
server's 100, so there the parallel suite runs on embedded servers (300 connections
each), and a serial run (arguments given, 80) fits an idle one.
"""

SERVER_CHOICE = pytest.StashKey["ServerChoice"]()
_CHOICE_INPUT = "shardq_test_server"


@dataclass(frozen=True)
class ServerChoice:
    """The server the session's tests use: `dsn`, or an embedded one when it is None."""

    dsn: str | None
    reason: str = ""  # set when the run should say why (a fallback, a short budget)


def connection_budget(dsn: str) -> tuple[int, str]:
    """Connections a new client may still open at `dsn`, and how that was reckoned.

    max_connections less the slots reserved for superusers (and, from PostgreSQL 16, for
    pg_use_reserved_connections), less the client backends already connected (ours aside).
    """
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute("""
            SELECT current_setting('max_connections')::int,
                   current_setting('superuser_reserved_connections')::int
                   + coalesce(current_setting('reserved_connections', true), '0')::int,
                   (SELECT count(*) FROM pg_stat_activity
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int
        """).fetchone()
    assert row is not None
    maximum, reserved, in_use = row
    return maximum - reserved - in_use, (
        f"{maximum} max_connections - {reserved} reserved - {in_use} in use")


def choose_server(
    candidate: str, need: int, *, explicit: bool = False,
    embedded_available: Callable[[], bool] | None = None,
) -> ServerChoice:
    """`candidate` when it answers with `need` connections free, else an embedded server.

    An `explicit` candidate ($SHARDQ_TEST_DSN) is kept even when short, with a reason to
    print; so is one whose shortfall has no embedded server to fall back on.
    """
    try:
        free, reckoning = connection_budget(candidate)
    except psycopg.Error as exc:
        if explicit:
            return ServerChoice(candidate)  # its own errors will say what is wrong
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ServerChoice(None, f"{_where(candidate)} does not answer ({first})")
    if free >= need:
        return ServerChoice(candidate)
    short = (f"{_where(candidate)} has {free} connections free ({reckoning}), "
             f"the suite needs {need}")
    if explicit:
        return ServerChoice(candidate, f"{short}; using it anyway, as $SHARDQ_TEST_DSN says")
    if not (embedded_available or _embedded_available)():
        return ServerChoice(candidate, f"{short}, and no embedded server can start: using it")
    return ServerChoice(None, f"{short}: using an embedded server instead")


def _where(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    return f"PostgreSQL at {params.get('host') or 'localhost'}:{params.get('port') or 5432}"


def _embedded_available() -> bool:
    from shardq.shards.embedded import EmbeddedPostgresError, find_pg_bindir

    try:
        find_pg_bindir()
    except EmbeddedPostgresError:
        return False
    return True


def _xdist_workers(config: pytest.Config) -> int:
    """How many processes run tests at once: xdist's workers (one per --tx), else one."""
    if getattr(config.option, "dist", "no") == "no":
        return 1
    return max(1, len(getattr(config.option, "tx", None) or []))


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller chose
        chosen = workerinput.get(_CHOICE_INPUT)
        if chosen is not None:
            config.stash[SERVER_CHOICE] = ServerChoice(chosen["dsn"], chosen["reason"])
        return
    explicit = os.environ.get("SHARDQ_TEST_DSN")
    need = CONNECTIONS_PER_WORKER * _xdist_workers(config)
    swept = None
    if explicit == "embedded":
        choice = ServerChoice(None)
    elif explicit:
        choice, swept = choose_server(explicit, need, explicit=True), explicit
    elif answers(LOCAL_DSN):
        choice, swept = choose_server(LOCAL_DSN, need), LOCAL_DSN
    else:
        choice = ServerChoice(None)  # a fresh machine's usual path: nothing to say
    config.stash[SERVER_CHOICE] = choice
    # Before any worker starts, and whichever server the tests then use: a stock server
    # the suite falls back from would otherwise keep a killed run's databases for good.
    if swept is not None:
        with contextlib.suppress(psycopg.Error):  # the tests will report a server that fails
            sweep_leftovers(make_conninfo(swept))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller hands its choice to each worker it starts."""
    choice = node.config.stash.get(SERVER_CHOICE, None)
    if choice is not None:
        node.workerinput[_CHOICE_INPUT] = {"dsn": choice.dsn, "reason": choice.reason}


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None:
        choice = config.stash.get(SERVER_CHOICE, None)
        if choice is not None and choice.reason:
            terminalreporter.write_line(f"shardq tests: {choice.reason}")


# -- leftovers -------------------------------------------------------------------

_TEST_DATABASE = re.compile(r"shardq_t(\d+)_")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's, alive
    return True


def _is_local(dsn: str) -> bool:
    host = str(conninfo_to_dict(dsn).get("host") or "")
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


def sweep_leftovers(admin_dsn: str) -> list[str]:
    """Drop the `shardq_t{pid}_...` databases whose test process is gone; return them.

    Only on a server on this machine, where the pid means a process here; and never one
    still connected to (no FORCE): a pid reused by a live process keeps its databases.
    """
    if not _is_local(admin_dsn):
        return []
    dropped = []
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
        names = [name for (name,) in conn.execute(
            r"SELECT datname FROM pg_database WHERE datname LIKE 'shardq\_t%'")]
        for name in names:
            found = _TEST_DATABASE.match(name)
            if found is None or _process_exists(int(found.group(1))):
                continue
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            except psycopg.Error:
                continue  # in use after all, or another session's sweep got there first
            dropped.append(name)
    return dropped


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[Server]:
    choice = pytestconfig.stash.get(SERVER_CHOICE, None)
    if choice is None:  # a plugin set-up without our pytest_configure: choose here
        explicit = os.environ.get("SHARDQ_TEST_DSN")
        choice = ServerChoice(explicit if explicit and explicit != "embedded" else
                              None if explicit or not answers(LOCAL_DSN) else LOCAL_DSN)
    embedded = None
    if choice.dsn is not None:
        dsn = choice.dsn
    else:
        from shardq.shards.embedded import EmbeddedPostgres

        # One per xdist worker: each in its own mkdtemp folder under /tmp, listening only
        # on a Unix socket there, so workers' servers share no port, socket or data.
        embedded = EmbeddedPostgres().start()
        dsn = embedded.dsn("postgres")
    server = Server(make_conninfo(dsn))
    try:
        yield server
    finally:
        # Session teardown: after a failed test and after Ctrl-C (pytest tears the session
        # down on KeyboardInterrupt) alike.
        try:
            server.drop_all()
        finally:
            if embedded is not None:
                embedded.stop()


@pytest.fixture(scope="session")
def shard_urls(pg_server: Server) -> list[str]:
    """Two migrated shard databases shared by the session's store and engine tests."""
    return pg_server.create_databases(2, tag="main")


@pytest.fixture(scope="session")
def test_pooler(pg_server: Server) -> Iterator[str | None]:
    """With SHARDQ_TEST_POOLER=1, a PgBouncer in transaction mode in front of the session's
    server: the session's shard map and every daemon started by `daemons` connect
    through it (docs/development.md). None otherwise."""
    if os.environ.get(ENV_TEST_POOLER) != "1":
        yield None
        return
    from shardq.benchmarks.pgbouncer import running_pgbouncer

    with running_pgbouncer(pg_server.admin_dsn) as pooler:
        yield pooler.address


def _on_session_server(args: Sequence[str], env: dict[str, str], server: Server) -> bool:
    """Whether the shards a daemon is given (`--shards`, SHARDQ_SHARDS) are all on `server`."""
    given = list(args)
    urls = (given[given.index("--shards") + 1] if "--shards" in given
            else env.get("SHARDQ_SHARDS", "")).split(",")
    home = conninfo_to_dict(server.admin_dsn)
    return all(url.strip() and all(
        conninfo_to_dict(split_schema(url.strip())[0]).get(k) == home.get(k)
        for k in ("host", "port")) for url in urls)


@pytest.fixture(scope="session")
def migrated_map(shard_urls: list[str], test_pooler: str | None) -> ShardMap:
    shard_map = ShardMap.from_urls(shard_urls, pool_max=20)
    migrate(shard_map)
    return replace(shard_map, pooler=test_pooler)


@pytest.fixture
def shard_map(migrated_map: ShardMap) -> ShardMap:
    """The session's shards, emptied before the test."""
    for shard in migrated_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("TRUNCATE " + ", ".join(f"shardq.{t}" for t in TABLES))
    return migrated_map


@pytest.fixture
def frozen_rig(shard_map: ShardMap) -> Iterator[tuple[TcpProxy, ShardMap]]:
    """The session's two shards, shard 1 through a TcpProxy the test can freeze (a server
    that hangs, TCP alive: tests of shards/liveness.py), and a map that reaches it so."""
    proxy = TcpProxy.to(shard_map.shards[1].url)
    try:
        yield proxy, ShardMap.from_urls(
            [shard_map.shards[0].url, proxy.url(shard_map.shards[1].url)], pool_max=20)
    finally:
        proxy.stop()


@pytest.fixture
def fresh_databases(pg_server: Server) -> Callable[[int], list[str]]:
    """Empty, unmigrated databases for tests that migrate or break things themselves."""
    return pg_server.create_databases


@pytest.fixture
def pools(shard_map: ShardMap) -> Iterator[ShardPools]:
    with ShardPools(shard_map) as opened:
        yield opened


@pytest.fixture
def store(pools: ShardPools) -> Store:
    """The store seam over the test's shards (its `pools`)."""
    return Store(pools)


@pytest.fixture
def client(pools: ShardPools, request: pytest.FixtureRequest) -> Client:
    """A Client over the test's shards (its `pools`) for the workflows of the `registry`
    its module defines or imports. A module whose client differs (other shards, a
    registry made by a fixture) defines a `client` fixture of its own."""
    registry = getattr(request.module, "registry", None)
    if not isinstance(registry, Registry):
        pytest.fail(f"{request.module.__name__} has no module-level `registry` (a shardq "
                    "Registry) for the `client` fixture to serve")
    return Client(Store(pools), registry)


@pytest.fixture
def daemons(tmp_path: Path, test_pooler: str | None,
            pg_server: Server) -> Iterator[Callable[..., Daemon]]:
    """Start `shardq` processes (args after `shardq`); each still running is killed after.
    Under SHARDQ_TEST_POOLER=1 those whose shards are all on the session's server connect
    through its PgBouncer (which knows no other server)."""
    started: list[Daemon] = []

    def start(args: Sequence[str], env: dict[str, str] | None = None) -> Daemon:
        if test_pooler is not None and _on_session_server(args, env or {}, pg_server):
            env = {"SHARDQ_POOLER": test_pooler, **(env or {})}
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


@pytest.fixture
def relay(pools: ShardPools) -> Iterator[Callable[..., Relay]]:
    """Start in-process outbox relays (quick retries); every one is stopped after the test."""
    started: list[Relay] = []

    def start(**config: Any) -> Relay:
        settings = {"poll_interval_s": 0.5, "initial_backoff_s": 0.05, "max_backoff_s": 0.2,
                    **config}
        running = Relay(Store(pools), config=RelayConfig(**settings)).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
