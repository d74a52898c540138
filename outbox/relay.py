"""The outbox relay: delivers signals that workflows sent to runs of other shards.

A `ctx.signal_external` to a run of another shard commits an outbox row with
the sender's turn. A relay runs one loop per source shard. Each round locks a
batch of due rows (FOR UPDATE SKIP LOCKED, so any number of relays share the
work), delivers them to their target shards through the queue's own signal
path (shardq.deliver_signals: one commit per target shard and tenant), and settles
them in the same source transaction: delivered rows are deleted, rows that met
a transient error get their next attempt time, rows the target refused for
good are marked failed and their sender's history says why.

Why the row locks are the lease, not a claimed-by column: a lease column costs
a second write per row (claim, then settle) and a sweeper for the leases of
dead relays. A lock costs nothing to take and goes with its connection, so a
SIGKILLed relay's rows are due again at once. The price is a source
transaction open while a batch is delivered; deliveries are bounded by short
target timeouts, and the source connection sets
idle_in_transaction_session_timeout as a backstop.

Exactly once: the source and target commits are two databases, so a relay
that dies between the target's commit and the source's settle delivers the
row again. Every relayed signal carries its row's origin (source execution and
call position), which the target keeps with the signal and collapses a repeat
of, keyed or not. An idempotency key still adds what an origin cannot: one
logical event sent by several senders (or several runs) lands once.

Per-target health: a target shard that fails a delivery for want of the shard
(refused, restarting, read-only, out of connections, or silent past the round's
delivery deadline) is marked down. Rounds then defer its rows without trying,
and a prober thread of its own asks it once a second whether it takes writes
again; the answer that says yes makes its deferred rows due on this relay's
sources at once. So a shard that is down costs the rounds nothing, rows for
healthy shards keep flowing in the same batches, and a returning shard is
delivered to within about a second. An error that belongs to a row or a batch
(a deadlock, one tenant's bad batch) retries those rows and leaves the shard up.

The delivery deadline (RelayConfig.delivery_timeout_s) is what keeps a silent
target from holding a round: a delivery still in flight when it passes is left
to finish on its own thread, and its rows settle as retries. If it did land,
the retry collapses on the target by its origin, as after a relay crash.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from tenacity import RetryCallState, wait_exponential_jitter

from shardq.core import tracing
from shardq.core.daemons import MIN_POLL_S, ShardFollower, first_line
from shardq.core.errors import (
    ExecutionNotFound,
    ShardUnavailable,
    SignalRefused,
    StoreConflict,
    StoreFailed,
    StoreRejected,
)
from shardq.core.models import SignalResult
from shardq.outbox.instruments import RELAY_DELIVERY_SECONDS, RELAY_ROUND_SECONDS, RELAY_ROWS
from shardq.outbox.models import OutboxRow, OutboxSettlement
from shardq.outbox.store import OutboxStore, listen_for_outbox
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import Fenced, NotOwner, ShardqError, ShardRetired
from shardq.shards.failpoints import failpoint
from shardq.shards.fanout import by_shard
from shardq.store.listener import WakeSource
from shardq.store.params import SignalDelivery
from shardq.store.store import Store

log = logging.getLogger(__name__)

BUSY_NAP_S = 0.1
PROBE_INTERVAL_S = 1.0
"""How often a prober asks a target shard that is down whether it takes writes again."""

MOVED_RETRY_S = 0.1
"""When a row's target refused it for a move (the bucket frozen while it is copied, or
moved to another shard), it goes again this soon: a move's batch pauses its runs well
under a second, and a moved bucket's owner is known from the refusal."""

TRANSIENT = (ShardUnavailable, StoreConflict, StoreFailed, TimeoutError, OSError)
"""Errors a later attempt may not meet: the target shard down, restarting, in recovery,
a lost race, a timeout, a statement that failed. Anything the target answers about the
run itself is final."""


