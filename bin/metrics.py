"""Prometheus endpoints: the daemons' own metrics, and the store exporter (`shardq metrics`).

The exporter answers a scrape with gauges read from the shards (store/store.py
`Store.health`, and outbox/store.py for the backlog: one indexed query per
family). Shards are read in parallel;
a shard that does not answer within the scrape timeout is reported with
`shardq_shard_up 0` and no other series, so a scrape never hangs on it. The
answers are cached for `cache_s`: scrapes from several Prometheus servers, or
a dashboard refreshing, cost the shards one read per interval.

Each shard is read through connections of its own (a probing ShardPools per
shard), renewed whenever the shard is found unavailable. So a shard that
refuses connections costs a scrape one refused connect, not a wait for a pool
that cannot fill; and once it answers again the next scrape reaches it, not
a pool still backing off its reconnection attempts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shardq.core.daemons import first_line
from shardq.core.models import ShardHealth, StaleBounds, State
from shardq.core.rules import MAX_PRIORITY
from shardq.outbox.models import OutboxBacklog
from shardq.outbox.store import OutboxStore
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ConfigError, ShardUnavailable
from shardq.shards.follow import Router
from shardq.store.store import Store

log = logging.getLogger(__name__)

REFRESH_WAIT_S = 0.5
"""How long a scrape waits for its read of the newest map version (milliseconds when the
home shard answers)."""


def serve(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve `registry` on http://host:port/metrics from a daemon thread."""
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return server


class StoreCollector(Collector):
    """Per-shard gauges computed from the store, cached for `cache_s` seconds.

    `open_store()` makes a Store over new connections (probing pools); each shard
    gets one, and a new one after it was found unavailable. `close()` closes them.
    `route` is the map, or what follows it (ShardPools): each scrape reads the shards
    of the current version, each counting the runs of the buckets it gives them.
    """

    def __init__(
        self,
        open_store: Callable[[], Store],
        route: ShardMap | Router,
        *,
        bounds: StaleBounds,
        overdue_grace_s: float,
        cache_s: float,
        timeout_s: float,
    ) -> None:
        self._open_store = open_store
        self._route = route
        self._bounds = bounds
        self._overdue_grace_s = overdue_grace_s
        self._cache_s = cache_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._stores_lock = threading.Lock()
        self._stores: dict[str, Store] = {}
        self._down: set[str] = set()
        """Shards whose last read failed: logged once when they go, once when they return."""
        self._read_at = float("-inf")
        self._snapshot: dict[str, Scrape | None] = {}
        # Reads of a shard that stopped answering may outlive a scrape; they
        # end with their statement timeout and never pile up past one per shard.
        self._pool = ThreadPoolExecutor(2 * max(len(self._current.shards), 4),
                                        thread_name_prefix="shardq-scrape")
        self._pending: dict[str, Future[Scrape]] = {}
        self._refreshing: Future[ShardMap] | None = None

    @property
    def _current(self) -> ShardMap:
        return self._route if isinstance(self._route, ShardMap) else self._route.map

    def collect(self) -> Iterator[GaugeMetricFamily]:
        current = self._newest()
        yield from families(current, self.snapshot(current))

    def _newest(self) -> ShardMap:
        """The newest map version, read at each scrape (one indexed read, home shard
        first) rather than left to the map poll: a scrape that comes right after
        `shards remove` must not read the removed shard, whose server may be stopping,
        and log it unavailable. The read waits REFRESH_WAIT_S at most (a hung home shard
        must not hold the scrape; the read goes on and the next scrape uses it), and
        never more than one is out."""
        if isinstance(self._route, ShardMap):
            return self._route
        router = self._route
        with self._lock:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = self._pool.submit(router.refresh)
            refreshing = self._refreshing
        try:
            return refreshing.result(timeout=REFRESH_WAIT_S)
        except Exception as exc:  # slow, or no shard could tell: the poll's map stands
            log.debug("could not re-read the shard map", extra={"error": first_line(exc)})
            return router.map

    def snapshot(self, current: ShardMap | None = None) -> dict[str, Scrape | None]:
        """Each shard's health, None for a shard that did not answer in time.

        Answers are cached for `cache_s`, except a shard's failure: a shard down in the
        cached answer is read again at every scrape (a refused connect, or the read
        still out), so it is `up 1` on the first scrape after it answers again rather
        than when the cache expires.
        """
        current = current or self._current
        with self._lock:
            names = {shard.name for shard in current.shards}
            fresh = time.monotonic() - self._read_at < self._cache_s
            if fresh and names == set(self._snapshot) and all(self._snapshot.values()):
                return self._snapshot
            again = [s for s in current.shards
                     if not fresh or self._snapshot.get(s.name) is None]
            for shard in again:
                future = self._pending.get(shard.name)
                if future is None or future.done():
                    self._pending[shard.name] = self._pool.submit(self._read, shard, current)
            self._let_go(names)
            wait_all([self._pending[s.name] for s in again], timeout=self._timeout_s)
            self._snapshot = {
                **{n: v for n, v in self._snapshot.items() if n in names},
                **{s.name: _result(self._pending[s.name]) for s in again},
            }
            if not fresh:
                self._read_at = time.monotonic()
            return self._snapshot

    def _let_go(self, names: set[str]) -> None:
        """Close the connections of shards the map dropped (their pools would otherwise
        retry a removed server for good), and forget them quietly."""
        with self._stores_lock:
            dropped = [self._stores.pop(n) for n in list(self._stores) if n not in names]
        self._down &= names
        for store in dropped:
            threading.Thread(target=store.pools.close, name="shardq-scrape-close",
                             daemon=True).start()

    def close(self) -> None:
        with self._stores_lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.pools.close()

    def _store(self, shard: Shard) -> Store:
        with self._stores_lock:
            store = self._stores.get(shard.name)
            if store is None:
                store = self._stores[shard.name] = self._open_store()
            return store

    def _read(self, shard: Shard, current: ShardMap) -> Scrape:
        store = self._store(shard)
        try:
            health = store.health(shard, self._bounds, overdue_grace_s=self._overdue_grace_s,
                                  timeout_s=self._timeout_s, shard_map=current)
            outbox = OutboxStore(store).backlog(shard, timeout_s=self._timeout_s)
        except ShardUnavailable as exc:
            if shard.name not in self._down:
                self._down.add(shard.name)
                log.warning("shard unavailable: %s", exc, extra={"shard": shard.name})
            # Its pool would back off reconnecting (seconds, growing) and make each
            # scrape wait for a connection; new probing pools try once per scrape.
            with self._stores_lock:
                if self._stores.get(shard.name) is store:
                    del self._stores[shard.name]
            threading.Thread(target=store.pools.close, name="shardq-scrape-close",
                             daemon=True).start()
            raise
        if shard.name in self._down:
            self._down.discard(shard.name)
            log.warning("shard answers again", extra={"shard": shard.name})
        return Scrape(health, outbox)


