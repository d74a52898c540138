"""The Python API for applications: start, signal, cancel, get, list, history."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from shardq.client.builds import BuildCalls
from shardq.client.bulk import BulkCalls
from shardq.client.flow import FlowControlCalls
from shardq.client.reading import ReadingCalls
from shardq.client.requests import (
    DEFAULT_TENANT,
    DEFAULT_UPDATE_WAIT,
    PARALLEL_START_MIN,
    DecisionAsked,
    InboxQuery,
    QueryAsked,
    SignalBatch,
    UpdateWait,
    cancel_target,
    check_takes_updates,
    check_update_landed,
    definition_of,
    finished_refuses_update,
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
from shardq.client.schedules import ScheduleCalls
from shardq.core import tracing
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
from shardq.core.rules import (
    Limits,
    check_name,
)
from shardq.shards.check import verify_shards
from shardq.shards.config import Shard, ShardMap
from shardq.shards.fanout import each_shard, fan_out
from shardq.shards.follow import rerouted
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_of, parse_execution_id
from shardq.store.listing import (
    DEFAULT_PAGE,
    PartialInterruptPage,
)
from shardq.store.params import (
    NewRun,
    SignalDelivery,
)
from shardq.store.store import Store
from shardq.workflow.contracts import UpdateSpec
from shardq.workflow.rebuild import rebuild_state
from shardq.workflow.registry import Registry, WorkflowDef

R = TypeVar("R")

class Client(ReadingCalls, FlowControlCalls, ScheduleCalls, BuildCalls, BulkCalls):
    """Entry point for applications. Thread-safe; share one per process.

    Every call routes by execution id or workflow key to one shard; the reads of many
    runs (client/reading.py: list_runs, count_runs) and the operators' calls read every
    shard.
    """

    def __init__(
        self, store: Store, registry: Registry, *, limits: Limits | None = None
    ) -> None:
        """A client over `store`, whose pools its owner opens and closes (no I/O here).

        `limits` bounds inputs, payloads and idempotency keys (see `Limits`).
        `Client.connect` opens a store of its own for a process that has none.
        """
        self.registry = registry
        self.limits = limits or Limits()
        self.store = store
        self._owned: ShardPools | None = None

    @property
    def map(self) -> ShardMap:
        """The map version requests route by now (it follows moves: shards.follow)."""
        return self.store.pools.map

    def _routed(self, call: Callable[[ShardMap], R]) -> R:
        """`call(current map)`, made again by the map a refusal leads to when the shard
        it routed to refused it for a moved bucket (shards.follow.rerouted)."""
        return rerouted(self.store.pools, call)

    def _deliver(self, tenant: str, signals: Sequence[SignalDelivery]) -> list[SignalResult]:
        """One tenant's signals, one commit per shard (shardq.deliver_signals), a shard's
        signals sent again where the map now says when a move refused them."""
        return fan_out(self.store.pools, signals, lambda s: bucket_of(s.target),
                       lambda shard, members: self.store.deliver_signals(shard, tenant, members))

    @classmethod
    def connect(
        cls, shard_map: ShardMap, registry: Registry, *, verify: bool = True,
        limits: Limits | None = None,
    ) -> Client:
        """A client with pools of its own, closed by `close()` (or the `with` block).

        `verify` checks every reachable shard's recorded map and schema first
        and raises MapMismatch or SchemaBehind, so a misconfigured process
        refuses to start.
        """
        checked = verify_shards(shard_map) if verify else []
        # The statuses carry the newest map version the seeds hold: routed by it from the start.
        pools = ShardPools(shard_map, verified=checked).open()
        client = cls(Store(pools), registry, limits=limits)
        client._owned = pools
        return client

    def close(self) -> None:
        """Close the pools `connect` opened; a store passed in stays open."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- starting ------------------------------------------------------------

    def start(
        self, workflow: str | WorkflowDef, workflow_id: str,
        input: Any = None,  # noqa: A002 - the documented API name
        *, tenant: str = DEFAULT_TENANT, priority: int | None = None,
        concurrency: tuple[str, int] | None = None,
    ) -> StartResult:
        """Start a run, or return the existing run of this workflow_id (`created=False`).

        `priority` (0-9, higher claimed first; default: the workflow's) is the run's for
        its whole life, every turn a signal, a decision or a timer wakes included.
        `concurrency` (key, limit; default: the workflow's): docs/flow-control.md."""
        return self.start_many(workflow, [(workflow_id, input)], tenant=tenant,
                               priority=priority, concurrency=concurrency)[0]

    def start_many(
        self, workflow: str | WorkflowDef, items: Sequence[tuple[str, Any]], *,
        tenant: str = DEFAULT_TENANT, priority: int | None = None,
        concurrency: tuple[str, int] | None = None,
    ) -> list[StartResult]:
        """Start many runs of one workflow: one commit per shard touched. Idempotent per key."""
        definition = definition_of(self.registry, workflow)
        runs = new_runs(definition, tenant, items, self.limits, concurrency)
        chosen = run_priority(definition, priority)
        with start_span(definition, tenant, len(runs)) as span:
            trace = tracing.traceparent(span)

            def insert(shard: Shard, members: list[NewRun]) -> list[StartResult]:
                return self.store.start_executions(
                    shard, start_batch(definition, tenant, members, chosen, trace))

            # Big batches: the shards' commits overlap instead of queueing.
            return fan_out(self.store.pools, runs, lambda r: r.bucket, insert,
                           parallel=len(runs) >= PARALLEL_START_MIN)

    # -- reading -------------------------------------------------------------

    def get(self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT) -> Execution:
        """The run, or ExecutionNotFound (also for another tenant's run)."""
        ident = parse_execution_id(execution_id)
        found = self._routed(lambda m: self.store.get_execution(m.for_execution(ident), ident))
        return tenants_run(found, ident, tenant)

    def history(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT
    ) -> list[HistoryEvent]:
        ident = self.get(execution_id, tenant=tenant).id
        return self._history(ident)

    def _history(self, ident: uuid.UUID) -> list[HistoryEvent]:
        return self._routed(lambda m: self.store.read_history(m.for_execution(ident), ident))

    def waiting(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[WaitInfo | None, list[BufferedSignal]]:
        """The run's open wait (None when it waits for nothing) and its buffered signals."""
        view = self.describe(execution_id, tenant=tenant, history=False)
        return view.wait, view.pending

    def describe(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
        history: bool = True,
    ) -> RunView:
        """The run, its open wait, its buffered signals and (unless `history=False`) its
        history: the tenant checked once, four statements."""
        execution = self.get(execution_id, tenant=tenant)
        ident = execution.id
        wait, pending = self._routed(
            lambda m: self.store.waits_and_signals(m.for_execution(ident), [ident]))[ident]
        events = self._history(ident) if history else []
        # A pending run may be parked for a rate limiter's slot, which the home shard keeps.
        limited = (self.store.rate_wait_of(self.map.home_shard, ident)
                   if execution.state is State.PENDING else None)
        kids = self._routed(lambda m: self.store.children_of(m.for_execution(ident), ident))
        return RunView(execution, wait, pending, events, limited, kids)

    def waiting_on_page(
        self, page: Page
    ) -> dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]]:
        """`waiting` for every run of a `list_runs` page (already the caller's tenant's):
        two statements per shard, not per run."""
        def read(shard: Shard, runs: list[Execution]) -> list[
            tuple[WaitInfo | None, list[BufferedSignal]]
        ]:
            found = self.store.waits_and_signals(shard, [e.id for e in runs])
            return [found[e.id] for e in runs]

        answers = fan_out(self.store.pools, page.items, lambda e: bucket_of(e.id), read)
        return {e.id: answer for e, answer in zip(page.items, answers, strict=True)}

    def wait(
        self, execution_id: str | uuid.UUID, *, timeout: float = 30.0,
        tenant: str = DEFAULT_TENANT, poll: float = 0.05,
    ) -> Execution:
        """Poll until the run reaches a terminal state (demos and tests); TimeoutError after."""
        deadline = time.monotonic() + timeout
        while True:
            execution = self.get(execution_id, tenant=tenant)
            if execution.state.terminal:
                return execution
            if time.monotonic() >= deadline:
                raise TimeoutError(f"execution {execution.id} still {execution.state} after "
                                   f"{timeout} s")
            time.sleep(poll)

    # -- acting on a run -------------------------------------------------------

    def signal(
        self,
        execution_id: str | uuid.UUID,
        name: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> SignalResult:
        """Deliver a named message; buffered if the run is not waiting for it yet.

        With an idempotency key, repeats collapse into the first delivery and come
        back `delivered=False` (even after the run finished). Raises
        ExecutionNotFound or SignalRefused when the run cannot take it.
        """
        (result,) = self.signal_many(
            [SignalRequest(execution_id, name, payload, idempotency_key)], tenant=tenant
        )
        if result.error is not None:
            raise result.error
        return result

    def signal_many(
        self, signals: Sequence[SignalRequest], *, tenant: str = DEFAULT_TENANT
    ) -> list[SignalResult]:
        """Deliver many signals: one commit per shard touched, results in input order.

        A signal that cannot be taken comes back with `error` set while the others
        land: a bad name, payload or key, or a bound it exceeds (InvalidArgument),
        refused before anything is sent; a run that is not there or cannot take
        it (ExecutionNotFound, SignalRefused). A value that is not an execution id
        at all raises (a caller's bug, not a refusal). Signals to one run are
        handled in the order given.
        """
        batch = SignalBatch.of(signals, tenant, self.limits)
        candidates = batch.schema_candidates(self.registry)
        if candidates:
            def read(shard: Shard, members: list[SignalDelivery]) -> list[tuple[str, int] | None]:
                found = self.store.workflows_of(shard, [c.target for c in members])
                return [found.get(c.target) for c in members]

            batch.refuse_by_schema(self.registry, candidates, fan_out(
                self.store.pools, candidates, lambda c: bucket_of(c.target), read))
        with signal_span(signals, tenant) as span:
            trace = tracing.traceparent(span)
            return batch.answered(self._deliver(tenant, batch.to_send(trace)))

    def signal_with_start(
        self,
        workflow: str | WorkflowDef,
        workflow_id: str,
        input: Any,  # noqa: A002 - the documented API name
        signal_name: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT,
        priority: int | None = None,
    ) -> SignalWithStartResult:
        """Signal the run of this workflow key, starting it (with `input`) if it has none.

        One transaction on the run's shard: a new run starts with the signal
        already buffered; a live run takes it; a finished run refuses it
        (SignalRefused) unless the key already landed (`delivered=False`). The
        dedupe scope is the run and the key, as for `signal`.
        """
        request = signalled_start(definition_of(self.registry, workflow), tenant, workflow_id,
                                  input, signal_name=signal_name, payload=payload,
                                  idempotency_key=idempotency_key, limits=self.limits,
                                  priority=priority)
        bucket = request.start.runs[0].bucket
        return self._routed(
            lambda m: self.store.signal_with_start(m.for_bucket(bucket), request))

    def cancel(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
        actor: str | None = None,
    ) -> State:
        """Cancel a run: at once when parked or queued, at its next checkpoint when running.

        Returns the state right after the call (`cancelled`, or the running state
        when the worker will stop it shortly, or the terminal state it already had).
        A run in `input_required` has its interrupt decided as `cancel`, by `actor`.
        """
        ident = cancel_target(execution_id, tenant, actor)
        return self._routed(lambda m: self.store.cancel(m.for_execution(ident), ident,
                                                        tenant=tenant, actor=actor))

    def set_priority(
        self, execution_id: str | uuid.UUID, priority: int, *, tenant: str = DEFAULT_TENANT,
    ) -> State:
        """Give a live run a new priority (0-9, higher claimed first): its current task
        and every later wake. A finished run is left as it ended. Returns the run's state.
        """
        ident, level = priority_target(execution_id, tenant, priority)
        return self._routed(lambda m: self.store.set_priority(
            m.for_execution(ident), ident, tenant=tenant, priority=level))

    # -- published contracts: interface, queries, updates ---------------------------

    def interface(self, workflow: str) -> dict[str, list[dict[str, Any]]]:
        """What the workflow publishes: {"signals", "queries", "updates"}, each sorted by
        name, with fields left out where nothing was published. UnknownWorkflow if it is
        not registered."""
        return definition_of(self.registry, workflow).interface()

    def query(
        self, execution_id: str | uuid.UUID, name: str, argument: Any = None, *,
        tenant: str = DEFAULT_TENANT,
    ) -> Any:
        """Answer query `name` from the run's committed state; nothing is written.

        The run's history is replayed here (no worker needed; parked, running
        and finished runs alike) and the handler reads the rebuilt instance.
        Raises UnknownHandler, PayloadInvalid (the argument), QueryFailed.
        """
        ident = parse_execution_id(execution_id)
        execution = self.get(ident, tenant=check_name(tenant, "tenant"))
        asked = QueryAsked.checked(self.registry, execution, name, argument, self.limits)
        return asked.answer(self._history(ident))

    def update(
        self, execution_id: str | uuid.UUID, name: str, argument: Any = None, *,
        idempotency_key: str | None = None, tenant: str = DEFAULT_TENANT,
        wait: float = DEFAULT_UPDATE_WAIT,
    ) -> UpdateResult:
        """Ask the run to handle update `name`; its handler's response once committed.

        Refused before anything is stored: PayloadInvalid (the argument's
        schema), UpdateRejected (the validator), UpdateRefused (`run_finished`).
        The run handles it at its next wait, woken if parked. With a key, a
        repeat returns the recorded response (`accepted=False`), even after the
        run finished. UpdateFailed: the handler raised (recorded; a keyed repeat
        raises it again). UpdateTimedOut: not handled within `wait` seconds
        (it still will be; call again with the key).
        """
        ident = parse_execution_id(execution_id)
        execution = self.get(ident, tenant=check_name(tenant, "tenant"))
        definition = self.registry.get(execution.workflow_name, execution.workflow_version)
        spec, payload_json, key = update_request(definition, name, argument,
                                                 key=idempotency_key, wait=wait,
                                                 limits=self.limits)
        if key is not None:
            earlier = self._routed(
                lambda m: self.store.signal_by_key(m.for_execution(ident), ident, key))
            if earlier is not None:
                return self._await_update(ident, spec, *earlier, wait=wait, accepted=False)
        check_takes_updates(execution)
        validate_update(spec, json.loads(payload_json),
                        lambda: rebuild_state(definition, execution, self._history(ident)))
        (result,) = self._deliver(tenant, [
            SignalDelivery(ident, spec.signal_name, payload_json, key)])
        signal_id, signal_name = stored_update(result)
        return self._await_update(ident, spec, signal_id, signal_name, wait=wait,
                                  accepted=result.delivered)

    def update_with_start(
        self, workflow: str | WorkflowDef, workflow_id: str, input: Any,  # noqa: A002
        name: str, argument: Any = None, *, idempotency_key: str | None = None,
        tenant: str = DEFAULT_TENANT, wait: float = DEFAULT_UPDATE_WAIT,
        priority: int | None = None,
    ) -> UpdateResult:
        """Update the run of this workflow key, starting it (with `input`) if it has none.

        The start and the stored update are one transaction (as signal_with_start);
        then as `update`. `created` says whether this call started the run.
        """
        definition = definition_of(self.registry, workflow)
        check_name(tenant, "tenant")
        spec, run, request = update_with_start_request(
            definition, tenant, workflow_id, input, name=name, argument=argument,
            key=idempotency_key, wait=wait, limits=self.limits, priority=priority)
        key = request.idempotency_key
        found = self._routed(lambda m: self.store.find_run(
            m.for_bucket(run.bucket), tenant=tenant, workflow_name=definition.name,
            workflow_id=workflow_id, bucket=run.bucket))
        if found is not None and key is not None:
            earlier = self._routed(
                lambda m: self.store.signal_by_key(m.for_bucket(run.bucket), found, key))
            if earlier is not None:  # a keyed repeat: the recorded answer, nothing checked
                return self._await_update(found, spec, *earlier, wait=wait, accepted=False)

        def state() -> Any:
            if found is None:  # the state a new run starts its code with
                return new_run_state(definition, tenant, run)
            execution = self.get(found, tenant=tenant)
            return rebuild_state(definition, execution, self._history(found))

        validate_update(spec, json.loads(request.payload_json), state)
        with finished_refuses_update():
            started = self._routed(
                lambda m: self.store.signal_with_start(m.for_bucket(run.bucket), request))
        assert started.signal_id is not None and started.signal_name is not None
        result = self._await_update(started.execution_id, spec, started.signal_id,
                                    started.signal_name, wait=wait, accepted=started.delivered)
        return replace(result, created=started.created)

    def _await_update(
        self, ident: uuid.UUID, spec: UpdateSpec, update_id: int, stored_name: str, *,
        wait: float, accepted: bool,
    ) -> UpdateResult:
        """Poll for the update's recorded outcome until `wait` seconds passed."""
        check_update_landed(spec, stored_name)
        waiting = UpdateWait(ident, update_id, wait, accepted)
        while True:
            outcome, state = self._routed(
                lambda m: self.store.update_outcome(m.for_execution(ident), ident, update_id))
            result = waiting.answer(outcome, state)
            if result is not None:
                return result
            time.sleep(waiting.pause())

    # -- human review ------------------------------------------------------------

    def pending_interrupts(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        workflow: str | None = None,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE,
        newest_first: bool = False,
        waited_s: float = 0.0,
        skip_unavailable: bool = False,
    ) -> PartialInterruptPage:
        """One page of open interrupts over every shard, oldest request first (or newest).

        `waited_s`: only interrupts open at least that many seconds. Pass
        `next_cursor` back (with the same order) for the following page; it is
        a position, so interrupts opened or decided meanwhile never shift or
        repeat a page.

        `skip_unavailable`: a shard that cannot be reached (ShardUnavailable) is
        named in the page's `unavailable_shards` instead of failing the page, and
        the shards are read at once, so the page costs the slowest answer: what
        waits for a person on the other shards stays reviewable during an outage.
        """
        inbox = InboxQuery.checked(tenant, workflow, cursor, limit=limit,
                                   newest_first=newest_first, waited_s=waited_s)

        def read(shard: Shard) -> list[PendingInterrupt]:
            return self.store.pending_interrupts(shard, **inbox.arguments())

        if skip_unavailable:
            reached = each_shard(self.map.shards, read)
            return inbox.merged(list(reached.answers.values()), reached)
        return inbox.merged([read(shard) for shard in self.map.shards])

    def decide(
        self,
        execution_id: str | uuid.UUID,
        interrupt: str,
        action: str,
        payload: Any = None,
        *,
        decision_id: str,
        actor: str,
        tenant: str = DEFAULT_TENANT,
    ) -> DecisionResult:
        """Resolve the run's open interrupt `interrupt` with one of its actions.

        `edit` carries the edited payload, checked against the interrupt's
        schema (PayloadInvalid, with field-level violations, and nothing
        stored). The same `decision_id` again is a no-op that returns the
        recorded decision (`accepted=False`); any other decision once one
        stands raises DecisionRefused (`reason_code` `decided`, the standing
        decision attached), as do a deadline that passed (`timed_out`) and an
        action the interrupt does not accept. Another tenant's run is answered
        as an unknown one (ExecutionNotFound).
        """
        asked = DecisionAsked.checked(execution_id, interrupt, action, payload,
                                      decision_id=decision_id, actor=actor, tenant=tenant,
                                      limits=self.limits)
        ident = asked.execution_id

        def decide(shard_map: ShardMap) -> tuple[str, dict[str, Any] | None, str | None]:
            # Read and decision by the same map: a refused decision reads the
            # interrupt again where the run is now.
            shard = shard_map.for_execution(ident)
            found = self.store.open_interrupt(shard, ident, interrupt)
            return self.store.decide_interrupt(shard, asked.decision(found))

        return asked.result(*self._routed(decide))
