"""Pooled connections to shards: one psycopg_pool per shard of the current map version.

A pooled connection is made as a direct one is (shards/connections.py): TCP
keepalives and a TCP user timeout for a server that went silent, a liveness guard
(shards/liveness.py) for one that is up but frozen. Each shard is checked against
this process's map on first reach (shards/check.py), and the map follows newer
versions (shards/follow.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from shardq.shards.check import ShardStatus, verify_shard
from shardq.shards.config import Shard, ShardMap, through_pooler
from shardq.shards.connections import (
    CONNECT_TIMEOUT_S,
    SILENT_PEER_TIMEOUT_S,
    DictConnection,
    connect,
    connection_lost,
    describe_connect_error,
    tcp_settings,
)
from shardq.shards.errors import SchemaBehind, ShardqError, ShardRetired, ShardUnavailable
from shardq.shards.follow import map_poll_interval, newest_map, read_newer_map
from shardq.shards.liveness import (
    CAP_MARGIN_S,
    HUNG_NOTICE_S,
    GuardedConnection,
    liveness_of,
    no_connection,
    waited_in_vain,
)

log = logging.getLogger(__name__)

DOWN_PROBE_INTERVAL_S = 1.0
"""While a shard is down, calls fail at once with its last error, and one call a second
tries a direct connection: a refused shard costs nothing, and one that is back is used
within about a second."""

Verifier = Callable[[ShardMap, Shard], int | None]
"""Checks a shard on first reach; returns the newest map version it holds (or None)."""


def closed_under(shard: Shard, *, closing: bool) -> ShardUnavailable:
    """The error of a call whose pool was closed while it waited: said, never logged."""
    return ShardUnavailable(f"{shard.label}: the process's pools are closed" if closing
                            else f"{shard.label}: its pool was renewed meanwhile; try again")


def guarding(url: str, max_wait_s: float | None) -> Callable[[GuardedConnection], None]:
    """A pool's `configure`: bound the round trips of each connection it opens to `url`."""
    liveness = liveness_of(url)

    def configure(conn: GuardedConnection) -> None:
        conn.guard(liveness, max_wait_s=max_wait_s)

    return configure


def server_options(options: str | None, statement_timeout_s: float | None) -> str | None:
    """libpq's `options` with the statement timeout added, when one is given."""
    if statement_timeout_s is None:
        return options
    timeout = f"-c statement_timeout={round(statement_timeout_s * 1000)}"
    return f"{options} {timeout}" if options else timeout


def pooled_settings(shard: Shard, pooler: str | None,
                    options: str | None) -> tuple[str, dict[str, Any]]:
    """Where a shard's pool connects, and the connection settings that depend on it.

    Through a transaction pooler (PgBouncer, ShardMap.pooler) a session is lent for one
    transaction at a time, so nothing may outlive one: psycopg's server-side prepared
    statements are off (they would land on a connection another client gets next:
    `42P05 prepared statement already exists`) and no `options` are sent (PgBouncer
    refuses the startup parameter; the statement timeout comes from the role there,
    while the round-trip cap still holds on this side). Directly, both as configured."""
    if pooler is None:
        return shard.conninfo, ({"options": options} if options else {})
    return through_pooler(shard.conninfo, pooler), {"prepare_threshold": None}


def round_trip_cap(statement_timeout_s: float | None) -> float | None:
    """The longest a pool's round trip waits: the server's statement timeout and a margin
    for its cancel to come back; a connection that outlasts it went silent on its own."""
    return None if statement_timeout_s is None else statement_timeout_s + CAP_MARGIN_S


