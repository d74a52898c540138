"""The Python API for asyncio applications: `Client`'s calls as coroutines.

Every call checks, routes, refuses and answers as `Client`'s does, from the
same definitions: the input rules are core/rules.py's, what a call decides
outside I/O (its parameter objects, how it reads the answers, its errors) is
client/client.py's shared part, the statements store/statements.py's, and a
request a moved bucket refused follows the map by shards.follow.Rerouting.
Only the waiting differs: psycopg's async connections, `asyncio.sleep`.

A task cancelled mid-call leaves no half-written operation and no connection
lent out: each write is one statement (or one transaction) that the server
either commits whole or, cancelled, rolls back, and the connection goes back
to its pool (see store/async_store.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from shardq.client.bulk import AsyncBulkCalls
from shardq.client.flow import agreed_weights, raise_unwritten, rate_change, weight_change
from shardq.client.reading import AsyncReadingCalls
from shardq.client.requests import (
    DEFAULT_TENANT,
    DEFAULT_UPDATE_WAIT,
    PARALLEL_START_MIN,
    DecisionAsked,
    InboxQuery,
    QueryAsked,
    SignalBatch,
    UpdateWait,
    busiest,
    cancel_target,
    check_takes_updates,
    check_update_landed,
    definition_of,
    finished_refuses_update,
    limit_change,
    new_run_state,
    new_runs,
    priority_target,
    run_priority,
    signal_span,
    signalled_start,
    start_batch,
    start_span,
    stored_update,
    tenants_run,
    update_request,
    update_with_start_request,
    validate_update,
)
from shardq.client.schedules import AsyncScheduleCalls
from shardq.core import tracing
from shardq.core.errors import ConcurrencyKeyNotFound, RateLimiterNotFound
from shardq.core.flow import ConcurrencyLimit, RateLimit, RateLimiter, TenantWeights
from shardq.core.models import (
    BufferedSignal,
    DecisionResult,
    Execution,
    HistoryEvent,
    Page,
    PendingInterrupt,
    RunView,
    SignalRequest,
    SignalResult,
    SignalWithStartResult,
    StartResult,
    State,
    UpdateResult,
    WaitInfo,
)
from shardq.core.rules import Limits, check_name, check_page_size
from shardq.shards.async_fanout import each_shard, fan_out, rerouted
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.check import verify_shards
from shardq.shards.config import Shard, ShardMap
from shardq.shards.routing import bucket_for_key, bucket_of, parse_execution_id
from shardq.store.async_store import AsyncStore
from shardq.store.listing import DEFAULT_PAGE, MAX_PAGE, PartialInterruptPage
from shardq.store.params import NewRun, SignalDelivery
from shardq.workflow.contracts import UpdateSpec
from shardq.workflow.rebuild import rebuild_state
from shardq.workflow.registry import Registry, WorkflowDef

R = TypeVar("R")


class AsyncClient(AsyncReadingCalls, AsyncScheduleCalls, AsyncBulkCalls):
    """Entry point for asyncio applications: `Client`'s calls, awaited. Share one per
    event loop; `async with AsyncClient.connect(shard_map, registry) as client:`."""

    def __init__(
        self, store: AsyncStore, registry: Registry, *, limits: Limits | None = None
    ) -> None:
        """A client over `store`, whose pools its owner opens and closes (no I/O here)."""
        self.registry = registry
        self.limits = limits or Limits()
        self.store = store
        self._owned: AsyncShardPools | None = None
        self._verify = False

    @property
    def map(self) -> ShardMap:
        """The map version requests route by now (it follows moves: shards.follow)."""
        return self.store.pools.map

    @classmethod
    def connect(
        cls, shard_map: ShardMap, registry: Registry, *, verify: bool = True,
        limits: Limits | None = None,
    ) -> AsyncClient:
        """A client with pools of its own, opened by `async with` (or `await open()`) and
        closed at its end (or by `await close()`).

        `verify` checks every reachable shard's recorded map and schema on opening and
        raises MapMismatch or SchemaBehind, as `Client.connect` does.
        """
        client = cls(AsyncStore(AsyncShardPools(shard_map)), registry, limits=limits)
        client._verify = verify
        client._owned = client.store.pools
        return client

    async def open(self) -> AsyncClient:
        """Check the shards (unless `verify=False`) and start following the map."""
        if self._owned is None:
            return self
        if self._verify:
            unchecked = self._owned
            checked = await asyncio.to_thread(verify_shards, unchecked.map)
            # The statuses carry the newest map version the seeds hold: routed by it.
            self.store.pools = self._owned = AsyncShardPools(unchecked.map, verified=checked)
            self._verify = False
            await unchecked.close()  # never opened: nothing to wait for
        self._owned.open()
        return self

    async def close(self) -> None:
        """Close the pools `connect` made; a store passed in stays open."""
        if self._owned is not None:
            owned, self._owned = self._owned, None
            await owned.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _routed(self, call: Callable[[ShardMap], Awaitable[R]]) -> R:
        return await rerouted(self.store.pools, call)

    async def _deliver(
        self, tenant: str, signals: Sequence[SignalDelivery]
    ) -> list[SignalResult]:
        async def deliver(shard: Shard, members: list[SignalDelivery]) -> list[SignalResult]:
            return await self.store.deliver_signals(shard, tenant, members)

        return await fan_out(self.store.pools, signals, lambda s: bucket_of(s.target), deliver)

    # -- starting ------------------------------------------------------------

    async def start(
        self, workflow: str | WorkflowDef, workflow_id: str,
        input: Any = None,  # noqa: A002 - the documented API name
        *, tenant: str = DEFAULT_TENANT, priority: int | None = None,
        concurrency: tuple[str, int] | None = None,
    ) -> StartResult:
        """Client.start."""
        return (await self.start_many(workflow, [(workflow_id, input)], tenant=tenant,
                                      priority=priority, concurrency=concurrency))[0]

    async def start_many(
        self, workflow: str | WorkflowDef, items: Sequence[tuple[str, Any]], *,
        tenant: str = DEFAULT_TENANT, priority: int | None = None,
        concurrency: tuple[str, int] | None = None,
    ) -> list[StartResult]:
        """Client.start_many: one commit per shard touched (at once for big batches)."""
        definition = definition_of(self.registry, workflow)
        runs = new_runs(definition, tenant, items, self.limits, concurrency)
        chosen = run_priority(definition, priority)
        with start_span(definition, tenant, len(runs)) as span:
            trace = tracing.traceparent(span)

            async def insert(shard: Shard, members: list[NewRun]) -> list[StartResult]:
                return await self.store.start_executions(
                    shard, start_batch(definition, tenant, members, chosen, trace))

            return await fan_out(self.store.pools, runs, lambda r: r.bucket, insert,
                                 parallel=len(runs) >= PARALLEL_START_MIN)

    # -- flow control: concurrency limits, tenants' weights -----------------------

    async def concurrency_limit(self, key: str) -> ConcurrencyLimit | None:
        """Client.concurrency_limit."""
        checked, _ = limit_change(key, None)
        return await self._routed(lambda m: self.store.concurrency_limit(
            m.for_bucket(bucket_for_key(checked)), checked))

    async def set_concurrency_limit(self, key: str, limit: int | None) -> ConcurrencyLimit:
        """Client.set_concurrency_limit."""
        checked, override = limit_change(key, limit)
        found = await self._routed(lambda m: self.store.set_concurrency_limit(
            m.for_bucket(bucket_for_key(checked)), checked, override))
        if found is None:
            raise ConcurrencyKeyNotFound(checked)
        return found

    async def busiest_concurrency_keys(self, limit: int = 20) -> list[ConcurrencyLimit]:
        """Client.busiest_concurrency_keys."""
        size = check_page_size(limit, MAX_PAGE)
        return busiest([await self.store.busiest_keys(s, size) for s in self.map.shards], size)

    async def rate_limiter(self, name: str) -> RateLimiter | None:
        """Client.rate_limiter."""
        found = await self.store.rate_limiters(self.map.home_shard,
                                               check_name(name, "rate limiter"))
        return found[0] if found else None

    async def rate_limiters(self) -> list[RateLimiter]:
        """Client.rate_limiters."""
        return await self.store.rate_limiters(self.map.home_shard)

    async def set_rate_limit(self, name: str, limit: RateLimit | None) -> RateLimiter:
        """Client.set_rate_limit."""
        checked, chosen = rate_change(name, limit)
        found = await self.store.set_rate_limit(self.map.home_shard, checked, chosen)
        if found is None:
            raise RateLimiterNotFound(checked)
        return found

    async def set_tenant_weight(self, tenant: str, weight: int | None) -> None:
        """Client.set_tenant_weight."""
        checked, chosen = weight_change(tenant, weight)
        reached = await each_shard(self.map.shards, lambda s: self.store.set_tenant_weight(
            s, checked, chosen))
        raise_unwritten(reached, f"the weight of tenant {checked}")

    async def tenant_weights(self) -> TenantWeights:
        """Client.tenant_weights."""
        reached = await each_shard(self.map.shards, self.store.tenant_weights)
        raise_unwritten(reached, "")
        return agreed_weights({s.name: w for s, w in reached.answers.items()})

    # -- reading -------------------------------------------------------------

    async def get(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT
    ) -> Execution:
        """Client.get: the run, or ExecutionNotFound (also for another tenant's run)."""
        ident = parse_execution_id(execution_id)
        found = await self._routed(
            lambda m: self.store.get_execution(m.for_execution(ident), ident))
        return tenants_run(found, ident, tenant)

    async def history(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT
    ) -> list[HistoryEvent]:
        """Client.history."""
        ident = (await self.get(execution_id, tenant=tenant)).id
        return await self._history(ident)

    async def _history(self, ident: uuid.UUID) -> list[HistoryEvent]:
        return await self._routed(
            lambda m: self.store.read_history(m.for_execution(ident), ident))

    async def describe(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
        history: bool = True,
    ) -> RunView:
        """Client.describe: the run, its open wait, its buffered signals, its history."""
        execution = await self.get(execution_id, tenant=tenant)
        ident = execution.id
        found = await self._routed(
            lambda m: self.store.waits_and_signals(m.for_execution(ident), [ident]))
        wait, pending = found[ident]
        events = await self._history(ident) if history else []
        limited = (await self.store.rate_wait_of(self.map.home_shard, ident)
                   if execution.state is State.PENDING else None)
        kids = await self._routed(
            lambda m: self.store.children_of(m.for_execution(ident), ident))
        return RunView(execution, wait, pending, events, limited, kids)

    async def wait(
        self, execution_id: str | uuid.UUID, *, timeout: float = 30.0,
        tenant: str = DEFAULT_TENANT, poll: float = 0.05,
    ) -> Execution:
        """Client.wait: poll until the run is terminal (demos and tests)."""
        deadline = time.monotonic() + timeout
        while True:
            execution = await self.get(execution_id, tenant=tenant)
            if execution.state.terminal:
                return execution
            if time.monotonic() >= deadline:
                raise TimeoutError(f"execution {execution.id} still {execution.state} after "
                                   f"{timeout} s")
            await asyncio.sleep(poll)

    # -- acting on a run -------------------------------------------------------

    async def signal(
        self, execution_id: str | uuid.UUID, name: str, payload: Any = None, *,
        idempotency_key: str | None = None, tenant: str = DEFAULT_TENANT,
    ) -> SignalResult:
        """Client.signal: raises ExecutionNotFound or SignalRefused when the run cannot
        take it."""
        (result,) = await self.signal_many(
            [SignalRequest(execution_id, name, payload, idempotency_key)], tenant=tenant)
        if result.error is not None:
            raise result.error
        return result

    async def signal_many(
        self, signals: Sequence[SignalRequest], *, tenant: str = DEFAULT_TENANT
    ) -> list[SignalResult]:
        """Client.signal_many: one commit per shard touched, results in input order, a
        refused signal carrying its error."""
        return await self._signal_many(signals, tenant, None)

    async def _signal_many(
        self, signals: Sequence[SignalRequest], tenant: str,
        traces: Sequence[str | None] | None,
    ) -> list[SignalResult]:
        """signal_many, each signal carrying `traces[i]` when set (SignalCoalescer: the
        trace of each caller, whose signals share the statement), else the call's."""
        batch = SignalBatch.of(signals, tenant, self.limits)
        candidates = batch.schema_candidates(self.registry)
        if candidates:
            async def read(shard: Shard, members: list[SignalDelivery]) -> list[
                tuple[str, int] | None
            ]:
                found = await self.store.workflows_of(shard, [c.target for c in members])
                return [found.get(c.target) for c in members]

            batch.refuse_by_schema(self.registry, candidates, await fan_out(
                self.store.pools, candidates, lambda c: bucket_of(c.target), read))
        with signal_span(signals, tenant) as span:
            trace = tracing.traceparent(span)
            return batch.answered(await self._deliver(tenant, batch.to_send(trace, traces)))

    async def signal_with_start(
        self, workflow: str | WorkflowDef, workflow_id: str,
        input: Any,  # noqa: A002 - the documented API name
        signal_name: str, payload: Any = None, *, idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT, priority: int | None = None,
    ) -> SignalWithStartResult:
        """Client.signal_with_start: one transaction on the run's shard."""
        request = signalled_start(definition_of(self.registry, workflow), tenant, workflow_id,
                                  input, signal_name=signal_name, payload=payload,
                                  idempotency_key=idempotency_key, limits=self.limits,
                                  priority=priority)
        bucket = request.start.runs[0].bucket
        return await self._routed(
            lambda m: self.store.signal_with_start(m.for_bucket(bucket), request))

    async def cancel(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
        actor: str | None = None,
    ) -> State:
        """Client.cancel: the state right after the call."""
        ident = cancel_target(execution_id, tenant, actor)
        return await self._routed(lambda m: self.store.cancel(
            m.for_execution(ident), ident, tenant=tenant, actor=actor))

    async def set_priority(
        self, execution_id: str | uuid.UUID, priority: int, *, tenant: str = DEFAULT_TENANT,
    ) -> State:
        """Client.set_priority: the run's state."""
        ident, level = priority_target(execution_id, tenant, priority)
        return await self._routed(lambda m: self.store.set_priority(
            m.for_execution(ident), ident, tenant=tenant, priority=level))

    # -- published contracts: interface, queries, updates ---------------------------

    def interface(self, workflow: str) -> dict[str, list[dict[str, Any]]]:
        """Client.interface (no I/O: not a coroutine)."""
        return definition_of(self.registry, workflow).interface()

    async def query(
        self, execution_id: str | uuid.UUID, name: str, argument: Any = None, *,
        tenant: str = DEFAULT_TENANT,
    ) -> Any:
        """Client.query: the handler's answer from the run's committed state."""
        ident = parse_execution_id(execution_id)
        execution = await self.get(ident, tenant=check_name(tenant, "tenant"))
        asked = QueryAsked.checked(self.registry, execution, name, argument, self.limits)
        return asked.answer(await self._history(ident))

    async def update(
        self, execution_id: str | uuid.UUID, name: str, argument: Any = None, *,
        idempotency_key: str | None = None, tenant: str = DEFAULT_TENANT,
        wait: float = DEFAULT_UPDATE_WAIT,
    ) -> UpdateResult:
        """Client.update: the handler's response once committed."""
        ident = parse_execution_id(execution_id)
        execution = await self.get(ident, tenant=check_name(tenant, "tenant"))
        definition = self.registry.get(execution.workflow_name, execution.workflow_version)
        spec, payload_json, key = update_request(definition, name, argument,
                                                 key=idempotency_key, wait=wait,
                                                 limits=self.limits)
        if key is not None:
            earlier = await self._routed(
                lambda m: self.store.signal_by_key(m.for_execution(ident), ident, key))
            if earlier is not None:
                return await self._await_update(ident, spec, *earlier, wait=wait,
                                                accepted=False)
        check_takes_updates(execution)
        history = await self._history(ident) if spec.validator is not None else []
        validate_update(spec, json.loads(payload_json),
                        lambda: rebuild_state(definition, execution, history))
        (result,) = await self._deliver(tenant, [
            SignalDelivery(ident, spec.signal_name, payload_json, key)])
        signal_id, signal_name = stored_update(result)
        return await self._await_update(ident, spec, signal_id, signal_name, wait=wait,
                                        accepted=result.delivered)

    async def update_with_start(
        self, workflow: str | WorkflowDef, workflow_id: str, input: Any,  # noqa: A002
        name: str, argument: Any = None, *, idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT, wait: float = DEFAULT_UPDATE_WAIT,
        priority: int | None = None,
    ) -> UpdateResult:
        """Client.update_with_start: the start and the stored update in one transaction."""
        definition = definition_of(self.registry, workflow)
        check_name(tenant, "tenant")
        spec, run, request = update_with_start_request(
            definition, tenant, workflow_id, input, name=name, argument=argument,
            key=idempotency_key, wait=wait, limits=self.limits, priority=priority)
        key = request.idempotency_key
        found = await self._routed(lambda m: self.store.find_run(
            m.for_bucket(run.bucket), tenant=tenant, workflow_name=definition.name,
            workflow_id=workflow_id, bucket=run.bucket))
        if found is not None and key is not None:
            earlier = await self._routed(
                lambda m: self.store.signal_by_key(m.for_bucket(run.bucket), found, key))
            if earlier is not None:  # a keyed repeat: the recorded answer, nothing checked
                return await self._await_update(found, spec, *earlier, wait=wait,
                                                accepted=False)
        if spec.validator is not None:
            if found is None:
                state = new_run_state(definition, tenant, run)
            else:
                execution = await self.get(found, tenant=tenant)
                state = rebuild_state(definition, execution, await self._history(found))
            validate_update(spec, json.loads(request.payload_json), lambda: state)
        with finished_refuses_update():
            started = await self._routed(
                lambda m: self.store.signal_with_start(m.for_bucket(run.bucket), request))
        assert started.signal_id is not None and started.signal_name is not None
        result = await self._await_update(started.execution_id, spec, started.signal_id,
                                          started.signal_name, wait=wait,
                                          accepted=started.delivered)
        return replace(result, created=started.created)

    async def _await_update(
        self, ident: uuid.UUID, spec: UpdateSpec, update_id: int, stored_name: str, *,
        wait: float, accepted: bool,
    ) -> UpdateResult:
        check_update_landed(spec, stored_name)
        waiting = UpdateWait(ident, update_id, wait, accepted)
        while True:
            outcome, state = await self._routed(
                lambda m: self.store.update_outcome(m.for_execution(ident), ident, update_id))
            result = waiting.answer(outcome, state)
            if result is not None:
                return result
            await asyncio.sleep(waiting.pause())

    # -- human review ------------------------------------------------------------

    async def pending_interrupts(
        self, *, tenant: str = DEFAULT_TENANT, workflow: str | None = None,
        cursor: str | None = None, limit: int = DEFAULT_PAGE, newest_first: bool = False,
        waited_s: float = 0.0, skip_unavailable: bool = False,
    ) -> PartialInterruptPage:
        """Client.pending_interrupts: one page of open interrupts over every shard."""
        inbox = InboxQuery.checked(tenant, workflow, cursor, limit=limit,
                                   newest_first=newest_first, waited_s=waited_s)

        async def read(shard: Shard) -> list[PendingInterrupt]:
            return await self.store.pending_interrupts(shard, **inbox.arguments())

        if skip_unavailable:
            reached = await each_shard(self.map.shards, read)
            return inbox.merged(list(reached.answers.values()), reached)
        return inbox.merged([await read(shard) for shard in self.map.shards])

    async def decide(
        self, execution_id: str | uuid.UUID, interrupt: str, action: str,
        payload: Any = None, *, decision_id: str, actor: str, tenant: str = DEFAULT_TENANT,
    ) -> DecisionResult:
        """Client.decide: resolve the run's open interrupt with one of its actions."""
        asked = DecisionAsked.checked(execution_id, interrupt, action, payload,
                                      decision_id=decision_id, actor=actor, tenant=tenant,
                                      limits=self.limits)
        ident = asked.execution_id

        async def decide(shard_map: ShardMap) -> tuple[str, dict[str, Any] | None, str | None]:
            # Read and decision by the same map, as Client.decide.
            shard = shard_map.for_execution(ident)
            found = await self.store.open_interrupt(shard, ident, interrupt)
            return await self.store.decide_interrupt(shard, asked.decision(found))

        return asked.result(*await self._routed(decide))

    async def waiting(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[WaitInfo | None, list[BufferedSignal]]:
        """Client.waiting: the run's open wait (None: none) and its buffered signals."""
        view = await self.describe(execution_id, tenant=tenant, history=False)
        return view.wait, view.pending

    async def waiting_on_page(
        self, page: Page
    ) -> dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]]:
        """Client.waiting_on_page: `waiting` for every run of a `list_runs` page, two
        statements per shard."""
        async def read(shard: Shard, runs: list[Execution]) -> list[
            tuple[WaitInfo | None, list[BufferedSignal]]
        ]:
            found = await self.store.waits_and_signals(shard, [e.id for e in runs])
            return [found[e.id] for e in runs]

        answers = await fan_out(self.store.pools, page.items, lambda e: bucket_of(e.id), read)
        return {e.id: answer for e, answer in zip(page.items, answers, strict=True)}
