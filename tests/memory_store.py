"""MemoryStore: an in-memory WorkerStore for unit tests of the worker's parts.

It keeps, per run, what the worker's cycle touches: the run (its workflow,
priority and history) and its task row (due time, priority, claims, lease
token, owner and expiry). Time is the fake's own clock, moved by `advance`,
the way the real store's time is the database's now() compared with stored
times. Each method mirrors the statement store/store.py runs, and
tests/store/test_conformance.py runs one table of behaviours against both, so
a difference shows up there rather than in a unit test that trusted the fake.

Deliberate simplifications (what the worker's unit tests do not need):
- One lock-free thread of use: no SKIP LOCKED, no concurrent claims or
  commits; a test that needs races belongs on PostgreSQL.
- The map's every shard shares one set of tables: `shard` is accepted and
  ignored, and no bucket is ever frozen by a move (the real store's
  unclean_writable filter is always NULL here).
- No signals, waits beyond the one a commit opens, outbox, cancellation or
  timeout grants: a commit with `externals` or `outbox` raises, parking on
  signals (`wake_on_signals`) never finds one pending, `cancel_requested`
  is always False, and a step is not folded into its run's outcome event.
- next_due_in looks at every task, not the first 1,000 of the due index.
- The purge lock is a flag (`purger_busy`), not an advisory lock.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shardq.core.flow import RateLimit
from shardq.core.models import (
    Claim,
    CommitOutcome,
    HistoryEvent,
    OpenWait,
    State,
    TaskAction,
    TurnCommit,
)
from shardq.shards.config import Shard, ShardMap
from shardq.shards.routing import new_execution_id
from shardq.store.params import Lease

_FINISHED = (State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMED_OUT)


@dataclass
class _Run:
    tenant: str
    workflow_name: str
    workflow_version: int
    workflow_id: str
    input: Any
    priority: int
    history: list[HistoryEvent] = field(default_factory=list)
    wait: OpenWait | None = None
    finished_at: datetime | None = None
    """When its `run.<state>` outcome event was recorded; None while it lives."""


@dataclass
class _Task:
    run_at: datetime
    priority: int
    claims: int = 0
    lease_token: uuid.UUID | None = None
    lease_owner: str | None = None
    leased_until: datetime | None = None


class MemoryStore:
    """A WorkerStore in dictionaries (see the module's docstring for what it leaves out)."""

    def __init__(self, shard_map: ShardMap | None = None) -> None:
        self._map = shard_map or ShardMap.from_urls(["postgresql://memory.invalid/shard0"])
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.runs: dict[uuid.UUID, _Run] = {}
        self.tasks: dict[uuid.UUID, _Task] = {}
        self.purger_busy = False
        """True: another purger holds the shard (purge_batch answers None)."""
        self.rate_limits: dict[str, RateLimit] = {}
        self._seq = itertools.count(1)
        # Insertion order breaks ties of run_at: the fake's clock stands still
        # between calls, where the database's now() would have moved on.
        self._order: dict[uuid.UUID, int] = {}

    # -- the test's handles ----------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock on: what ageing the stored times does to the real store."""
        self.now += timedelta(seconds=seconds)

    def start(
        self, workflow_id: str, *, workflow: str = "job", priority: int = 0,
        tenant: str = "default", input: Any = None,  # noqa: A002 - start_executions' name
    ) -> uuid.UUID:
        """A new run with its first task due now, as start_executions inserts it."""
        execution_id = new_execution_id(0)
        self.runs[execution_id] = _Run(tenant, workflow, 1, workflow_id, input, priority)
        self.tasks[execution_id] = _Task(run_at=self.now, priority=priority)
        self._order[execution_id] = len(self._order)
        return execution_id

    # -- WorkerStore -------------------------------------------------------------

    @property
    def map(self) -> ShardMap:
        return self._map

    def claim(
        self, shard: Shard, *, owner: str, limit: int, lease_s: float, min_priority: int = 0,
        build: str | None = None,
    ) -> tuple[list[Claim], float | None]:
        # No run here is pinned to a build (schema/0026): any worker's claim takes them.
        due = [(i, t) for i, t in self.tasks.items() if self._claimable(t)
               and (min_priority <= 0 or t.priority >= min_priority)]
        due.sort(key=lambda it: (-it[1].priority, it[1].run_at, self._order[it[0]]))
        claims = [self._lease(i, t, owner, lease_s) for i, t in due[:limit]]
        return claims, self._next_due_in(len(claims) >= limit)

    def extend_leases(
        self, shard: Shard, leases: Sequence[Lease], lease_s: float
    ) -> set[uuid.UUID]:
        done = set()
        for lease in self._held(leases):
            task = self.tasks[lease.execution_id]
            # run_at moves too, as in the real statement (it keeps the task off
            # the head of the due index); only the token is checked, not expiry.
            task.leased_until = task.run_at = self.now + timedelta(seconds=lease_s)
            done.add(lease.execution_id)
        return done

    def release_leases(self, shard: Shard, leases: Sequence[Lease]) -> set[uuid.UUID]:
        done = set()
        for lease in self._held(leases):
            task = self.tasks[lease.execution_id]
            task.run_at, task.lease_token, task.lease_owner, task.leased_until = (
                self.now, None, None, None)
            done.add(lease.execution_id)
        return done

    def commit_turns(
        self, shard: Shard, commits: Sequence[TurnCommit], *, lease_s: float
    ) -> dict[uuid.UUID, CommitOutcome]:
        if len({c.execution_id for c in commits}) != len(commits):
            raise ValueError("commit_turns takes at most one commit per execution")
        for c in commits:
            if c.externals or c.outbox:
                raise NotImplementedError("MemoryStore does not model signals to other runs")
        return {c.execution_id: self._commit(c) for c in commits}

    def landed_commits(self, shard: Shard, commits: Sequence[TurnCommit]) -> set[uuid.UUID]:
        # As the real query: whatever no longer finds its token on a task row,
        # which includes a commit whose lease was lost to another claim.
        return {c.execution_id for c in commits
                if not self._holds(c.execution_id, c.lease_token)}

    def purge_idle_keys(self, shard: Shard, *, idle_s: float, limit: int) -> int:
        return 0  # the fake keeps no concurrency keys: it admits every run

    def fold_run_counts(self, shard: Shard) -> int:
        return 0  # the fake keeps no counters: nothing reads them

    def take_rate_slot(self, shard: Shard, limiter: str, *, run: uuid.UUID, position: int,
                       attempt: int, park_after: float) -> float | None:
        return 0.0 if limiter in self.rate_limits else None  # the fake never limits

    def declare_rate_limiters(self, shard: Shard, limits: Mapping[str, RateLimit]) -> None:
        self.rate_limits.update(limits)

    def purge_batch(
        self, shard: Shard, *, retention_s: float, workflows: Sequence[str], listed: bool,
        limit: int,
    ) -> int | None:
        if self.purger_busy:
            return None
        cutoff = self.now - timedelta(seconds=retention_s)
        doomed = sorted(
            (run.finished_at, i) for i, run in self.runs.items()
            if run.finished_at is not None and run.finished_at < cutoff
            and (run.workflow_name in workflows) == listed
        )[:limit]
        for _, i in doomed:
            del self.runs[i]
            self.tasks.pop(i, None)
        return len(doomed)

    # -- inside ----------------------------------------------------------------

    def _claimable(self, task: _Task) -> bool:
        return task.run_at <= self.now and (
            task.leased_until is None or task.leased_until <= self.now)

    def _holds(self, execution_id: uuid.UUID, token: uuid.UUID) -> bool:
        task = self.tasks.get(execution_id)
        return task is not None and task.lease_token == token

    def _held(self, leases: Sequence[Lease]) -> list[Lease]:
        return [x for x in leases if self._holds(x.execution_id, x.token)]

    def _lease(self, execution_id: uuid.UUID, task: _Task, owner: str, lease_s: float) -> Claim:
        task.lease_token, task.lease_owner = uuid.uuid4(), owner
        task.leased_until = self.now + timedelta(seconds=lease_s)
        task.claims += 1
        run = self.runs[execution_id]
        return Claim(
            execution_id=execution_id, lease_token=task.lease_token, claims=task.claims,
            tenant=run.tenant, workflow_name=run.workflow_name,
            workflow_version=run.workflow_version, workflow_id=run.workflow_id,
            input=run.input, cancel_requested=False, db_now=self.now,
            # A first claim has nothing to replay: the real claim skips the read.
            history=() if task.claims == 1 else tuple(run.history), signals=(),
        )

    def _next_due_in(self, full: bool) -> float | None:
        if full:
            return 0.0  # a full batch: more may be due now
        future = [t.run_at for t in self.tasks.values() if t.run_at > self.now]
        # Due rows: a live lease's expiry, or (unleased, left by min_priority) now or before.
        head = [t.leased_until or t.run_at for t in self.tasks.values() if t.run_at <= self.now]
        first = min(future + head, default=None)
        return None if first is None else (first - self.now).total_seconds()

    def _commit(self, c: TurnCommit) -> CommitOutcome:
        if not self._holds(c.execution_id, c.lease_token):
            return CommitOutcome(landed=False)  # lease lost: nothing is written
        run, task = self.runs[c.execution_id], self.tasks[c.execution_id]
        for e in c.events:
            payload = dict(e.payload)
            if e.wake_in is not None:
                payload["wake_at"] = (self.now + timedelta(seconds=e.wake_in)).isoformat()
            run.history.append(HistoryEvent(next(self._seq), e.position, e.kind, e.name,
                                            payload, self.now))
        if c.close_wait and c.open_wait is None:
            run.wait = None
        if c.open_wait is not None:
            run.wait = c.open_wait
        if c.state in _FINISHED:
            payload = ({"output": None if c.output_json is None else json.loads(c.output_json)}
                       if c.state == State.COMPLETED else {"error": c.error})
            run.history.append(HistoryEvent(next(self._seq), None, f"run.{c.state}", "run",
                                            payload, self.now))
            run.finished_at = self.now
        if c.task == TaskAction.KEEP:
            task.lease_token = c.next_token  # a checkpoint rotates the token, keeps the expiry
        elif c.task == TaskAction.SCHEDULE:
            task.lease_token, task.lease_owner, task.leased_until = None, None, None
            task.run_at = self.now + timedelta(seconds=c.delay)
        else:
            del self.tasks[c.execution_id]
            # A run parked with no wait left (a decision closed it meanwhile) stays due.
            if c.state in (State.WAITING, State.INPUT_REQUIRED) and run.wait is None:
                self.tasks[c.execution_id] = _Task(run_at=self.now, priority=run.priority,
                                                   claims=1)
        return CommitOutcome(landed=True)