@dataclass(frozen=True)
class Scrape:
    """What one scrape read of one shard: the queue's health and the outbox's backlog."""

    health: ShardHealth
    outbox: list[OutboxBacklog]


def _result(future: Future[Scrape]) -> Scrape | None:
    if not future.done() or future.exception() is not None:
        return None
    return future.result()


def families(
    shard_map: ShardMap, snapshot: dict[str, Scrape | None]
) -> Iterable[GaugeMetricFamily]:
    """The exporter's gauges from a snapshot; a shard missing from it (or None) is down."""
    up = GaugeMetricFamily("shardq_shard_up", "1 when the shard answered this scrape in time",
                           labels=["shard"])
    waits = GaugeMetricFamily("shardq_open_waits", "Runs parked on a wait",
                              labels=["shard", "kind", "workflow"])
    stale = GaugeMetricFamily(
        "shardq_stale_waits", "Waits open longer than their kind's bound, or past their "
        "deadline and not woken", labels=["shard", "kind", "workflow"])
    stale_age = GaugeMetricFamily("shardq_stale_wait_oldest_age_seconds",
                                  "Age of the oldest stale wait",
                                  labels=["shard", "kind", "workflow"])
    signals = GaugeMetricFamily("shardq_pending_signals", "Signals buffered, not yet consumed",
                                labels=["shard"])
    overdue = GaugeMetricFamily(
        "shardq_overdue_tasks", "Runs due longer than the grace and not running (missing "
        "workers, or leases that expired unrescued)", labels=["shard"])
    overdue_age = GaugeMetricFamily("shardq_overdue_task_oldest_age_seconds",
                                    "How long the oldest overdue run has been due",
                                    labels=["shard"])
    runs = GaugeMetricFamily("shardq_runs", "Runs by state", labels=["shard", "state"])
    due = GaugeMetricFamily("shardq_due_tasks", "Runs due now and not running, by priority "
                            "(every level 0-9, so a level that drained reads 0)",
                            labels=["shard", "priority"])
    slot_waits = GaugeMetricFamily("shardq_concurrency_waiting",
                                   "Runs due but waiting for a slot of their concurrency key "
                                   "(`shardq limits list` names the keys)", labels=["shard"])
    slot_keys = GaugeMetricFamily("shardq_concurrency_keys_waiting",
                                  "Concurrency keys with a run waiting for a slot",
                                  labels=["shard"])
    tenants_due = GaugeMetricFamily("shardq_tenants_due",
                                    "Tenants with runs due now at priority 0 and not running: "
                                    "the ones a claim shares its batch between",
                                    labels=["shard"])
    rate_waiting = GaugeMetricFamily("shardq_rate_limited_steps",
                                     "Steps parked for a slot of their rate limiter",
                                     labels=["limiter"])
    rate_backlog = GaugeMetricFamily("shardq_rate_limiter_backlog_seconds",
                                     "How long a step asking its rate limiter for a slot now "
                                     "would wait", labels=["limiter"])
    outbox_pending = GaugeMetricFamily("shardq_outbox_pending",
                                       "Cross-shard signals not delivered yet",
                                       labels=["source_shard", "target_shard"])
    outbox_retrying = GaugeMetricFamily("shardq_outbox_retrying",
                                        "Undelivered cross-shard signals that failed before",
                                        labels=["source_shard", "target_shard"])
    outbox_age = GaugeMetricFamily("shardq_outbox_oldest_pending_age_seconds",
                                   "Age of the oldest undelivered cross-shard signal",
                                   labels=["source_shard", "target_shard"])
    outbox_failed = GaugeMetricFamily("shardq_outbox_failed",
                                      "Cross-shard signals that failed for good",
                                      labels=["source_shard", "target_shard"])
    for shard in shard_map.shards:
        scrape = snapshot.get(shard.name)
        up.add_metric([shard.name], 0 if scrape is None else 1)
        if scrape is None:
            continue
        health = scrape.health
        for kind, workflow, n in health.open_waits:
            waits.add_metric([shard.name, kind, workflow], n)
        for kind, workflow, n, oldest in health.stale_waits:
            stale.add_metric([shard.name, kind, workflow], n)
            stale_age.add_metric([shard.name, kind, workflow], oldest)
        signals.add_metric([shard.name], health.pending_signals)
        overdue.add_metric([shard.name], health.overdue_tasks)
        overdue_age.add_metric([shard.name], health.oldest_overdue_s or 0.0)
        for state in State:
            runs.add_metric([shard.name, state.value], health.runs_by_state.get(state.value, 0))
        for level in range(MAX_PRIORITY + 1):
            due.add_metric([shard.name, str(level)], health.due_by_priority.get(level, 0))
        slot_waits.add_metric([shard.name], health.concurrency_waiting)
        slot_keys.add_metric([shard.name], health.concurrency_keys_waiting)
        tenants_due.add_metric([shard.name], health.tenants_due)
        for limiter, waiting, backlog in health.rate_limiters:
            rate_waiting.add_metric([limiter], waiting)
            rate_backlog.add_metric([limiter], backlog)
        by_target: dict[str, list[float]] = {}
        for b in scrape.outbox:
            t = by_target.setdefault(shard_map.for_bucket(b.target_bucket).name, [0, 0, 0, 0])
            t[0] += b.pending
            t[1] += b.retrying
            t[2] += b.failed
            t[3] = max(t[3], b.oldest_pending_s or 0.0)
        for target, (pending, retrying, failed, oldest) in sorted(by_target.items()):
            labels = [shard.name, target]
            outbox_pending.add_metric(labels, pending)
            outbox_retrying.add_metric(labels, retrying)
            outbox_failed.add_metric(labels, failed)
            outbox_age.add_metric(labels, oldest)
    return [up, waits, stale, stale_age, signals, overdue, overdue_age, runs, due, slot_waits,
            slot_keys, tenants_due, rate_waiting, rate_backlog, outbox_pending, outbox_retrying,
            outbox_age, outbox_failed]
