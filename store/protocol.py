"""What the worker needs of a store: the `WorkerStore` protocol.

The worker's parts (worker/worker.py, completer.py, leases.py, retention.py)
call only these methods of store/store.py's `Store`. Typed against this
protocol instead of the concrete class, they can be unit-tested on an
in-memory fake (tests/memory_store.py), and tests/store/test_conformance.py
runs one table of behaviours against both the real store and the fake, so
the fake cannot drift from what PostgreSQL does.

A structural protocol, not a base class: `Store` is not changed to inherit
from it, mypy checks that it fits wherever one is passed as a WorkerStore.
Only the worker's side is here; the clients' and the operators' calls stay on
`Store` (a fake of those would be much larger and is not needed yet).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from shardq.core.flow import RateLimit
from shardq.core.models import Claim, CommitOutcome, StartResult, State, TurnCommit
from shardq.core.schedules import DueSchedule, Plan
from shardq.shards.config import Shard, ShardMap
from shardq.store.params import Lease, StartBatch


class WorkerStore(Protocol):
    """The claim -> heartbeat -> commit -> purge cycle of a worker, per shard.

    The semantics every implementation must keep are those of `Store`, and the
    conformance table (tests/store/test_conformance.py) spells them out row by row.
    """

    @property
    def map(self) -> ShardMap:
        """The shard map to route by now (it follows newer versions)."""
        ...

    def claim(
        self, shard: Shard, *, owner: str, limit: int, lease_s: float, min_priority: int = 0,
        build: str | None = None,
    ) -> tuple[list[Claim], float | None]:
        """Lease up to `limit` due tasks, higher priority first (only priority >=
        `min_priority` when it is above 0), unpinned or pinned to `build`; also the
        seconds until the next is due."""
        ...

    def extend_leases(
        self, shard: Shard, leases: Sequence[Lease], lease_s: float
    ) -> set[uuid.UUID]:
        """Push back the expiry of leases still held by these tokens; the ids extended."""
        ...

    def release_leases(self, shard: Shard, leases: Sequence[Lease]) -> set[uuid.UUID]:
        """Make leased tasks due now; the ids released."""
        ...

    def commit_turns(
        self, shard: Shard, commits: Sequence[TurnCommit], *, lease_s: float
    ) -> dict[uuid.UUID, CommitOutcome]:
        """Apply turn commits, each fenced by its lease token; an outcome per commit."""
        ...

    def landed_commits(self, shard: Shard, commits: Sequence[TurnCommit]) -> set[uuid.UUID]:
        """Which of `commits` no longer find their token on a task row (asked after a
        connection broke mid-commit)."""
        ...

    def purge_batch(
        self, shard: Shard, *, retention_s: float, workflows: Sequence[str], listed: bool,
        limit: int,
    ) -> int | None:
        """Delete up to `limit` finished runs past retention; how many, or None when
        another purger holds the shard."""
        ...

    def purge_idle_keys(self, shard: Shard, *, idle_s: float, limit: int) -> int:
        """Delete up to `limit` concurrency keys idle for `idle_s` (no slot held, no run
        waiting, no operator limit); how many."""
        ...

    def fold_run_counts(self, shard: Shard) -> int:
        """Fold the shard's appended count changes into its counters; how many."""
        ...

    def take_rate_slot(self, shard: Shard, limiter: str, *, run: uuid.UUID, position: int,
                       attempt: int, park_after: float) -> float | None:
        """Seconds until a step's call may start under `limiter` (asked of the home shard;
        a wait over `park_after` is kept for the call); None when no such limiter is
        there yet."""
        ...

    def declare_rate_limiters(self, shard: Shard, limits: Mapping[str, RateLimit]) -> None:
        """Write the limiters workflow code declares (the home shard)."""
        ...


@runtime_checkable
class TickerStore(Protocol):
    """What a worker's schedule ticker needs (worker/ticker.py): `Store` has it, the
    in-memory fake does not (a worker on it runs no ticker)."""

    @property
    def map(self) -> ShardMap: ...

    def claim_schedules(self, limit: int) -> AbstractContextManager[
        tuple[list[DueSchedule], Callable[[str, Plan, Any], None]]]: ...

    def next_schedule_in(self) -> float | None: ...

    def run_states(self, shard: Shard, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, State]: ...

    def start_executions(self, shard: Shard, batch: StartBatch) -> list[StartResult]: ...