@dataclass(frozen=True)
class RelayConfig:
    batch_size: int = 200
    """Outbox rows claimed per round on a source shard."""
    poll_interval_s: float = 5.0
    """Longest sleep between rounds; NOTIFYs of new rows and due retries wake it earlier."""
    max_age_s: float = 7 * 24 * 3600.0
    """A row still failing transiently this long after it was queued fails for good
    (`expired`), so no row retries forever unseen."""
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 60.0
    delivery_timeout_s: float = 3.0
    """How long a round waits for one target shard's deliveries. Past it the target is
    taken for down (silent, or too slow to be of use) and its rows retry; a healthy
    shard commits a batch in milliseconds."""

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError(f"batch size must be 1..10000, got {self.batch_size}")
        for name in ("poll_interval_s", "max_age_s", "initial_backoff_s", "max_backoff_s",
                     "delivery_timeout_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.poll_interval_s < MIN_POLL_S:
            raise ValueError(f"poll interval must be at least {MIN_POLL_S} s, got "
                             f"{self.poll_interval_s}")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("max backoff must be at least the initial backoff")


class Backoff:
    """Exponential backoff with jitter (tenacity's), by attempt number."""

    def __init__(self, config: RelayConfig) -> None:
        self._wait = wait_exponential_jitter(
            multiplier=config.initial_backoff_s, max=config.max_backoff_s,
            jitter=config.initial_backoff_s,
        )

    def __call__(self, attempt: int) -> float:
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(self._wait(state))


class TargetDeferred(ShardUnavailable):
    """A row not tried: its target shard is down, and its prober has not seen it back."""

    def __init__(self, target: Shard) -> None:
        super().__init__(f"{target.label}: unavailable; its rows wait until it takes writes")


class TargetSilent(ShardUnavailable):
    """A delivery still unanswered at the round's deadline."""

    def __init__(self, target: Shard, seconds: float) -> None:
        super().__init__(f"{target.label}: no answer within {seconds:g} s")


class TargetHealth:
    """Which target shards are down, each watched by a prober until it is back. Thread-safe.

    `on_back(shard)` is called from the prober's thread once the shard takes
    writes again.
    """

    def __init__(self, store: Store, on_back: Callable[[Shard], None],
                 stopping: threading.Event) -> None:
        self._store = store
        self._on_back = on_back
        self._stopping = stopping
        self._lock = threading.Lock()
        self._down: set[str] = set()

    def is_down(self, shard: Shard) -> bool:
        with self._lock:
            return shard.name in self._down

    def failed(self, shard: Shard, error: BaseException) -> None:
        with self._lock:
            if shard.name in self._down:
                return
            self._down.add(shard.name)
        log.warning("target shard unavailable; deferring its rows until it is back",
                    extra={"shard": shard.name, "error": first_line(error)})
        threading.Thread(target=self._probe, args=(shard,), name=f"shardq-probe-{shard.name}",
                         daemon=True).start()

    def _probe(self, shard: Shard) -> None:
        while not self._stopping.wait(PROBE_INTERVAL_S):
            if self._store.map.get(shard.name) is None:
                with self._lock:  # removed from the map: nothing will be sent to it again
                    self._down.discard(shard.name)
                return
            try:
                if not self._store.takes_writes(shard):
                    continue
            except Exception as exc:
                log.debug("target shard still unavailable",
                          extra={"shard": shard.name, "error": first_line(exc)})
                continue
            with self._lock:
                self._down.discard(shard.name)
            log.warning("target shard takes writes again", extra={"shard": shard.name})
            self._on_back(shard)
            return


class Relay:
    """Delivers the outbox rows of `sources` (default: every shard) until stopped.

    Threads: one loop per source shard (`shardq-relay-<shard>`), each with the
    LISTEN connection of its WakeSource; deliveries of one batch to several
    target shards run on that loop's small pool (`shardq-deliver`). The loops
    share only the store, the target health record and the counters (locked).
    """

    def __init__(
        self,
        store: Store,
        *,
        sources: Sequence[Shard] | None = None,
        config: RelayConfig | None = None,
    ) -> None:
        self.config = config or RelayConfig()
        self.store = store
        self.outbox = OutboxStore(store)
        # Without named sources, the relay follows the map: it relays from the
        # shards a newer version adds (a moved run's pending rows went with it)
        # and lets go of those it drops (their outboxes moved away first).
        self._follower = ShardFollower(
            sources if sources is not None else self.map.shards, self._loop,
            loop_name="shardq-relay", map_name="shardq-relay-map",
            current=None if sources is not None else lambda: self.map.shards,
            added=self._added, wake=self._wake)
        self._backoff = Backoff(self.config)
        self._stopping = self._follower.stopping
        self.health = TargetHealth(store, self._target_back, self._stopping)
        self._wakes = {s.name: WakeSource(s, listen=listen_for_outbox) for s in self.sources}
        # Room for one delivery per target left running past its deadline (a
        # silent target) beside a full round's: down targets get no new ones.
        self._pools = {
            s.name: ThreadPoolExecutor(2 * len(self.map.shards),
                                       thread_name_prefix="shardq-deliver")
            for s in self.sources
        }
        self._counts_lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """Rows by outcome: delivered, duplicate, retried, failed:<reason>."""

    @property
    def sources(self) -> list[Shard]:
        """The shards relayed from now (a copy)."""
        return self._follower.shards

    def start(self) -> Relay:
        self._follower.start()
        return self

    def _added(self, source: Shard) -> None:
        """Make ready to relay from a shard the map added; its loop starts next."""
        self._wakes[source.name] = WakeSource(source, listen=listen_for_outbox)
        self._pools[source.name] = ThreadPoolExecutor(
            2 * len(self.map.shards), thread_name_prefix="shardq-deliver")
        log.info("relaying from a shard the map added", extra={"shard": source.name})

    def _wake(self, names: Collection[str]) -> None:
        for name in names:
            self._wakes[name].set()

    def _let_go(self, source: Shard) -> None:
        """Stop relaying from a shard the map dropped: its loop ends with its LISTEN
        connection and delivery threads, quietly (it is no outage)."""
        self._follower.let_go(source.name)
        self._wakes[source.name].close()
        self._pools[source.name].shutdown(wait=False)
        log.info("no longer relaying from a shard the map dropped", extra={"shard": source.name})

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the rounds in flight, then stop; nothing is left half done."""
        self._follower.stop(timeout)
        # Copies: a shard may have been added as this ran.
        for wake in list(self._wakes.values()):
            wake.close()
        for pool in list(self._pools.values()):
            pool.shutdown(wait=False)

    def _loop(self, source: Shard) -> None:
        wake = self._wakes[source.name]
        failures = 0
        while not self._stopping.is_set():
            if self._follower.retiring(source.name):
                self._let_go(source)
                return
            wake.clear()
            try:
                claimed = self.relay_once(source)
                sleep = 0.0 if claimed >= self.config.batch_size else self._idle_for(source)
                if failures:
                    wake.renew()  # its LISTEN connection may not have survived the outage
                failures = 0
            except ShardRetired:
                # The pools follow the map ahead of the map loop: removed, not lost.
                self._follower.retire(source.name)
                continue
            except Exception as exc:
                # The source shard itself failed us (or a bug): nothing was
                # settled, the rows stay due; try again after a backoff.
                failures += 1
                sleep = self._backoff(failures)
                log.warning("relay round failed", extra={
                    "shard": source.name, "error": first_line(exc), "retry_in_s": round(sleep, 3)})
            if sleep > 0:
                wake.wait(sleep)

    def _target_back(self, target: Shard) -> None:
        """Make the rows deferred for `target` due on every source, and wake the loops."""
        for source in list(self.sources):
            try:
                for first, last in self.map.named([target.name])[0].ranges:
                    self.outbox.target_back(source, first, last)
            except Exception as exc:
                # Their retry times stand: they go out then, a little later.
                log.warning("could not make the rows for a returning shard due",
                            extra={"shard": source.name, "target": target.name,
                                   "error": first_line(exc)})
            self._wakes[source.name].set()

    def _idle_for(self, source: Shard) -> float:
        due = self.outbox.next_due(source)
        if due is None:
            return self.config.poll_interval_s
        if due <= 0:
            # Due rows this round could not claim: another relay holds them. A
            # short nap, not a spin, until it settles them or a NOTIFY comes.
            return min(self.config.poll_interval_s, BUSY_NAP_S)
        return min(self.config.poll_interval_s, due)

    @property
    def map(self) -> ShardMap:
        """The map deliveries are routed by: the newest version the store's pools follow."""
        return self.store.map

    def relay_once(self, source: Shard) -> int:
        """One round on `source`: claim, deliver, settle. Returns how many rows it claimed."""
        started = time.perf_counter()
        claimed = self._round(source)
        if claimed:
            RELAY_ROUND_SECONDS.labels(source.name).observe(time.perf_counter() - started)
        return claimed

    def _round(self, source: Shard) -> int:
        with self.outbox.claim(source, limit=self.config.batch_size) as (rows, settlement):
            if not rows:
                return 0
            groups = by_shard(self.map, rows, lambda r: r.target_bucket)
            outcomes = self._deliver_all(source, {
                target: [row for _, row in members] for target, members in groups.items()})
            failpoint("relay.after_deliver")
            for row, result in outcomes:
                self._settle(source, row, result, settlement)
        return len(rows)

    def _deliver_all(
        self, source: Shard, groups: dict[Shard, list[OutboxRow]]
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        """Every target's rows at once, each bounded by the delivery deadline."""
        results: list[tuple[OutboxRow, SignalResult | BaseException]] = []
        running: dict[Future[list[tuple[OutboxRow, SignalResult | BaseException]]],
                      tuple[Shard, list[OutboxRow]]] = {}
        for target, rows in groups.items():
            if self.health.is_down(target):
                deferred = TargetDeferred(target)
                results.extend((row, deferred) for row in rows)
            else:
                future = self._pools[source.name].submit(self._deliver_to, target, rows)
                running[future] = (target, rows)
        done, late = wait(running, timeout=self.config.delivery_timeout_s)
        for future in done:
            results.extend(future.result())
        for future in late:
            target, rows = running[future]
            silent = TargetSilent(target, self.config.delivery_timeout_s)
            self.health.failed(target, silent)
            results.extend((row, silent) for row in rows)
        return results

    def _deliver_to(
        self, target: Shard, rows: list[OutboxRow]
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        """Deliver one target shard's rows, one commit per tenant; an error stands for a row.

        A row that carries its sender's trace is delivered in a span of its own that
        continues it, and the signal it writes carries that span (core/tracing.py)."""
        spans = {r.id: tracing.start_span(
            "shardq.outbox.deliver", parent=r.trace, kind=tracing.CONSUMER,
            attributes={"shardq.outbox.id": r.id, "shardq.signal": r.name,
                        "shardq.execution_id": str(r.target), "shardq.shard": target.name,
                        "shardq.attempt": r.attempts + 1})
            for r in rows if r.trace}
        results = self._deliver_batches(target, rows, spans)
        for row, result in results:
            failure = result.error if isinstance(result, SignalResult) else result
            tracing.end(spans.get(row.id), failure)
        return results

    def _deliver_batches(
        self, target: Shard, rows: list[OutboxRow], spans: dict[int, Any],
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        by_tenant: dict[str, list[OutboxRow]] = defaultdict(list)
        for row in rows:
            by_tenant[row.tenant].append(row)
        results: list[tuple[OutboxRow, SignalResult | BaseException]] = []
        for tenant, members in by_tenant.items():
            if self.health.is_down(target):
                deferred = TargetDeferred(target)
                results.extend((row, deferred) for row in members)
                continue
            try:
                delivered = self.store.deliver_signals(target, tenant,
                                                       [_delivery(r, spans) for r in members])
            except NotOwner as exc:
                # Routed by a map older than a move: its rows go again soon, to
                # the owner the newer map names (Fenced: once the move's batch
                # is copied).
                self._follow(target, exc)
                results.extend((row, exc) for row in members)
                continue
            except TRANSIENT as exc:
                if shard_level(exc):
                    self.health.failed(target, exc)
                    results.extend((row, exc) for row in members)
                elif isinstance(exc, StoreConflict) or len(members) == 1:
                    results.extend((row, exc) for row in members)
                else:
                    results.extend(self._deliver_one_by_one(target, tenant, members, spans))
                continue
            except StoreRejected as exc:
                if len(members) == 1:
                    results.append((members[0], exc))
                else:
                    results.extend(self._deliver_one_by_one(target, tenant, members, spans))
                continue
            results.extend(zip(members, delivered, strict=True))
        return results

    def _deliver_one_by_one(
        self, target: Shard, tenant: str, rows: list[OutboxRow], spans: dict[int, Any],
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        """A batch the target refused for one of its rows: find that row, deliver the rest."""
        results: list[tuple[OutboxRow, SignalResult | BaseException]] = []
        for row in rows:
            if self.health.is_down(target):
                results.append((row, TargetDeferred(target)))
                continue
            try:
                (result,) = self.store.deliver_signals(target, tenant, [_delivery(row, spans)])
            except NotOwner as exc:
                self._follow(target, exc)
                results.append((row, exc))
                continue
            except (StoreRejected, *TRANSIENT) as exc:
                if shard_level(exc):
                    self.health.failed(target, exc)
                results.append((row, exc))
            else:
                results.append((row, result))
        return results

    def _settle(
        self, source: Shard, row: OutboxRow, result: SignalResult | BaseException,
        settlement: OutboxSettlement,
    ) -> None:
        if isinstance(result, SignalResult) and result.error is None:
            settlement.delivered.append(row.id)
            self._count(source, "delivered" if result.delivered else "duplicate")
            RELAY_DELIVERY_SECONDS.labels(source.name).observe(row.queued_s)
            return
        error = result.error if isinstance(result, SignalResult) else result
        reason = _permanent_reason(error)
        if reason is None:
            delay = MOVED_RETRY_S if isinstance(error, NotOwner) else self._backoff(
                row.attempts + 1)
            if isinstance(error, ShardUnavailable):
                # Made due again by the target's prober the moment it is back.
                delay = max(delay, self.config.max_backoff_s)
            if row.queued_s + delay < self.config.max_age_s:
                settlement.retry.append((row.id, delay, "transient", first_line(error)))
                self._count(source, "retried")
                return
            reason = "expired"
        settlement.failed.append((row.id, reason, first_line(error)))
        self._count(source, f"failed:{reason}")
        # Info, not a warning: a target that finished is an answer, not a fault.
        # The sender's history, `shardq outbox failed` and the metrics keep it.
        log.info("outbox row failed for good", extra={
            "outbox_id": row.id, "source_execution_id": str(row.source_execution_id),
            "target_execution_id": str(row.target), "reason_code": reason,
            "error": first_line(error)})

    def _follow(self, target: Shard, refused: NotOwner) -> None:
        """Read the map version a refusing target names, so the next round routes by it."""
        if isinstance(refused, Fenced) and refused.map_version <= self.map.version:
            return  # frozen while a move copies it: the map has not changed yet
        try:
            self.store.pools.refresh(at_least=refused.map_version, via=target)
        except ShardqError as exc:
            log.warning("could not read a newer shard map", extra={
                "shard": target.name, "error": first_line(exc)})

    def _count(self, source: Shard, outcome: str) -> None:
        with self._counts_lock:
            self.counts[outcome] += 1
        RELAY_ROWS.labels(source.name, outcome.replace(":", "_")).inc()


def _permanent_reason(error: BaseException | None) -> str | None:
    """The reason code of an outcome no retry can change; None for a transient one."""
    if isinstance(error, ExecutionNotFound):
        return "target_not_found"
    if isinstance(error, SignalRefused):
        return error.reason_code
    if isinstance(error, StoreRejected):
        return "target_rejected"
    return None


def shard_level(error: BaseException) -> bool:
    """True when `error` says the target shard cannot take writes now, whatever the rows."""
    if isinstance(error, StoreConflict):
        return False  # a deadlock or serialization failure: a race between statements
    # The store words a server's trouble (a lost connection, no slots, a shutdown, a
    # cancelled statement, a read-only server) as ShardUnavailable; a StoreFailed is
    # a statement's own failure.
    return isinstance(error, (ShardUnavailable, TimeoutError, OSError))


def _delivery(row: OutboxRow, spans: dict[int, Any]) -> SignalDelivery:
    """The signal an outbox row asks its target's shard to take (with its delivery's
    trace, when `spans` holds one for it)."""
    span = spans.get(row.id)
    return SignalDelivery(row.target, row.name, row.payload_json, row.idempotency_key,
                          row.origin, tracing.traceparent(span))
