"""The store for asyncio callers: the sync Store's operations over psycopg's async pools.

Each operation is store/statements.py's (statement, parameters, parsing: one
definition, which the sync Store runs too), driven here over the shard's pool
in shards/async_pools.py; only the waiting differs. tests/unit/test_sync_async.py
holds the two stores (and the two clients, the two pools) to one shape.

Cancelling a task mid-call leaves no half-written operation: psycopg cancels the
running statement in the server and waits for it to end (a statement is its own
transaction, or runs inside one that the exit rolls back), and the connection
goes back to its pool idle.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from shardq.core.attributes import AttributeFilter
from shardq.core.children import ChildInfo
from shardq.core.flow import ConcurrencyLimit, RateLimit, RateLimiter, RateWait
from shardq.core.models import (
    BufferedSignal,
    Execution,
    HistoryEvent,
    OutboxEntry,
    PendingInterrupt,
    SignalResult,
    SignalWithStartResult,
    StartResult,
    State,
    WaitInfo,
)
from shardq.core.schedules import Schedule, ScheduleSpec
from shardq.shards.async_pools import AsyncDictConnection, AsyncShardPools
from shardq.shards.config import Shard, ShardMap
from shardq.store import listing, statements
from shardq.store import schedule_statements as schedule_ops
from shardq.store.params import InterruptDecision, SignalDelivery, StartBatch, StartSignalled
from shardq.store.statements import LOCKED_RUN_ATTEMPTS, Op, _TaskAppeared, buckets_of, run_async

if TYPE_CHECKING:
    import uuid


log = logging.getLogger(__name__)

R = TypeVar("R")


class AsyncStore:
    """The operations the clients use, as coroutines; the sync Store's definitions."""

    def __init__(self, pools: AsyncShardPools) -> None:
        self.pools = pools

    @property
    def map(self) -> ShardMap:
        return self.pools.map

    @asynccontextmanager
    async def connection(self, shard: Shard) -> AsyncIterator[AsyncDictConnection]:
        """An autocommit connection to `shard`; driver errors as the sync Store words them."""
        try:
            async with self.pools.connection(shard) as conn:
                try:
                    yield conn
                except psycopg.Error as exc:
                    mapped = statements.translated(shard, exc)
                    if mapped is None:
                        raise
                    raise mapped from exc
        except psycopg.Error as exc:
            raise statements.unmapped(shard, exc) from exc

    async def _run(self, shard: Shard, op: Op[R]) -> R:
        async with self.connection(shard) as conn:
            return await run_async(conn, op)

    async def start_executions(self, shard: Shard, batch: StartBatch) -> list[StartResult]:
        return await self._run(shard, statements.start_executions(batch))

    async def get_execution(self, shard: Shard, execution_id: uuid.UUID) -> Execution | None:
        return await self._run(shard, statements.get_execution(execution_id))

    async def read_history(self, shard: Shard, execution_id: uuid.UUID) -> list[HistoryEvent]:
        return await self._run(shard, statements.read_history(execution_id))

    async def list_executions(
        self, shard: Shard, query: listing.ListQuery, *, rows: int | None = None,
        shard_map: ShardMap | None = None,
    ) -> listing.ShardPage:
        return await self._run(shard, statements.list_executions(
            query, buckets_of(shard_map or self.map, shard), rows))

    async def executions_of(self, shard: Shard, ids: Sequence[uuid.UUID]) -> list[Execution]:
        return await self._run(shard, statements.executions_of(ids))

    async def waits_and_signals(
        self, shard: Shard, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]]:
        return await self._run(shard, statements.waits_and_signals(ids))

    async def workflows_of(
        self, shard: Shard, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[str, int]]:
        return await self._run(shard, statements.workflows_of(ids))

    async def find_run(
        self, shard: Shard, *, tenant: str, workflow_name: str, workflow_id: str, bucket: int
    ) -> uuid.UUID | None:
        return await self._run(shard, statements.find_run(
            tenant=tenant, workflow_name=workflow_name, workflow_id=workflow_id, bucket=bucket))

    async def concurrency_limit(self, shard: Shard, key: str) -> ConcurrencyLimit | None:
        return await self._run(shard, statements.concurrency_limit(key))

    async def set_concurrency_limit(self, shard: Shard, key: str,
                                    override: int | None) -> ConcurrencyLimit | None:
        return await self._run(shard, statements.set_concurrency_limit(key, override))

    async def busiest_keys(self, shard: Shard, limit: int) -> list[ConcurrencyLimit]:
        return await self._run(shard, statements.busiest_keys(self.map, shard, limit))

    async def rate_limiters(self, shard: Shard, name: str | None = None) -> list[RateLimiter]:
        return await self._run(shard, statements.rate_limiters(name))

    async def set_rate_limit(self, shard: Shard, name: str,
                             limit: RateLimit | None) -> RateLimiter | None:
        return await self._run(shard, statements.set_rate_limit(name, limit))

    async def count_runs(
        self, shard: Shard, *, tenant: str | None, workflow: str | None,
        where: tuple[AttributeFilter, ...] = (), shard_map: ShardMap | None = None,
    ) -> list[tuple[str, str, int]]:
        return await self._run(shard, statements.count_runs(
            tenant, workflow, where, buckets_of(shard_map or self.map, shard) if where else ""))

    async def outbox_of(self, shard: Shard, execution_id: uuid.UUID,
                        tenant: str) -> list[OutboxEntry]:
        return await self._run(shard, statements.outbox_of(execution_id, tenant))

    async def children_of(self, shard: Shard, execution_id: uuid.UUID) -> list[ChildInfo]:
        return await self._run(shard, statements.children_of(execution_id))

    async def create_schedule(self, tenant: str, spec: ScheduleSpec) -> Schedule:
        return await self._run(self.map.home_shard, schedule_ops.create_schedule(tenant, spec))

    async def schedules(self, *, tenant: str | None, name: str | None = None,
                        after: str = "", limit: int = 100) -> list[Schedule]:
        return await self._run(self.map.home_shard, schedule_ops.schedules(
            tenant=tenant, name=name, after=after, limit=limit))

    async def change_schedule(self, tenant: str, name: str, action: str) -> Schedule | None:
        return await self._run(self.map.home_shard,
                               schedule_ops.change_schedule(tenant, name, action))

    async def rate_wait_of(self, shard: Shard, execution_id: uuid.UUID) -> RateWait | None:
        return await self._run(shard, statements.rate_wait_of(execution_id))

    async def tenant_weights(self, shard: Shard) -> dict[str, int]:
        return await self._run(shard, statements.tenant_weights())

    async def set_tenant_weight(self, shard: Shard, tenant: str, weight: int | None) -> None:
        await self._run(shard, statements.set_tenant_weight(tenant, weight))

    async def deliver_signals(
        self, shard: Shard, tenant: str, signals: Sequence[SignalDelivery]
    ) -> list[SignalResult]:
        return await self._run(shard, statements.deliver_signals(tenant, signals))

    async def signal_with_start(
        self, shard: Shard, request: StartSignalled
    ) -> SignalWithStartResult:
        return await self._run(shard, statements.signal_with_start(request))

    async def signal_by_key(
        self, shard: Shard, execution_id: uuid.UUID, key: str
    ) -> tuple[int, str] | None:
        return await self._run(shard, statements.signal_by_key(execution_id, key))

    async def update_outcome(
        self, shard: Shard, execution_id: uuid.UUID, update_id: int
    ) -> tuple[dict[str, Any] | None, State | None]:
        return await self._run(shard, statements.update_outcome(execution_id, update_id))

    async def open_interrupt(
        self, shard: Shard, execution_id: uuid.UUID, name: str
    ) -> tuple[str, int | None, dict[str, Any] | None] | None:
        return await self._run(shard, statements.open_interrupt(execution_id, name))

    async def decide_interrupt(
        self, shard: Shard, decision: InterruptDecision
    ) -> tuple[str, dict[str, Any] | None, str | None]:
        return await self._run(shard, statements.decide_interrupt(decision))

    async def pending_interrupts(
        self, shard: Shard, *, tenant: str, workflow: str | None,
        after: tuple[datetime, uuid.UUID] | None, limit: int, newest_first: bool = False,
        waited_s: float = 0.0,
    ) -> list[PendingInterrupt]:
        return await self._run(shard, statements.pending_interrupts(
            mine=buckets_of(self.map, shard), tenant=tenant, workflow=workflow, after=after,
            limit=limit, newest_first=newest_first, waited_s=waited_s))

    async def cancel(
        self, shard: Shard, execution_id: uuid.UUID, *, tenant: str, actor: str | None = None
    ) -> State:
        """As Store.cancel."""
        return await self._locking(shard, execution_id, "cancel", lambda: statements.cancel_attempt(
            execution_id, tenant=tenant, actor=actor))

    async def set_priority(
        self, shard: Shard, execution_id: uuid.UUID, *, tenant: str, priority: int
    ) -> State:
        """As Store.set_priority."""
        return await self._locking(shard, execution_id, "a priority change",
                                   lambda: statements.set_priority_attempt(
                                       execution_id, tenant=tenant, priority=priority))

    async def _locking(self, shard: Shard, execution_id: uuid.UUID, what: str,
                       attempt: Callable[[], Op[State]]) -> State:
        """As Store._locking: each try one transaction, started again when the run became
        due between its two locks."""
        for _ in range(LOCKED_RUN_ATTEMPTS):
            try:
                async with self.connection(shard) as conn, conn.transaction():
                    return await run_async(conn, attempt())
            except _TaskAppeared:
                continue
        raise statements.kept_changing(shard.name, execution_id, what)
