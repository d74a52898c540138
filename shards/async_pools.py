"""One asyncio connection pool per shard, routed by the map a sync follower keeps.

`AsyncShardPools` is shards/pools.py's `ShardPools` for coroutines: the same
promises (a shard that is down is one clear ShardUnavailable, a frozen server is
noticed within shards.liveness.HUNG_NOTICE_S, a removed shard is ShardRetired),
over psycopg's `AsyncConnectionPool`. The map is followed by a sync ShardPools in
probe mode, which opens a connection only when it reads a map.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from shardq.shards.check import verify_shard
from shardq.shards.config import Shard, ShardMap, redact
from shardq.shards.connections import (
    CONNECT_TIMEOUT_S,
    SILENT_PEER_TIMEOUT_S,
    connection_lost,
    describe_connect_error,
    tcp_settings,
)
from shardq.shards.errors import SchemaBehind, ShardRetired, ShardUnavailable
from shardq.shards.follow import map_poll_interval
from shardq.shards.liveness import (
    GuardedAsyncConnection,
    liveness_of,
    no_connection,
    waited_in_vain,
)
from shardq.shards.pools import (
    Outages,
    ShardPools,
    closed_under,
    pooled_settings,
    round_trip_cap,
    server_options,
)

if TYPE_CHECKING:
    from shardq.shards.check import ShardStatus

log = logging.getLogger(__name__)

AsyncDictConnection = psycopg.AsyncConnection[dict[str, Any]]


def guarding_async(
    url: str, max_wait_s: float | None
) -> Callable[[GuardedAsyncConnection], Awaitable[None]]:
    """An async pool's `configure`: bound the round trips of each connection it opens
    (shards/liveness.py: a frozen server fails a call within HUNG_NOTICE_S)."""
    liveness = liveness_of(url)

    async def configure(conn: GuardedAsyncConnection) -> None:
        conn.guard(liveness, max_wait_s=max_wait_s)

    return configure


class AsyncShardPools:
    """One `AsyncConnectionPool` per database, made and opened on first use (shards in
    one database share it, as ShardPools' do); the map they route by is followed by a
    sync ShardPools in probe mode (`follower`).

    What shards.pools.ShardPools promises its callers, these keep too:

    - A shard is verified (its recorded map and schema) the first time it is
      reached, by a direct connection, unless the caller checked it just before
      (`verified`, as verify_shards returns): a shard that is down on first use
      fails that call at once with libpq's reason, and its pool is not made.
    - After a failure that says the shard is gone (refused, timed out, broken
      connection), calls fail at once with that error, and one call a second
      (DOWN_PROBE_INTERVAL_S) tries a direct connection; the one that succeeds
      gives the shard a fresh pool, so a shard that came back is used within a
      second, not after the old pool's reconnection backoff. A server behind an
      HTTP API is why: a down shard must cost a request nothing, not a pool timeout.
    - A shard a newer map version drops has its pool closed after its last
      connection comes back.

    `options` are server settings for every connection, in libpq's form;
    `statement_timeout_s` as ShardPools takes it (the server's timeout, and a cap
    on each round trip a margin later).
    """

    def __init__(
        self, shard_map: ShardMap, *, verified: Iterable[Shard | ShardStatus] = (),
        timeout: float = 10.0, application_name: str = "shardq",
        follow_every_s: float | None = None, options: str | None = None,
        statement_timeout_s: float | None = None,
    ) -> None:
        checked = list(verified)
        self.follower = ShardPools(
            shard_map, probe=True, verified=checked, application_name=application_name,
            timeout=timeout, statement_timeout_s=statement_timeout_s,
            follow_every_s=map_poll_interval() if follow_every_s is None else follow_every_s)
        self._verified: set[str] = {
            v.name if isinstance(v, Shard) else v.shard.name
            for v in checked if isinstance(v, Shard) or v.reachable}
        self._timeout = timeout
        self._connect_kwargs: dict[str, Any] = {
            "connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name}
        self._options = server_options(options, statement_timeout_s)
        self._max_wait_s = round_trip_cap(statement_timeout_s)
        self._pools: dict[str, AsyncConnectionPool[GuardedAsyncConnection]] = {}  # by conninfo
        self._outages = Outages()
        self._users: dict[str, int] = {}  # by conninfo
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing: set[asyncio.Task[None]] = set()  # retired pools, closing
        self._swept = self.map.version
        self._closed = False

    @property
    def map(self) -> ShardMap:
        """The current map version: what requests route by now."""
        return self.follower.map

    def refresh(self, at_least: int = 0, via: Shard | str | None = None) -> ShardMap:
        """ShardPools.refresh (blocking: call it on a thread from a coroutine)."""
        return self.follower.refresh(at_least=at_least, via=via)

    def open(self) -> AsyncShardPools:
        self.follower.open()
        return self

    async def close(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.to_thread(self.follower.close)

    def pool(self, shard: Shard) -> AsyncConnectionPool[GuardedAsyncConnection] | None:
        """The pool of the shard's database if one was made (tests read its stats)."""
        return self._pools.get(shard.conninfo)

    def is_down(self, shard: Shard) -> bool:
        """True while `shard`'s last use failed for want of the shard itself."""
        return shard.name in self._outages

    async def _pool_of(self, shard: Shard) -> AsyncConnectionPool[GuardedAsyncConnection]:
        if self._closed:
            raise ShardUnavailable(f"{shard.label}: the process's pools are closed")
        current = self.map
        if current.version != self._swept:
            self._sweep(current)
        if current.get(shard.name) is None:
            raise ShardRetired(
                f"{shard.label}: not in the shard map any more (version {current.version})")
        if shard.name in self._outages or shard.name not in self._verified:
            await self._reach(shard)
        pool = self._pools.get(shard.conninfo)
        if pool is None:
            if self._closed:  # while it was reached: a pool made now would never close
                raise ShardUnavailable(f"{shard.label}: the process's pools are closed")
            pool = self._pools[shard.conninfo] = self._new_pool(shard)
            await pool.open(wait=False)
        return pool

    def _new_pool(self, shard: Shard) -> AsyncConnectionPool[GuardedAsyncConnection]:
        url, pooled = pooled_settings(shard, self.map.pooler, self._options)
        return AsyncConnectionPool(
            url, min_size=shard.pool_min, max_size=shard.pool_max,
            kwargs={"autocommit": True, "row_factory": dict_row, **self._connect_kwargs,
                    **tcp_settings(shard.conninfo), **pooled},
            connection_class=GuardedAsyncConnection,
            configure=guarding_async(shard.conninfo, self._max_wait_s),
            open=False, timeout=self._timeout, name=f"shardq-async-{shard.name}",
        )

    async def _reach(self, shard: Shard) -> None:
        """Verify a shard not reached yet, or probe one that is down; raise if it fails."""
        lock = self._locks.setdefault(shard.name, asyncio.Lock())
        last = self._outages.last_error(shard.name)
        if last is not None and lock.locked():
            raise last  # as the sync pools: a down shard's probe is not queued behind
        async with lock:
            refused = self._outages.refusal(shard.name)
            if refused is not None:
                raise refused
            down = shard.name in self._outages
            if not down and shard.name in self._verified:
                return  # another task reached it meanwhile
            try:
                if shard.name not in self._verified:
                    await self._verify(shard)  # connects directly: raises at once if down
                else:
                    await self._probe(shard)
            except ShardUnavailable as exc:
                self._outages.mark(shard.name, exc)
                raise
            except SchemaBehind as exc:  # being migrated: wait for it like an outage
                raise self._outages.mark(shard.name, ShardUnavailable(str(exc))) from exc
            if down:  # its database's old pool may sit in a reconnection backoff
                self._retire(shard.conninfo)
            self._outages.came_back(shard.name)

    async def _verify(self, shard: Shard) -> None:
        newer = await asyncio.to_thread(verify_shard, self.map, shard)
        self._verified.add(shard.name)
        if newer is not None and newer > self.map.version:
            # A shard reached late holds a newer version: follow it before routing more.
            await asyncio.to_thread(self.refresh, newer, shard)

    async def _probe(self, shard: Shard) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(
                shard.conninfo, **self._connect_kwargs, **tcp_settings(shard.conninfo))
        except psycopg.OperationalError as exc:
            raise describe_connect_error(shard, exc) from exc
        await conn.close()

    def _sweep(self, current: ShardMap) -> None:
        """Close the idle pools of shards `current` dropped; the busy ones close after
        their last connection comes back (_done_with)."""
        self._swept = current.version
        used = {s.conninfo for s in current.shards}
        for key in [k for k in self._pools if k not in used]:
            if not self._users.get(key):
                log.info("shards left the map; their pool is closed",
                         extra={"database": redact(key)})
                self._retire(key)

    def _retire(self, key: str) -> None:
        """Take a database's pool out of use and close it in the background: connections
        still lent out close as they come back."""
        pool = self._pools.pop(key, None)
        if pool is not None:
            task = asyncio.get_running_loop().create_task(
                pool.close(timeout=SILENT_PEER_TIMEOUT_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _done_with(self, shard: Shard) -> None:
        key = shard.conninfo
        self._users[key] -= 1
        if (not self._users[key] and self.map.get(shard.name) is None
                and not any(s.conninfo == key for s in self.map.shards)):
            self._retire(key)

    @asynccontextmanager
    async def connection(self, shard: Shard) -> AsyncIterator[AsyncDictConnection]:
        """A pooled autocommit connection to `shard`."""
        pool = await self._pool_of(shard)
        key = shard.conninfo
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with contextlib.AsyncExitStack() as stack:
                first = waited_in_vain(self._timeout)
                try:
                    conn = await stack.enter_async_context(pool.connection(timeout=first))
                except PoolTimeout:
                    # As the sync pools: only a server that answers is waited for longer.
                    if first is None or not await liveness_of(key).answers_async():
                        raise no_connection(first or self._timeout) from None
                    conn = await stack.enter_async_context(
                        pool.connection(timeout=self._timeout - first))
                conn.schema = shard.schema
                yield conn
        except PoolTimeout as exc:
            raise self._outages.went_down(shard.name, describe_connect_error(shard, exc)) from exc
        except PoolClosed as exc:
            raise closed_under(shard, closing=self._closed) from exc
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            raise self._outages.went_down(shard.name, describe_connect_error(shard, exc)) from exc
        finally:
            self._done_with(shard)
