"""The worker: claim due runs on every served shard, run their turns, commit, repeat.

Per shard, a claim loop leases batches of due tasks and hands them to a bounded
pool of turn threads; between claims it sleeps on the shard's NOTIFYs and on
pokes from this process. A completer per shard groups the turns' commits. One
heartbeat thread extends the leases of every turn in flight. `stop()` drains:
no new claims, in-flight turns get until the drain deadline, and whatever is
left is handed back at once rather than at lease expiry.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Collection

from prometheus_client import Counter, Histogram

from shardq.core.daemons import ShardFollower, first_line, spawn
from shardq.core.errors import StoreRejected
from shardq.core.instruments import (
    CLAIM_BATCH,
    CLAIMED,
    CLAIMS,
    TURN_SECONDS,
    TURNS,
    WAKEUPS,
)
from shardq.core.models import Claim, CommitOutcome, State, TaskAction, TurnCommit
from shardq.shards.config import Shard
from shardq.shards.errors import ShardqError, ShardRetired
from shardq.shards.routing import bucket_of
from shardq.store.listener import WakeSource
from shardq.store.params import Lease
from shardq.store.protocol import TickerStore, WorkerStore
from shardq.worker.completer import Completer, Result
from shardq.worker.config import WorkerConfig
from shardq.worker.leases import beat
from shardq.worker.limiters import HomeRateSlots
from shardq.worker.logcontext import about_run
from shardq.worker.retention import RetentionPlan, fold_counts_served, purge_served
from shardq.worker.slots import InFlight, Reservation, TurnItem, TurnQueue
from shardq.worker.ticker import ROUNDS_IN_FLIGHT, Ticker
from shardq.worker.turn import failing_commit, run_turn
from shardq.workflow.control import CommitRejected
from shardq.workflow.registry import Registry

log = logging.getLogger(__name__)
_TURN_OUTCOMES = {name: TURNS.labels(name)
                  for name in [*(s.value for s in State), "abandoned", "lease_lost"]}
"""How a turn ended: the state its last commit left the run in (a checkpoint's run
stays running), or why nothing landed."""


COALESCE_S = 0.001
"""How long a claim loop with a few free turn threads waits for more to free up: a
partial batch is claimed once a wait this long freed none."""
CLAIM_STALL_S = 0.5
"""A claim unanswered this long lends its reserved slots back to the other shards' loops
(a healthy claim answers in milliseconds; one to a hung server waits for its probe)."""
class Worker:
    """Runs the turns of due runs on the served shards: `start()`, then `stop()` to drain.

    Threads, and what each one owns:

    - The caller's: `start()`, `stop()`, `wake()`.
    - A claim thread per shard (`shardq-claim-<shard>`, `_claim_loop`): reserves
      free turn slots, claims, records the leases in `_inflight` and queues the
      claims for the turn threads; sleeps on its shard's WakeSource.
    - A completer per shard (`shardq-completer-<shard>`, see Completer): group
      commits, and runs `_turn_ended` for each turn's last commit, which
      releases the run (or submits the commit that fails a refused one).
    - `concurrency` turn threads (`shardq-turn-<i>`, `_turn_loop`): run one
      claimed run's turn at a time: workflow code, steps and checkpoints (which
      block the thread, and may commit on it, see Completer.submit); then hand
      the last commit to the completer without waiting for it.
    - A heartbeat per shard (`shardq-heartbeat-<shard>`, worker/leases.py): extends
      the shard's leases in `_inflight` every third of a lease until the drain is over.
    - Following the map (`shardq-map`, see ShardFollower): serves the shards a
      newer map version adds (`_added`) and marks those it drops for `_let_go`.
    - Step-attempt threads (`shardq-step`), one per attempt of a step with a
      `timeout`: run the step function and touch no worker state.

    `_inflight`, `_turning`, `_settling`, `_starved` and `_coalescing` change only under
    `_lock` (`_idle` is a condition on it). A claim is queued with its own
    `InFlight` entry, and the end of its turn removes that entry only: the
    run may be claimed again (a signal woke it) between its last commit
    landing and the completer's callback, and the new claim's entry must stay.
    `InFlight.token` is written outside the lock; see there why that holds.
    """

    def __init__(self, store: WorkerStore, registry: Registry, *, shards: list[Shard] | None = None,
                 config: WorkerConfig | None = None) -> None:
        self.config = config or WorkerConfig()
        self.registry = registry
        self.store = store
        self._rate_slots = HomeRateSlots(store, registry.rate_limits)
        # Without a named subset, the worker serves the shards of the current map
        # version: one a newer version adds is served within MAP_CHECK_S; one it
        # drops is let go (_let_go): no more claims, its leases end normally, then
        # its loops, LISTEN connection and completer stop, without a word above info.
        self._follower = ShardFollower(
            shards or store.map.shards, self._claim_loop, loop_name="shardq-claim",
            map_name="shardq-map",
            current=None if shards is not None else lambda: self.store.map.shards,
            added=self._added, wake=self._wake)
        self._gone: dict[str, threading.Event] = {}  # by shard: set once it is let go
        self._stopping = self._follower.stopping
        # Heartbeats go on until the drain is over: a turn finishing during the
        # drain must not lose its lease to another worker.
        self._drained = threading.Event()
        self._wakes = {s.name: WakeSource(s) for s in self.shards}
        # Leases held: from the claim until the turn's last commit is settled.
        self._inflight: dict[uuid.UUID, InFlight] = {}
        # Of those, claimed runs whose turn has not returned (queued or running),
        # and finished turns whose last commit is still in flight. Claims fill
        # free turn threads, while a backlog of unsettled commits holds them back.
        self._turning = self._settling = 0
        self._starved: set[str] = set()  # claim loops that last found no free slot
        self._coalescing: set[str] = set()  # claim loops waiting for a full batch of slots
        self._claiming: dict[str, Reservation] = {}  # by shard: the claims in flight
        self._lend_at: float | None = None  # when a stalled claim's slots may be lent next
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._turns: TurnQueue = TurnQueue()
        self._completers = {
            s.name: Completer(self.store, s, lease_s=self.config.lease_s,
                              max_batch=self.config.commit_batch)
            for s in self.shards
        }
        # Claim full batches under a backlog of short turns, yet at once when
        # idle (see _reserve). No more than the free slots can ever reach.
        self._claim_threshold = min(self.config.batch_size, self.config.concurrency,
                                    self.config.commit_batch)

    @property
    def shards(self) -> list[Shard]:
        """The shards served now (a copy)."""
        return self._follower.shards

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> Worker:
        if self.registry.rate_limits:
            self._rate_slots.declare()
        for completer in self._completers.values():
            completer.start()
        for shard in self.shards:
            self._start_heartbeat(shard)
        for i in range(self.config.concurrency):
            spawn(f"shardq-turn-{i}", self._turn_loop)
        if self.config.housekeeping_interval_s > 0:
            spawn("shardq-housekeeping", self._housekeeping_loop)
        if self.config.count_fold_interval_s > 0:
            spawn("shardq-count-fold", functools.partial(
                fold_counts_served, self.store, lambda: self.shards,
                self.config.count_fold_interval_s, self._drained))
        if self.config.schedules and isinstance(self.store, TickerStore):
            ticker = Ticker(self.store, self.registry, self._stopping)
            for i in range(ROUNDS_IN_FLIGHT):
                spawn(f"shardq-ticker-{i}", ticker.loop)
        self._follower.start()  # the claim loops, and the map thread
        log.info("worker started", extra={
            "owner": self.config.owner, "shards": ",".join(s.name for s in self.shards),
            "concurrency": self.config.concurrency,
        })
        return self

    def _start_heartbeat(self, shard: Shard) -> None:
        gone = self._gone[shard.name] = threading.Event()
        heartbeat = functools.partial(
            beat, self.store, shard, functools.partial(self._held_on, shard),
            self.config.lease_s, self._drained, gone)
        spawn(f"shardq-heartbeat-{shard.name}", heartbeat)

    def _added(self, shard: Shard) -> None:
        """Make ready to serve a shard the map added; its claim loop starts next."""
        completer = Completer(self.store, shard, lease_s=self.config.lease_s,
                              max_batch=self.config.commit_batch)
        completer.start()
        # Under the lock: turn threads read these dicts to wake every claim
        # loop, and one iterated while a shard was added died of it.
        with self._lock:
            self._wakes[shard.name] = WakeSource(shard)
            self._completers[shard.name] = completer
        self._start_heartbeat(shard)
        log.info("serving a shard the map added", extra={"shard": shard.name})

    def stop(self, *, drain_timeout_s: float | None = None) -> int:
        """Drain and stop; returns how many leases had to be handed back unfinished."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        deadline = time.monotonic() + timeout
        # A claim loop in the middle of a claim records what it leased before it
        # exits; only then is the in-flight set complete. The map thread ends
        # too, so no shard is added behind the closing below.
        self._follower.stop(timeout + 5.0)
        with self._idle:
            while self._inflight and time.monotonic() < deadline:
                self._idle.wait(timeout=max(0.0, deadline - time.monotonic()))
            leftover = list(self._inflight.values())
        self._turns.put_many([None] * self.config.concurrency)
        self._drained.set()
        released = 0
        for shard in self.shards:
            leases = [Lease(f.execution_id, f.token) for f in leftover
                      if f.shard.name == shard.name]
            if leases:
                try:
                    released += len(self.store.release_leases(shard, leases))
                except Exception as exc:  # stop() must still close what it opened
                    log.warning("could not hand leases back; they expire instead",
                                extra={"shard": shard.name, "error": str(exc)})
        with self._lock:
            completers, wakes = list(self._completers.values()), list(self._wakes.items())
        for completer in completers:
            completer.close()
        # A claim loop still alive (stuck past its join) may be waiting on its own;
        # none was started when stop() comes without start().
        waiting = self._follower.running()
        for name, wake in wakes:
            if name not in waiting:
                wake.close()
        log.info("worker stopped", extra={"owner": self.config.owner, "released": released})
        return released

    def wake(self) -> None:
        """Poke every claim loop (tests, embedding applications)."""
        with self._lock:
            events = list(self._wakes.values())
        for event in events:
            event.set()

    # -- claiming --------------------------------------------------------------

    def _free_slots(self) -> int:
        """Runs a claim may take now (the caller holds the lock)."""
        return min(self.config.concurrency - self._turning,
                   self.config.commit_batch - self._settling)

    def _claim_loop(self, shard: Shard) -> None:
        wake = self._wakes[shard.name]
        partial: int | None = None  # free slots seen while waiting for a worthwhile batch
        backlog = False  # the last claim came back full: more runs are likely due
        failures = 0
        notified, timed = WAKEUPS.labels(shard.name, "notify"), WAKEUPS.labels(shard.name, "timer")
        counted = (CLAIMS.labels(shard.name), CLAIMED.labels(shard.name),
                   CLAIM_BATCH.labels(shard.name))

        def sleep(seconds: float) -> None:
            (notified if wake.wait(seconds) else timed).inc()

        while not self._stopping.is_set():
            if self._follower.retiring(shard.name):
                self._let_go(shard)
                return
            # Cleared before the slots are read: a wake from here on is kept
            # for the wait below.
            wake.clear()
            # Urgent work (a NOTIFY said so) is claimed from the free slots at once,
            # from the levels above 0 only, not after a full batch of them freed.
            limit, partial = self._reserve(shard, partial, backlog and not wake.urgent)
            if not limit:
                sleep(self._starved_sleep() if partial is None else COALESCE_S)
                continue
            lane = int(wake.take_urgent())
            claims, due_in, error = self._claim(shard, limit, counted, lane)
            backlog = (backlog if lane else error is None and len(claims) == limit)
            if isinstance(error, ShardRetired):
                # The pools follow the map ahead of the map loop: the shard was
                # removed, not lost.
                self._follower.retire(shard.name)
                continue
            if error is not None:
                failures += 1
                if failures == 1 and isinstance(error, ShardqError):
                    log.error("shard unavailable; retrying", extra={
                        "shard": shard.name, "error": first_line(error)})
                sleep(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            if failures:
                log.warning("shard is back", extra={"shard": shard.name})
                failures = 0
                wake.renew()  # its LISTEN connection may not have survived the outage
            if len(claims) < limit and not lane:
                sleep(self._sleep_time(due_in))

    def _let_go(self, shard: Shard) -> None:
        """Stop serving a shard the map dropped, once its leases here are settled (or a
        lease has passed): its heartbeat, LISTEN connection and completer end. A later
        version that adds it again is served afresh by the map loop."""
        deadline = time.monotonic() + self.config.lease_s
        with self._idle:
            while (any(e.shard.name == shard.name for e in self._inflight.values())
                   and not self._stopping.is_set() and time.monotonic() < deadline):
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            if self._stopping.is_set():
                return  # stop() closes what is left
            self._follower.let_go(shard.name)
            # Closed, not removed: threads that read these without the lock find a
            # closed one (a no-op to set, a refusal to submit to), never a KeyError.
            wake, completer = self._wakes[shard.name], self._completers[shard.name]
            self._gone[shard.name].set()
        completer.close()
        wake.close()
        log.info("no longer serving a shard the map dropped", extra={"shard": shard.name})

    def _claim(
        self, shard: Shard, limit: int, counted: tuple[Counter, Counter, Histogram],
        min_priority: int = 0,
    ) -> tuple[list[Claim], float | None, Exception | None]:
        """One claim of up to `limit` runs (reserved): what it leased, recorded before
        anything else can look, the seconds until the next is due, or why it failed.
        `counted`: the shard's claims, claimed runs and batch sizes."""
        claims: list[Claim] = []
        due_in: float | None = None
        try:
            claims, due_in = self.store.claim(shard, owner=self.config.owner, limit=limit,
                                              lease_s=self.config.lease_s,
                                              min_priority=min_priority,
                                              build=self.config.build_id)
        except ShardqError as exc:
            # The shard is down, read-only, restarting, or holds another map
            # (the process is being stopped for that): one line, not a trace.
            return [], None, exc
        except Exception as exc:
            # A claim loop that died would leave its shard unserved while
            # the process looks healthy: log it and retry like an outage.
            log.exception("claim failed; retrying", extra={"shard": shard.name})
            return [], None, exc
        finally:
            self._claimed(shard, limit, claims, urgent=min_priority > 0)
        claims_made, claimed_runs, batch_sizes = counted
        claims_made.inc()
        claimed_runs.inc(len(claims))
        batch_sizes.observe(len(claims))
        return claims, due_in, None

    def _reserve(
        self, shard: Shard, partial: int | None, backlog: bool
    ) -> tuple[int, int | None]:
        """Take free slots for a claim: (how many, the free slots of a partial batch
        still being waited for).

        Without a backlog (the shard's last claim came back short) the loop
        claims whatever is free at once: the runs that made it look again are
        likely all there is, and waiting for a batch would only delay them.
        Under a backlog of short turns, slots free up many per millisecond, and
        waiting for a full batch of them keeps claims large (a claim statement
        costs the server about as much as several jobs), so while slots keep
        freeing the loop keeps waiting (full batches took about two fifths fewer
        claims and context switches per job than half batches). Turns that hold their threads
        (a long step) free nothing, and a due run must not wait behind them
        while a thread is idle: a partial batch is claimed as soon as a wait of
        COALESCE_S freed no slot. Slots are reserved before the claim, so the
        other shards' loops cannot take the same free slots while this claim is
        out; a claim out longer than CLAIM_STALL_S lends them back (_lend_stalled),
        so one shard that stopped answering cannot hold the others' slots.
        """
        with self._lock:
            self._lend_stalled()
            # Below zero too: turns already claimed may settle past commit_batch.
            free = self._free_slots()
            if free <= 0:
                self._starved.add(shard.name)
                return 0, None
            if backlog and free < self._claim_threshold and (partial is None or free > partial):
                self._coalescing.add(shard.name)
                return 0, free
            limit = min(self.config.batch_size, free)
            self._turning += limit
            self._claiming[shard.name] = Reservation(limit, time.monotonic())
            self._starved.discard(shard.name)
            self._coalescing.discard(shard.name)
            return limit, None

    def _lend_stalled(self) -> None:
        """Give the slots of claims out longer than CLAIM_STALL_S back to the free slots, and
        note when the next one may be (the caller holds the lock).

        A claim to a server that hangs waits for the store to find out (about
        shards.liveness.HUNG_NOTICE_S), and again at each probe of that shard while
        it is down: holding its slots meanwhile would stop every other shard's
        claims. What a lent claim then leases is counted when it answers, so a
        worker may turn up to a batch more runs than its threads for a while;
        those wait in the turn queue with their leases heartbeated.
        """
        now = time.monotonic()
        self._lend_at = None
        for reservation in self._claiming.values():
            if reservation.lent:
                continue
            due = reservation.since + CLAIM_STALL_S
            if now >= due:
                reservation.lent = True
                self._turning -= reservation.slots
            elif self._lend_at is None or due < self._lend_at:
                self._lend_at = due

    def _starved_sleep(self) -> float:
        """How long a loop that found no free slot sleeps: until a slot frees (it is woken),
        a stalled claim's slots may be lent, or the safety poll."""
        with self._lock:
            lend_at = self._lend_at
        if lend_at is None:
            return self.config.poll_interval_s
        return min(self.config.poll_interval_s, max(0.0, lend_at - time.monotonic()) + 0.001)

    def _claimed(self, shard: Shard, reserved: int, claims: list[Claim], *,
                 urgent: bool = False) -> None:
        """Record what a claim leased, before anything else can fail or stop() can look,
        and queue its turns (an urgent claim's ahead of those waiting).

        What it did not use of its reservation is given back (a lent one was given
        back whole: what it leased is counted now), and loops that found no free
        slot meanwhile look again (never this one: woken by its own empty claim,
        an idle loop would spin).
        """
        with self._lock:
            reservation = self._claiming.pop(shard.name, None)
            if reservation is not None and reservation.lent:
                self._turning += len(claims)
            else:
                self._turning -= reserved - len(claims)
            turns: list[TurnItem] = []
            for claim in claims:
                entry = InFlight(shard, claim.execution_id, claim.lease_token,
                                  claim.workflow_name)
                self._inflight[claim.execution_id] = entry
                turns.append((entry, claim))
            starved = self._starved - {shard.name} if len(claims) < reserved else set()
            self._starved -= starved
        if turns:
            self._turns.put_many(turns, first=urgent)
        self._wake(starved)

    def _sleep_time(self, due_in: float | None) -> float:
        """Until the next due task (timer, retry, lease expiry), capped by the safety poll."""
        if due_in is None:
            return self.config.poll_interval_s
        return min(self.config.poll_interval_s, max(0.0, due_in) + 0.001)

    # -- running turns ---------------------------------------------------------

    def _turn_loop(self) -> None:
        while True:
            item = self._turns.get()
            if item is None:
                return
            entry, claim = item
            shard = entry.shard
            refused: StoreRejected | None = None
            try:
                with about_run(claim.execution_id, shard.name, claim.workflow_name):
                    final = self._run_one(entry, claim)
            except CommitRejected as rejected:  # a checkpoint: its turn ends there
                final, refused = rejected.commit, rejected.error
            except Exception:
                log.exception("turn crashed; its lease will expire and another worker retries",
                              extra={"execution_id": str(claim.execution_id),
                                     "shard": shard.name, "workflow": claim.workflow_name})
                final = None
            self._turn_returned(entry, final)
            if final is None:
                continue
            if refused is None:
                # The run stays in flight (its lease heartbeated) until the commit
                # is durable; this thread moves on to the next claimed run.
                self._completers[shard.name].submit_async(
                    final, functools.partial(self._turn_ended, entry, final)
                )
            else:
                self._turn_ended(entry, final, refused)

    def _turn_returned(self, entry: InFlight, final: TurnCommit | None) -> None:
        """A turn thread is free again: wake the claim loops that concerns.

        A turn that left nothing to commit (its lease lost, or it crashed) also
        releases its run here. The wake comes first and always: the loops it
        names were taken off `_starved`, and no later release would name them
        again until a full batch of slots is free.
        """
        with self._lock:
            self._turning -= 1
            self._settling += final is not None
            woken = self._claimers_to_wake()
        self._wake(woken)
        if final is None:
            self._release(entry, settled=False)

    def _run_one(self, entry: InFlight, claim: Claim) -> TurnCommit | None:
        shard = entry.shard
        completer = self._completers[shard.name]

        def checkpoint(commit: TurnCommit) -> CommitOutcome:
            outcome = completer.submit(commit)
            if outcome.landed:
                entry.token = commit.next_token  # read unlocked: see InFlight
            return outcome

        def on_this_shard(target: uuid.UUID) -> bool:
            # By the current map: a target that moved since is queued in the
            # outbox by the commit itself (commit_turns_v2), whichever is older.
            return self.store.map.for_bucket(bucket_of(target)).name == shard.name

        started = time.perf_counter()
        try:
            return run_turn(claim, self.registry, checkpoint, on_this_shard,
                            limits=self.config.limits, rate_slots=self._rate_slots)
        finally:
            TURN_SECONDS.observe(time.perf_counter() - started)

    def _turn_ended(
        self, entry: InFlight, commit: TurnCommit, result: Result, *, replaced: bool = False
    ) -> None:
        """The outcome of a turn's last commit: its ending, or a checkpoint the database refused.

        On the completer's thread, or on the turn's for a refused checkpoint.
        This is the one place a refused commit is handled: the run fails with
        the database's reason, once; should that failing commit be refused too,
        the lease expires and the run is retried rather than replaced forever.
        """
        shard = entry.shard
        if isinstance(result, StoreRejected) and not replaced:
            failure = failing_commit(commit, result)
            self._completers[shard.name].submit_async(
                failure, functools.partial(self._turn_ended, entry, failure, replaced=True)
            )
            return
        if isinstance(result, Exception):
            # The store stayed unavailable through the completer's retries: never
            # blamed on the workflow; the lease expires and the run resumes from
            # its last durable commit.
            _TURN_OUTCOMES["abandoned"].inc()
            log.warning("commit failed; turn abandoned",
                        extra={**entry.log_fields(), "error": str(result)})
            self._release(entry, settled=True)
            return
        if not result.landed:
            _TURN_OUTCOMES["lease_lost"].inc()
            log.warning("lease lost at commit", extra=entry.log_fields())
            self._release(entry, settled=True)
            return
        _TURN_OUTCOMES[commit.state or "running"].inc()
        if commit.task is TaskAction.SCHEDULE or commit.wake_on_signals:
            # A new timer, a retry backoff or a signal that raced the parking:
            # re-read the next due time instead of waiting for a NOTIFY.
            self._wakes[shard.name].set()
        self._release(entry, settled=True)

    def _release(self, entry: InFlight, *, settled: bool) -> None:
        """The end of one claim's turn: its lease is no longer this worker's to keep.
        Only its own entry goes; a newer claim of the same run keeps its own."""
        with self._idle:
            if self._inflight.get(entry.execution_id) is entry:
                del self._inflight[entry.execution_id]
            self._settling -= settled
            woken = self._claimers_to_wake()
            self._idle.notify_all()
        self._wake(woken)

    def _claimers_to_wake(self) -> Collection[str]:
        """Claim loops a change of free slots concerns (the caller holds the lock).

        A freed slot may serve any shard: a worthwhile batch of free slots wakes the
        loops that wait for one (else they look again after COALESCE_S) and those
        that had found none, and the first free slot wakes the latter (else they
        sleep until the safety poll). Not every loop: an idle one has nothing due
        (a NOTIFY or its timer wakes it), and at 64 shards waking all 64 on each
        freed batch put 64 empty claims ahead of the next wake-up's (p99 87-229 ms,
        9.7-14.8 ms now; docs/configuration.md)."""
        free = self._free_slots()
        if free >= self._claim_threshold:
            woken = self._starved | self._coalescing
            self._starved, self._coalescing = set(), set()
            return woken
        if free > 0 and self._starved:
            starved, self._starved = self._starved, set()
            return starved
        return ()

    def _wake(self, names: Collection[str]) -> None:
        for name in names:
            wake = self._wakes.get(name)
            if wake is not None:
                wake.set()

    # -- leases ----------------------------------------------------------------

    def _housekeeping_loop(self) -> None:
        purge_served(self.store, lambda: self.shards,
                     RetentionPlan.of(self.registry, self.config.default_retention_s),
                     self.config.housekeeping_interval_s, self._drained, self._stopping)

    def _held_on(self, shard: Shard) -> list[Lease]:
        with self._lock:
            return [Lease(e.execution_id, e.token) for e in self._inflight.values()
                    if e.shard.name == shard.name]
