"""Connections to shards: one psycopg_pool per shard, and one-line errors when they fail.

Every connection, pooled or direct, carries TCP keepalives and a TCP user timeout
(SILENT_PEER_TIMEOUT_S): a server that vanished without resetting its connections
(a hard stop, a path that drops packets) would otherwise block a statement for
the kernel's retransmission limit, about 15 minutes. statement_timeout cannot
help there: it is enforced by the server, which a silent path never reaches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import SchemaBehind, ShardqError, ShardUnavailable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
DictConnection = psycopg.Connection[dict[str, Any]]

TCP_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "4",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "8000",
}
"""libpq's settings for a silent peer, added to every shard URL that sets none of its own.
A statement whose bytes the peer never acknowledges fails after tcp_user_timeout
(8 s); one sent whole, waiting on a peer that went silent afterwards, fails once
keepalive probes go unanswered (idle 4 s, then probes every 2 s, cut off by the
same 8 s): about 12 s at most. Ignored on Unix sockets."""
SILENT_PEER_TIMEOUT_S = 12.0
"""The longest a statement to a silent shard blocks before it fails (see TCP_SETTINGS)."""
DOWN_PROBE_INTERVAL_S = 1.0
"""While a shard is down, calls fail at once with its last error, and one call a second
tries a direct connection: a refused shard costs nothing, and one that is back is used
within about a second."""

Verifier = Callable[[ShardMap, Shard], None]


def tcp_settings(url: str) -> dict[str, Any]:
    """TCP_SETTINGS, less those the URL sets itself (an operator's choice wins)."""
    given = conninfo_to_dict(url)
    return {k: v for k, v in TCP_SETTINGS.items() if k not in given}


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
    elif "timeout" in lowered or "timed out" in lowered or isinstance(exc, PoolTimeout):
        cause = "unreachable (timed out)"
    elif "could not translate host name" in lowered:
        cause = "unreachable (unknown host)"
    elif "too many clients" in lowered or "remaining connection slots" in lowered:
        cause = "out of connection slots (too many clients)"
    elif "starting up" in lowered or "shutting down" in lowered or "recovery" in lowered:
        cause = "restarting (" + text.splitlines()[0].removeprefix("FATAL:  ") + ")"
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
            **tcp_settings(shard.url),
        )
    except psycopg.OperationalError as exc:
        raise describe_connect_error(shard, exc) from exc


