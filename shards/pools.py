"""Connections to shards: one psycopg_pool per shard, and one-line errors when they fail."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
DictConnection = psycopg.Connection[dict[str, Any]]


def describe_connect_error(shard: Shard, exc: BaseException) -> ShardUnavailable:
    """Turn libpq's multi-line text into a one-line cause that names the shard."""
    text = str(exc).strip()
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        cause = "wrong password or user"
    elif "does not exist" in lowered and "database" in lowered:
        cause = "database does not exist"
    elif "connection refused" in lowered or "no such file or directory" in lowered:
        cause = "unreachable (connection refused)"
    elif "timeout" in lowered or isinstance(exc, PoolTimeout):
        cause = "unreachable (timed out)"
    elif "could not translate host name" in lowered:
        cause = "unreachable (unknown host)"
    else:
        cause = text.splitlines()[-1] if text else type(exc).__name__
    return ShardUnavailable(f"{shard.label}: {cause}")


def connect(shard: Shard, *, autocommit: bool = False) -> DictConnection:
    """A direct connection outside any pool (migrations, LISTEN, one-off CLI checks)."""
    try:
        return psycopg.connect(
            shard.url,
            autocommit=autocommit,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="shardq",
        )
    except psycopg.OperationalError as exc:
        raise describe_connect_error(shard, exc) from exc


class ShardPools:
    """One connection pool per shard, sized from the map, opened without waiting.

    Pools open in the background so an unreachable shard does not stop a
    process serving the others; `connection()` raises ShardUnavailable for it
    after `timeout` seconds.

    With `probe=True` (short-lived processes: the CLI, scripts) a shard's pool
    opens only on its first use, after one direct connection succeeded; when it
    fails, `connection()` raises at once with libpq's reason (refused, no such
    database, bad password) instead of a timeout after `timeout` seconds, and no
    background retries log warnings. Each use of a failing shard probes again.

    `options` are server settings for every connection, in libpq's form
    (`-c name=value ...`).
    """

    def __init__(
        self, shard_map: ShardMap, *, timeout: float = 10.0, application_name: str = "shardq",
        probe: bool = False, options: str | None = None,
    ) -> None:
        self.map = shard_map
        self._timeout = timeout
        self._probe = probe
        self._opened: set[str] = set()
        self._open_locks = {shard.name: threading.Lock() for shard in shard_map.shards}
        self._pools: dict[str, ConnectionPool[DictConnection]] = {}
        for shard in shard_map.shards:
            self._pools[shard.name] = ConnectionPool(
                shard.url,
                min_size=shard.pool_min,
                max_size=shard.pool_max,
                kwargs={
                    # Single statements run alone (one round trip); multi-statement
                    # work opens an explicit transaction.
                    "autocommit": True,
                    "row_factory": dict_row,
                    "connect_timeout": CONNECT_TIMEOUT_S,
                    "application_name": application_name,
                    **({"options": options} if options else {}),
                },
                connection_class=psycopg.Connection[dict[str, Any]],
                open=False,
                timeout=timeout,
                name=f"shardq-{shard.name}",
            )

    def open(self) -> ShardPools:
        if not self._probe:
            for pool in self._pools.values():
                pool.open(wait=False)
        return self

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()

    def _open_after_probe(self, shard: Shard) -> None:
        if shard.name in self._opened:
            return
        with self._open_locks[shard.name]:
            if shard.name in self._opened:
                return
            connect(shard).close()  # raises ShardUnavailable with the cause
            self._pools[shard.name].open(wait=False)
            self._opened.add(shard.name)

    def __enter__(self) -> ShardPools:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def connection(self, shard: Shard) -> Iterator[DictConnection]:
        """A pooled autocommit connection to `shard`."""
        if self._probe:
            self._open_after_probe(shard)
        try:
            with self._pools[shard.name].connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise describe_connect_error(shard, exc) from exc
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            raise describe_connect_error(shard, exc) from exc


def connection_lost(exc: psycopg.Error) -> bool:
    """True when the error means the connection itself broke, not the statement."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE


_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})  # admin/crash shutdown, cannot connect now
