"""The outbox relay: delivers signals that workflows sent to runs of other shards.

A `ctx.signal_external` to a run of another shard commits an outbox row with
the sender's turn. A relay runs one loop per source shard. Each round locks a
batch of due rows (FOR UPDATE SKIP LOCKED, so any number of relays share the
work), delivers them to their target shards through the queue's own signal
path (queue/signaling.py: one commit per target shard and tenant), and settles
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

Per-target health: a target shard that fails a delivery is skipped, its rows
deferred with backoff without trying, until its next probe time, so a shard
that is down costs one failed attempt per backoff period and rows for healthy
shards keep flowing in the same batches.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg
from tenacity import RetryCallState, wait_exponential_jitter

from shardq.queue.errors import (
    ExecutionNotFound,
    ShardUnavailable,
    SignalRefused,
    StoreConflict,
    StoreRejected,
)
from shardq.queue.instruments import RELAY_DELIVERY_SECONDS, RELAY_ROUND_SECONDS, RELAY_ROWS
from shardq.queue.listener import WakeSource
from shardq.queue.models import OutboxRow, OutboxSettlement, SignalResult
from shardq.queue.params import SignalDelivery
from shardq.queue.signaling import deliver
from shardq.queue.store import Store, listen_for_outbox
from shardq.queue.worker import MIN_POLL_S
from shardq.shards.config import Shard
from shardq.shards.fanout import by_shard

log = logging.getLogger(__name__)

FAILPOINT_ENV = "SHARDQ_RELAY_FAILPOINT"
"""Test-only: `after_deliver` makes the relay SIGKILL itself after a batch reached its
target shards and before its source rows are settled (the window exactly-once covers)."""

BUSY_NAP_S = 0.1

TRANSIENT = (ShardUnavailable, StoreConflict, psycopg.Error, TimeoutError, OSError)
"""Errors a later attempt may not meet: the target shard down, restarting, in recovery,
a lost race, a timeout. Anything the target answers about the run itself is final."""


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

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError(f"batch size must be 1..10000, got {self.batch_size}")
        for name in ("poll_interval_s", "max_age_s", "initial_backoff_s", "max_backoff_s"):
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
    """A row not tried: its target shard failed lately and is skipped for `wait` seconds."""

    def __init__(self, target: Shard, wait: float) -> None:
        super().__init__(f"{target.label}: unavailable lately; next try in {wait:.1f} s")
        self.wait = wait


class TargetHealth:
    """Which target shards to skip for now, after a failed delivery. Thread-safe."""

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._lock = threading.Lock()
        self._down: dict[str, tuple[int, float]] = {}  # shard -> (failures, retry at)

    def skip_for(self, shard: Shard) -> float:
        """Seconds until `shard` may be tried again; 0 when it may be tried now."""
        with self._lock:
            entry = self._down.get(shard.name)
        return 0.0 if entry is None else max(0.0, entry[1] - time.monotonic())

    def failed(self, shard: Shard, error: BaseException) -> None:
        with self._lock:
            failures = self._down.get(shard.name, (0, 0.0))[0] + 1
            wait = self._backoff(failures)
            self._down[shard.name] = (failures, time.monotonic() + wait)
        if failures == 1:
            log.warning("target shard unavailable; deferring its rows",
                        extra={"shard": shard.name, "error": _line(error)})

    def succeeded(self, shard: Shard) -> None:
        with self._lock:
            was_down = self._down.pop(shard.name, None)
        if was_down is not None:
            log.warning("target shard reachable again", extra={"shard": shard.name})


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
        self.map = store.map
        self.sources = list(sources) if sources is not None else list(self.map.shards)
        self._backoff = Backoff(self.config)
        self.health = TargetHealth(self._backoff)
        self._stopping = threading.Event()
        self._wakes = {s.name: WakeSource(s, listen=listen_for_outbox) for s in self.sources}
        self._pools = {
            s.name: ThreadPoolExecutor(len(self.map.shards), thread_name_prefix="shardq-deliver")
            for s in self.sources
        }
        self._threads: list[threading.Thread] = []
        self._counts_lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """Rows by outcome: delivered, duplicate, retried, failed:<reason>."""

    def start(self) -> Relay:
        for source in self.sources:
            thread = threading.Thread(
                target=self._loop, args=(source,), name=f"shardq-relay-{source.name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the rounds in flight, then stop; nothing is left half done."""
        self._stopping.set()
        for wake in self._wakes.values():
            wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for wake in self._wakes.values():
            wake.close()
        for pool in self._pools.values():
            pool.shutdown(wait=False)

    def _loop(self, source: Shard) -> None:
        wake = self._wakes[source.name]
        failures = 0
        while not self._stopping.is_set():
            wake.clear()
            try:
                claimed = self.relay_once(source)
                sleep = 0.0 if claimed >= self.config.batch_size else self._idle_for(source)
                failures = 0
            except Exception as exc:
                # The source shard itself failed us (or a bug): nothing was
                # settled, the rows stay due; try again after a backoff.
                failures += 1
                sleep = self._backoff(failures)
                log.warning("relay round failed", extra={
                    "shard": source.name, "error": _line(exc), "retry_in_s": round(sleep, 3)})
            if sleep > 0:
                wake.wait(sleep)

    def _idle_for(self, source: Shard) -> float:
        due = self.store.outbox_next_due(source)
        if due is None:
            return self.config.poll_interval_s
        if due <= 0:
            # Due rows this round could not claim: another relay holds them, or
            # an earlier row of their pair waits for its retry. A short nap,
            # not a spin, until the other relay settles or a NOTIFY comes.
            return min(self.config.poll_interval_s, BUSY_NAP_S)
        return min(self.config.poll_interval_s, due)

    def relay_once(self, source: Shard) -> int:
        """One round on `source`: claim, deliver, settle. Returns how many rows it claimed."""
        started = time.perf_counter()
        claimed = self._round(source)
        if claimed:
            RELAY_ROUND_SECONDS.labels(source.name).observe(time.perf_counter() - started)
        return claimed

    def _round(self, source: Shard) -> int:
        with self.store.claim_outbox(source, limit=self.config.batch_size) as (rows, settlement):
            if not rows:
                return 0
            groups = by_shard(self.map, rows, lambda r: r.target_bucket)
            if len(groups) == 1:
                ((target, members),) = groups.items()
                outcomes = [self._deliver_to(target, [row for _, row in members])]
            else:
                outcomes = list(self._pools[source.name].map(
                    lambda item: self._deliver_to(item[0], [row for _, row in item[1]]),
                    groups.items(),
                ))
            _failpoint("after_deliver")
            for outcome in outcomes:
                for row, result in outcome:
                    self._settle(source, row, result, settlement)
        return len(rows)

    def _deliver_to(
        self, target: Shard, rows: list[OutboxRow]
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        """Deliver one target shard's rows, one commit per tenant; an error stands for a row."""
        wait = self.health.skip_for(target)
        if wait > 0:
            deferred = TargetDeferred(target, wait)
            return [(row, deferred) for row in rows]
        by_tenant: dict[str, list[OutboxRow]] = defaultdict(list)
        for row in rows:
            by_tenant[row.tenant].append(row)
        results: list[tuple[OutboxRow, SignalResult | BaseException]] = []
        for tenant, members in by_tenant.items():
            try:
                delivered = deliver(self.store, tenant, [_checked(r) for r in members])
            except StoreRejected as exc:
                results.extend(self._deliver_one_by_one(tenant, members, exc))
                continue
            except TRANSIENT as exc:
                self.health.failed(target, exc)
                results.extend((row, exc) for row in members)
                continue
            self.health.succeeded(target)
            results.extend(zip(members, delivered, strict=True))
        return results

    def _deliver_one_by_one(
        self, tenant: str, rows: list[OutboxRow], error: StoreRejected
    ) -> list[tuple[OutboxRow, SignalResult | BaseException]]:
        """A batch the target's database refused: find the row it refuses, deliver the rest."""
        if len(rows) == 1:
            return [(rows[0], error)]
        results: list[tuple[OutboxRow, SignalResult | BaseException]] = []
        for row in rows:
            try:
                (result,) = deliver(self.store, tenant, [_checked(row)])
            except (StoreRejected, *TRANSIENT) as exc:
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
            delay = self._backoff(row.attempts + 1)
            if isinstance(error, TargetDeferred):
                delay = max(delay, error.wait + self._backoff(1))
            if row.queued_s + delay < self.config.max_age_s:
                settlement.retry.append((row.id, delay, "transient", _line(error)))
                self._count(source, "retried")
                return
            reason = "expired"
        settlement.failed.append((row.id, reason, _line(error)))
        self._count(source, f"failed:{reason}")
        # Info, not a warning: a target that finished is an answer, not a fault.
        # The sender's history, `shardq outbox failed` and the metrics keep it.
        log.info("outbox row failed for good", extra={
            "outbox_id": row.id, "source_execution_id": str(row.source_execution_id),
            "target_execution_id": str(row.target), "reason_code": reason,
            "error": _line(error)})

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


def _checked(row: OutboxRow) -> SignalDelivery:
    return SignalDelivery(row.target, row.name, row.payload_json, row.idempotency_key,
                          row.origin)


def _line(error: BaseException | None) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _failpoint(name: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == name:
        log.warning("failpoint reached: killing this process", extra={"failpoint": name})
        os.kill(os.getpid(), signal.SIGKILL)
