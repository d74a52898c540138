"""A shard that answers but cannot do the work (read-only, statement cancelled) is
unavailable to its callers: one ShardUnavailable naming it, nothing written, never
a raw database error that an API would turn into a 500."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from shardq.client.client import Client
from shardq.core.errors import ShardUnavailable
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.workflow.registry import Registry

from ..support import allow_connections, rows, wait_until

registry = Registry()


@registry.workflow("noop")
def noop(_ctx: object) -> None:
    return None


@pytest.fixture
def read_only_shard(fresh_databases: Callable[..., list[str]]) -> Iterator[ShardMap]:
    shard_map = ShardMap.from_urls(fresh_databases(1, "ro"))
    migrate(shard_map)
    url = shard_map.shards[0].url
    name = sql.Identifier(str(conninfo_to_dict(url)["dbname"]))
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                      .format(name))
    yield shard_map


def test_a_read_only_shard_refuses_a_start_as_unavailable(read_only_shard: ShardMap) -> None:
    with ShardPools(read_only_shard) as pools:
        client = Client(Store(pools), registry)
        with pytest.raises(ShardUnavailable) as refused:
            client.start("noop", "k-1")
    assert str(refused.value).startswith(read_only_shard.shards[0].label + ":")
    assert "read-only" in str(refused.value)
    assert rows(read_only_shard.shards[0].url, "SELECT count(*) FROM shardq.executions") == [(0,)]


def test_a_statement_the_server_cancels_is_unavailable_not_a_crash(
    fresh_databases: Callable[..., list[str]],
) -> None:
    """A cancel stuck behind a lock another session holds gives up at statement_timeout."""
    shard_map = ShardMap.from_urls(fresh_databases(1, "st"))
    migrate(shard_map)
    url = shard_map.shards[0].url
    with ShardPools(shard_map, options="-c statement_timeout=200") as pools:
        client = Client(Store(pools), registry)
        run = client.start("noop", "k-1").execution_id
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s FOR UPDATE",
                           [run])
            with pytest.raises(ShardUnavailable) as refused:
                client.cancel(run)
    assert "statement timeout" in str(refused.value)
    assert [k for (k,) in rows(url, "SELECT kind FROM shardq.events")] == []


@pytest.mark.parametrize("probe", [True, False], ids=["probing pools", "background pools"])
def test_a_shard_that_refused_its_first_reach_is_used_once_it_answers(
    fresh_databases: Callable[..., list[str]], probe: bool
) -> None:
    """Down at the first use (refused), then back: the next use a second later goes
    through, on a pool that was opened (probing) or renewed (background) for it."""
    shard_map = ShardMap.from_urls(fresh_databases(1, "back"))
    migrate(shard_map)
    urls = [s.url for s in shard_map.shards]
    with ShardPools(shard_map, probe=probe, timeout=2.0) as pools:
        client = Client(Store(pools), registry)
        allow_connections(urls, allowed=False)
        try:
            with pytest.raises(ShardUnavailable):
                client.start("noop", "k-1")
        finally:
            allow_connections(urls, allowed=True)
        started = time.monotonic()
        run = wait_until(lambda: _started(client), timeout=10, what="the shard taken back")
        assert time.monotonic() - started < 5
    assert rows(urls[0], "SELECT id FROM shardq.executions") == [(run,)]


def _started(client: Client) -> object:
    try:
        return client.start("noop", "k-1").execution_id
    except ShardUnavailable:
        return None