class ShardPools:
    """One connection pool per shard, sized from the map, opened without waiting.

    Pools open in the background so an unreachable shard does not stop a
    process serving the others; `connection()` raises ShardUnavailable for it.

    A shard is verified the first time it is reached, before any connection of
    its pool is handed out: its recorded map and schema must be this process's
    (`verify`, by default shards.migrations.verify_shard). A daemon started while
    a shard was unreachable, or out of connection slots, checks it when it comes
    back instead of routing by a map the shards do not share. A map mismatch
    raises MapMismatch on every use and is handed to `on_fatal` once: a process
    holding another map must stop, whatever shard it found out on. A shard not
    migrated yet (or behind this code's schema) is treated as unavailable until
    `shardq migrate` has run on it.

    After a failure that says the shard is gone (refused, timed out, broken
    connection), calls fail at once with that error and one call a second
    probes it with a direct connection (DOWN_PROBE_INTERVAL_S); the probe that
    succeeds gives the shard a fresh pool, so a shard that came back is used
    within a second, not after the old pool's reconnection backoff.

    With `probe=True` (short-lived processes: the CLI, scripts) a shard's pool
    opens only on its first use, after one direct connection succeeded; when it
    fails, `connection()` raises at once with libpq's reason (refused, no such
    database, bad password), and no background retries log warnings.

    `options` are server settings for every connection, in libpq's form
    (`-c name=value ...`).
    """

    def __init__(
        self, shard_map: ShardMap, *, timeout: float = 10.0, application_name: str = "shardq",
        probe: bool = False, options: str | None = None, verify: Verifier | None = None,
        on_fatal: Callable[[ShardqError], None] | None = None, verified: Iterable[Shard] = (),
    ) -> None:
        self.map = shard_map
        self._timeout = timeout
        self._probe = probe
        self._application_name = application_name
        self._options = options
        self._verify = verify if verify is not None else _default_verifier()
        self._on_fatal = on_fatal
        self._fatal: ShardqError | None = None
        # Shards the caller checked just before (shards.migrations.verify_shards at
        # a process's start): not checked a second time on first use.
        self._verified: set[str] = {shard.name for shard in verified}
        self._opened: set[str] = set()
        self._closed = False
        self._locks = {shard.name: threading.Lock() for shard in shard_map.shards}
        self._down: dict[str, tuple[ShardUnavailable, float]] = {}  # error, next probe at
        self._pools = {shard.name: self._new_pool(shard) for shard in shard_map.shards}

    def _new_pool(self, shard: Shard) -> ConnectionPool[DictConnection]:
        return ConnectionPool(
            shard.url,
            min_size=shard.pool_min,
            max_size=shard.pool_max,
            kwargs={
                # Single statements run alone (one round trip); multi-statement
                # work opens an explicit transaction.
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": self._application_name,
                **tcp_settings(shard.url),
                **({"options": self._options} if self._options else {}),
            },
            connection_class=psycopg.Connection[dict[str, Any]],
            open=False,
            timeout=self._timeout,
            name=f"shardq-{shard.name}",
        )

    @property
    def fatal(self) -> ShardqError | None:
        """The map or schema mismatch found on a shard, if one was: the process must stop."""
        return self._fatal

    def open(self) -> ShardPools:
        if not self._probe:
            for pool in self._pools.values():
                pool.open(wait=False)
        return self

    def close(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            pool.close()

    def __enter__(self) -> ShardPools:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_down(self, shard: Shard) -> bool:
        """True while `shard`'s last use failed for want of the shard itself."""
        return shard.name in self._down

    @contextmanager
    def connection(self, shard: Shard) -> Iterator[DictConnection]:
        """A pooled autocommit connection to `shard`."""
        if self._fatal is not None:
            raise self._fatal
        if (shard.name in self._down or shard.name not in self._verified
                or (self._probe and shard.name not in self._opened)):
            self._reach(shard)
        try:
            with self._pools[shard.name].connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise self._went_down(shard, describe_connect_error(shard, exc)) from exc
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            raise self._went_down(shard, describe_connect_error(shard, exc)) from exc

    def _reach(self, shard: Shard) -> None:
        """Verify a shard not reached yet, or probe one that is down; raise if it fails."""
        with self._locks[shard.name]:
            down = self._down.get(shard.name)
            if down is not None and time.monotonic() < down[1]:
                raise down[0]
            opening = self._probe and shard.name not in self._opened
            if down is None and shard.name in self._verified and not opening:
                return  # another thread reached it meanwhile
            try:
                if shard.name not in self._verified:
                    self._verify(self.map, shard)  # connects directly: raises at once if down
                    self._verified.add(shard.name)
                elif down is not None:
                    connect(shard).close()
            except ShardUnavailable as exc:
                self._down[shard.name] = (exc, time.monotonic() + DOWN_PROBE_INTERVAL_S)
                raise
            except SchemaBehind as exc:
                # Being set up or upgraded (`shardq migrate` still to run): this
                # process's map is not in question, so wait for it like an outage.
                if shard.name not in self._down:
                    log.error("shard not ready; retrying", extra={
                        "shard": shard.name, "error": str(exc)})
                unready = ShardUnavailable(str(exc))
                self._down[shard.name] = (unready, time.monotonic() + DOWN_PROBE_INTERVAL_S)
                raise unready from exc
            except ShardqError as exc:
                self._fatal = exc
                log.error("shard disagrees with this process; it must stop",
                          extra={"shard": shard.name, "error": str(exc)})
                if self._on_fatal is not None:
                    self._on_fatal(exc)
                raise
            if self._probe and shard.name not in self._opened:
                self._pools[shard.name].open(wait=False)
                self._opened.add(shard.name)
            elif down is not None:
                self._renew_pool(shard)
            if down is not None:
                log.warning("shard reachable again", extra={"shard": shard.name})
            self._down.pop(shard.name, None)

    def _went_down(self, shard: Shard, error: ShardUnavailable) -> ShardUnavailable:
        with self._locks[shard.name]:
            if shard.name not in self._down:
                log.warning("shard unavailable", extra={"shard": shard.name, "error": str(error)})
            self._down[shard.name] = (error, time.monotonic() + DOWN_PROBE_INTERVAL_S)
        return error

    def _renew_pool(self, shard: Shard) -> None:
        """Swap in a fresh pool: the old one may sit in a reconnection backoff of minutes."""
        if self._closed:
            return
        old = self._pools[shard.name]
        fresh = self._new_pool(shard)
        fresh.open(wait=False)
        self._pools[shard.name] = fresh
        # Its connections still lent out are closed as they come back.
        threading.Thread(target=old.close, kwargs={"timeout": SILENT_PEER_TIMEOUT_S},
                         name=f"shardq-pool-retire-{shard.name}", daemon=True).start()


def _default_verifier() -> Verifier:
    # Imported here: migrations connects through this module.
    from shardq.shards.migrations import verify_shard  # noqa: PLC0415

    return verify_shard


def connection_lost(exc: psycopg.Error) -> bool:
    """True when the error means the connection itself broke, not the statement."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE


_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})  # admin/crash shutdown, cannot connect now