class Outages:
    """The shards whose last use failed for want of the shard itself, each with its error
    and the time a call may next probe it (DOWN_PROBE_INTERVAL_S): one policy for the
    sync pools and the async ones (shards/async_pools.py). Callers serialize each shard's
    probe themselves."""

    def __init__(self) -> None:
        self._down: dict[str, tuple[ShardUnavailable, float]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._down

    def last_error(self, name: str) -> ShardUnavailable | None:
        """The error a down shard last failed with (None: not down)."""
        down = self._down.get(name)
        return down[0] if down is not None else None

    def refusal(self, name: str) -> ShardUnavailable | None:
        """The shard's last error while its next probe is not due: a call fails with it."""
        down = self._down.get(name)
        return down[0] if down is not None and time.monotonic() < down[1] else None

    def mark(self, name: str, error: ShardUnavailable) -> ShardUnavailable:
        """Down with `error` until the next probe (a failed probe: said by the caller)."""
        self._down[name] = (error, time.monotonic() + DOWN_PROBE_INTERVAL_S)
        return error

    def went_down(self, name: str, error: ShardUnavailable) -> ShardUnavailable:
        """A shard in use failed: logged once, when it goes down, then marked."""
        if name not in self._down:
            log.warning("shard unavailable", extra={"shard": name, "error": str(error)})
        return self.mark(name, error)

    def came_back(self, name: str) -> None:
        if self._down.pop(name, None) is not None:
            log.warning("shard reachable again", extra={"shard": name})


class ShardPools:
    """One connection pool per database of the current map version, opened without waiting.

    Shards in one database (schemas of it, shards/layout.py) share its pool, sized by
    the first of them to be reached: a connection is lent for one shard at a time,
    its statements rendered for that shard's schema.

    Pools open in the background so an unreachable shard does not stop a
    process serving the others; `connection()` raises ShardUnavailable for it.

    A shard is verified the first time it is reached, before any connection of
    its pool is handed out: its recorded map and schema must agree with this
    process's (`verify`, by default shards.check.verify_shard). A daemon started while
    a shard was unreachable, or out of connection slots, checks it when it comes
    back instead of routing by a map the shards do not share. A map mismatch
    raises MapMismatch on every use and is handed to `on_fatal` once: a process
    holding another map must stop, whatever shard it found out on. A shard not
    migrated yet (or behind this code's schema) is treated as unavailable until
    `shardq migrate` has run on it.

    The map follows newer versions (shards/follow.py): `map` is always the
    current one; `refresh` reads newer versions from a shard (the one that
    refused a request holds them), and a slow poll (`follow_every_s`, by default
    SHARDQ_MAP_POLL_S = 30 s for pools that do not probe, none for those that do)
    re-reads the newest. A shard a version adds gets its pool on first use; one a
    version drops keeps its pool until its last connection comes back. Given the
    statuses verify_shards returned (`verified`), the pools start from the newest
    version the reachable seeds hold.

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
    (`-c name=value ...`). `statement_timeout_s` is the server's statement_timeout
    for every connection, and bounds each round trip on the client side too (a
    margin later, CAP_MARGIN_S): a connection that went silent on its own, its
    server answering others, is closed then. A server that hangs is found sooner,
    whatever is given (shards/liveness.py).
    """

    def __init__(
        self, shard_map: ShardMap, *, timeout: float = 10.0, application_name: str = "shardq",
        probe: bool = False, options: str | None = None, verify: Verifier | None = None,
        statement_timeout_s: float | None = None,
        on_fatal: Callable[[ShardqError], None] | None = None,
        verified: Iterable[Shard | ShardStatus] = (), follow_every_s: float | None = None,
    ) -> None:
        checked = list(verified)
        statuses = [v for v in checked if not isinstance(v, Shard)]
        self._map = newest_map(shard_map, [st for st in statuses if st.reachable])
        self._timeout = timeout
        self._probe = probe
        self._application_name = application_name
        self._options = server_options(options, statement_timeout_s)
        self._max_wait_s = round_trip_cap(statement_timeout_s)
        self._verify = verify if verify is not None else verify_shard
        self._on_fatal = on_fatal
        self._fatal: ShardqError | None = None
        # Shards the caller checked just before (shards.check.verify_shards at
        # a process's start): not checked a second time on first use.
        self._verified: set[str] = {
            v.name if isinstance(v, Shard) else v.shard.name
            for v in checked if isinstance(v, Shard) or v.reachable}
        self._opened: set[str] = set()
        self._open = False
        self._closed = False
        self._guard = threading.Lock()  # the pools, locks, users and retired sets below
        self._refreshing = threading.RLock()  # a shard first reached in a refresh may refresh
        self._locks: dict[str, threading.Lock] = {}
        self._outages = Outages()
        self._pools: dict[str, ConnectionPool[GuardedConnection]] = {}  # by conninfo
        self._users: dict[str, int] = {}  # by conninfo
        self._retired: set[str] = set()
        self._left: dict[str, Shard] = {}  # shards versions dropped, by name
        self._newest_seen = self._map.version
        self._follow_every = (follow_every_s if follow_every_s is not None
                              else 0.0 if probe else map_poll_interval())
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        for shard in self._map.shards:
            self._pool_of(shard)

    @property
    def map(self) -> ShardMap:
        """The current map version: what requests route by now."""
        return self._map

    def _new_pool(self, shard: Shard) -> ConnectionPool[GuardedConnection]:
        url, pooled = pooled_settings(shard, self._map.pooler, self._options)
        return ConnectionPool(
            url,
            min_size=shard.pool_min,
            max_size=shard.pool_max,
            kwargs={
                # Single statements run alone (one round trip); multi-statement
                # work opens an explicit transaction.
                "autocommit": True,
                "row_factory": dict_row,
                "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": self._application_name,
                **tcp_settings(shard.conninfo),
                **pooled,
            },
            connection_class=GuardedConnection,
            configure=guarding(shard.conninfo, self._max_wait_s),
            open=False,
            timeout=self._timeout,
            name=f"shardq-{shard.name}",
        )

    def _pool_of(self, shard: Shard) -> ConnectionPool[GuardedConnection]:
        """The pool of the shard's database, made (and opened, for pools that do not
        probe) on first use."""
        with self._guard:
            if self._closed:
                raise ShardUnavailable(f"{shard.label}: the process's pools are closed")
            if shard.name in self._retired or self._map.get(shard.name) is None:
                raise ShardRetired(
                    f"{shard.label}: not in the shard map any more (version {self._map.version})")
            pool = self._pools.get(shard.conninfo)
            if pool is not None:
                return pool
            pool = self._new_pool(shard)
            self._pools[shard.conninfo] = pool
            self._locks.setdefault(shard.name, threading.Lock())
            if self._open and not self._probe:
                pool.open(wait=False)
            return pool

    def _lock_of(self, shard: Shard) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(shard.name, threading.Lock())

    @property
    def fatal(self) -> ShardqError | None:
        """The map or schema mismatch found on a shard, if one was: the process must stop."""
        return self._fatal

    def open(self) -> ShardPools:
        with self._guard:
            self._open = True
            pools = list(self._pools.values())
        if not self._probe:
            for pool in pools:
                pool.open(wait=False)
        if self._follow_every > 0 and self._poller is None:
            self._poller = threading.Thread(target=self._poll, name="shardq-map-poll",
                                            daemon=True)
            self._poller.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._guard:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()
        poller = self._poller
        if poller is not None and poller is not threading.current_thread():
            # A poll in flight ends within its statement's bound (shards/liveness.py).
            poller.join(HUNG_NOTICE_S + CONNECT_TIMEOUT_S)

    def __enter__(self) -> ShardPools:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_down(self, shard: Shard) -> bool:
        """True while `shard`'s last use failed for want of the shard itself."""
        return shard.name in self._outages

    @contextmanager
    def connection(self, shard: Shard) -> Iterator[DictConnection]:
        """A pooled autocommit connection to `shard`."""
        if self._fatal is not None:
            raise self._fatal
        pool = self._pool_of(shard)
        if (shard.name in self._outages or shard.name not in self._verified
                or (self._probe and shard.name not in self._opened)):
            newer = self._reach(shard)
            if newer is not None and newer > self._map.version:
                # A shard reached late holds a newer version: follow it before routing more.
                self.refresh(at_least=newer, via=shard)
            pool = self._pool_of(shard)  # renewed if it came back
        key = shard.conninfo
        with self._guard:
            self._users[key] = self._users.get(key, 0) + 1
        try:
            with contextlib.ExitStack() as stack:
                first = waited_in_vain(self._timeout)
                try:
                    conn = stack.enter_context(pool.connection(timeout=first))
                except PoolTimeout:
                    # No connection yet: a pool whose new connections hang in their
                    # connect, or one busy with work. Only the first waits on.
                    if first is None or not liveness_of(key).answers():
                        raise no_connection(first or self._timeout) from None
                    conn = stack.enter_context(pool.connection(timeout=self._timeout - first))
                conn.schema = shard.schema
                yield conn
        except PoolTimeout as exc:
            raise self._went_down(shard, describe_connect_error(shard, exc)) from exc
        except PoolClosed as exc:
            # Closed under the caller (close(), or a renewed pool's old one): no outage.
            raise closed_under(shard, closing=self._closed) from exc
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            raise self._went_down(shard, describe_connect_error(shard, exc)) from exc
        finally:
            self._done_with(shard)

    def _done_with(self, shard: Shard) -> None:
        key = shard.conninfo
        with self._guard:
            self._users[key] -= 1
            idle = (self._users[key] == 0 and shard.name in self._retired
                    and not any(s.conninfo == key for s in self._map.shards))
            pool = self._pools.pop(key, None) if idle else None
        if pool is not None:
            log.info("shard left the map; its pool is closed", extra={"shard": shard.name})
            pool.close()

    def _reach(self, shard: Shard) -> int | None:
        """Verify a shard not reached yet, or probe one that is down; raise if it fails.
        Returns the newest map version a shard verified now holds."""
        newer = None
        lock = self._lock_of(shard)
        # A down shard's probe may wait out a connect timeout: the calls meanwhile fail
        # with its last error, as between probes, rather than queue behind it.
        last = self._outages.last_error(shard.name)
        if last is not None and lock.locked():
            raise last
        with lock:
            refused = self._outages.refusal(shard.name)
            if refused is not None:
                raise refused
            down = shard.name in self._outages
            opening = self._probe and shard.name not in self._opened
            if not down and shard.name in self._verified and not opening:
                return None  # another thread reached it meanwhile
            try:
                if shard.name not in self._verified:
                    # connects directly: raises at once if down
                    newer = self._verify(self._map, shard)
                    self._verified.add(shard.name)
                elif down:
                    connect(shard).close()
            except ShardUnavailable as exc:
                self._outages.mark(shard.name, exc)
                raise
            except SchemaBehind as exc:
                # Being set up or upgraded (`shardq migrate` still to run): this
                # process's map is not in question, so wait for it like an outage.
                if not down:
                    log.error("shard not ready; retrying", extra={
                        "shard": shard.name, "error": str(exc)})
                raise self._outages.mark(shard.name, ShardUnavailable(str(exc))) from exc
            except ShardqError as exc:
                self._fatal = exc
                log.error("shard disagrees with this process; it must stop",
                          extra={"shard": shard.name, "error": str(exc)})
                if self._on_fatal is not None:
                    self._on_fatal(exc)
                raise
            if self._probe and shard.name not in self._opened:
                self._open_probed(shard)
            elif down:
                self._renew_pool(shard)
            self._outages.came_back(shard.name)
        return newer

    def _open_probed(self, shard: Shard) -> None:
        """Open the pool of a shard a probe reached, unless the pools closed meanwhile:
        opened after close(), it would keep its threads and connections for good."""
        pool = self._pool_of(shard)
        with self._guard:
            if self._closed:
                raise ShardUnavailable(f"{shard.label}: the process's pools are closed")
            pool.open(wait=False)
            self._opened.add(shard.name)

    def _went_down(self, shard: Shard, error: ShardUnavailable) -> ShardUnavailable:
        with self._lock_of(shard):
            return self._outages.went_down(shard.name, error)

    def _renew_pool(self, shard: Shard) -> None:
        """Swap in a fresh pool for the shard's database: the old one may sit in a
        reconnection backoff of minutes."""
        with self._guard:
            if self._closed or shard.conninfo not in self._pools:
                return
            old = self._pools[shard.conninfo]
            fresh = self._new_pool(shard)
            fresh.open(wait=False)
            self._pools[shard.conninfo] = fresh
        # Its connections still lent out are closed as they come back.
        threading.Thread(target=old.close, kwargs={"timeout": SILENT_PEER_TIMEOUT_S},
                         name=f"shardq-pool-retire-{shard.name}", daemon=True).start()

    # -- following the map -----------------------------------------------------------

    def refresh(self, at_least: int = 0, via: Shard | str | None = None) -> ShardMap:
        """Read map versions newer than the current one and route by the newest.

        From `via` (a shard, or a shard's name in the current map) when given: the
        shard that refused a request holds the version it named. Without it, from
        the current map's shards, the home shard first, until one answers with a
        newer version. Returns at once when the current map is at `at_least`
        already (another thread refreshed). Raises ShardUnavailable when `via` cannot
        be read.
        """
        with self._refreshing:
            current = self._map
            if at_least and current.version >= at_least:
                return current
            sources = self._sources(via)
            found = None
            for shard in sources:
                try:
                    with self.connection(shard) as conn:
                        found = read_newer_map(conn, current.version)
                except ShardUnavailable:
                    if via is not None:
                        raise
                    continue
                if found is not None:
                    break
            if found is not None:
                version, layout, deployment = found
                self._install(ShardMap.from_layout(layout, version, seeds=current.seeds,
                                                   deployment=deployment or current.deployment))
            return self._map

    def _sources(self, via: Shard | str | None) -> list[Shard]:
        current = self._map
        if isinstance(via, Shard):
            return [via]
        if isinstance(via, str):
            shard = current.get(via) or self._left.get(via)
            if shard is None:
                raise ShardUnavailable(f"{via}: not a shard of map version {current.version}")
            return [shard]
        home = current.get(current.home)
        return [*([home] if home else []), *(s for s in current.shards if s.name != current.home)]

    def _install(self, new: ShardMap) -> None:
        """Route by `new` from now on; pools of shards it dropped close after their last use."""
        with self._guard:
            old = self._map
            if new.version <= old.version:
                return
            dropped = {s.name for s in old.shards} - {s.name for s in new.shards}
            self._map = new
            self._left.update({s.name: s for s in old.shards if s.name in dropped})
            self._retired |= dropped
            self._retired -= {s.name for s in new.shards}
            unused = {s.conninfo for s in old.shards} - {s.conninfo for s in new.shards}
            idle = [self._pools.pop(k) for k in unused
                    if k in self._pools and self._users.get(k, 0) == 0]
        log.info("following map version", extra={"from": old.version, "to": new.version})
        for pool in idle:
            pool.close()

    def _poll(self) -> None:
        """The slow poll: the correctness path when no refusal tells the process."""
        if self._map.version <= 1:
            self._poll_once()  # started from the configuration: read the newest now
        while not self._stop.wait(self._follow_every):
            self._poll_once()

    def _poll_once(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # a poll that fails is retried at the next one
            if not self._stop.is_set():  # one closing under it failed for that alone
                log.warning("could not re-read the shard map", extra={"error": str(exc)})

