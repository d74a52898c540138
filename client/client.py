"""The Python API for applications: start, signal, cancel, get, list, history."""

from __future__ import annotations

import heapq
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from shardq.core.errors import (
    DecisionRefused,
    ExecutionNotFound,
    InvalidArgument,
    PayloadInvalid,
    QueryFailed,
    SignalRefused,
    UnknownWorkflow,
    UpdateFailed,
    UpdateRefused,
    UpdateRejected,
    UpdateTimedOut,
)
from shardq.core.models import (
    INTERRUPT_ACTIONS,
    BufferedSignal,
    Decision,
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
    check_label,
    check_name,
    check_page_size,
    check_signal,
    check_wait,
    check_waited,
    check_workflow_id,
    payload_json,
    to_json,
    validate,
)
from shardq.shards.check import verify_shards
from shardq.shards.config import Shard, ShardMap
from shardq.shards.fanout import Reached, each_shard, fan_out
from shardq.shards.follow import rerouted
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for, bucket_of, new_execution_id, parse_execution_id
from shardq.store.listing import (
    DEFAULT_PAGE,
    MAX_PAGE,
    Cursor,
    InboxCursor,
    ListQuery,
    PartialInterruptPage,
    PartialPage,
)
from shardq.store.params import (
    InterruptDecision,
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
)
from shardq.store.store import Store
from shardq.workflow.contracts import QuerySpec, SignalSpec, UpdateSpec
from shardq.workflow.rebuild import call_handler, rebuild_state
from shardq.workflow.registry import Registry, WorkflowDef

R = TypeVar("R")

DEFAULT_TENANT = "default"
DEFAULT_UPDATE_WAIT = 30.0
"""Seconds Client.update waits for the run to handle an update before UpdateTimedOut."""
PARALLEL_START_MIN = 1000
"""From this many runs, `start_many` commits on its shards at once rather than in turn."""


class Client:
    """Entry point for applications. Thread-safe; share one per process.

    Every call routes by execution id or workflow key to one shard; only `list`
    reads every shard.
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
        self,
        workflow: str | WorkflowDef,
        workflow_id: str,
        input: Any = None,  # noqa: A002 - the documented API name
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> StartResult:
        """Start a run, or return the existing run of this workflow_id (`created=False`)."""
        return self.start_many(workflow, [(workflow_id, input)], tenant=tenant)[0]

    def start_many(
        self,
        workflow: str | WorkflowDef,
        items: Sequence[tuple[str, Any]],
        *,
        tenant: str = DEFAULT_TENANT,
    ) -> list[StartResult]:
        """Start many runs of one workflow: one commit per shard touched. Idempotent per key."""
        definition = definition_of(self.registry, workflow)
        runs = new_runs(definition, tenant, items, self.limits)

        def insert(shard: Shard, members: list[NewRun]) -> list[StartResult]:
            return self.store.start_executions(shard, start_batch(definition, tenant, members))

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
        return RunView(execution, wait, pending, events)

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

    def list_runs(
        self,
        *,
        tenant: str | None = DEFAULT_TENANT,
        state: State | str | None = None,
        workflow: str | None = None,
        limit: int = DEFAULT_PAGE,
        cursor: str | None = None,
        skip_unavailable: bool = False,
    ) -> PartialPage:
        """One page of runs over every shard, ordered by id (creation millisecond first).

        Pass `next_cursor` back for the following page. The cursor is a position,
        not an offset, so runs started meanwhile never shift or repeat a page.

        `skip_unavailable`: as `pending_interrupts`'s, a shard that cannot be reached
        is named in the page's `unavailable_shards` instead of failing the page, and
        the shards are read at once.
        """
        query = list_query(tenant, state, workflow, limit, cursor)

        def read(shard: Shard) -> list[Execution]:
            return self.store.list_executions(shard, query)

        if skip_unavailable:
            reached = each_shard(self.map.shards, read)
            return merged_runs(list(reached.answers.values()), limit, reached)
        return merged_runs([read(shard) for shard in self.map.shards], limit)

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
        return batch.answered(self._deliver(tenant, batch.to_send()))

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
    ) -> SignalWithStartResult:
        """Signal the run of this workflow key, starting it (with `input`) if it has none.

        One transaction on the run's shard: a new run starts with the signal
        already buffered; a live run takes it; a finished run refuses it
        (SignalRefused) unless the key already landed (`delivered=False`). The
        dedupe scope is the run and the key, as for `signal`.
        """
        request = signalled_start(definition_of(self.registry, workflow), tenant, workflow_id,
                                  input, signal_name=signal_name, payload=payload,
                                  idempotency_key=idempotency_key, limits=self.limits)
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
    ) -> UpdateResult:
        """Update the run of this workflow key, starting it (with `input`) if it has none.

        The start and the stored update are one transaction (as signal_with_start);
        then as `update`. `created` says whether this call started the run.
        """
        definition = definition_of(self.registry, workflow)
        check_name(tenant, "tenant")
        spec, run, request = update_with_start_request(
            definition, tenant, workflow_id, input, name=name, argument=argument,
            key=idempotency_key, wait=wait, limits=self.limits)
        key = request.idempotency_key
        found = self._routed(lambda m: self.store.find_run(
            m.for_bucket(run.bucket), tenant=tenant, workflow_name=definition.name,
            workflow_id=workflow_id))
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


def iter_all(client: Client, **filters: Any) -> Iterable[Execution]:
    """Every run matching `filters`, page by page."""
    cursor: str | None = None
    while True:
        page = client.list_runs(cursor=cursor, **filters)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


# -- what Client and AsyncClient share ------------------------------------------------------
#
# Everything a call decides that is not I/O: its checks (core/rules.py), the
# parameter objects it hands the store, and how it reads the store's answers.
# Client and AsyncClient (client/async_client.py) differ only in how they wait.


def definition_of(registry: Registry, workflow: str | WorkflowDef) -> WorkflowDef:
    if isinstance(workflow, WorkflowDef):
        return workflow
    return registry.get(check_name(workflow, "workflow"))


def new_run(definition: WorkflowDef, tenant: str, workflow_id: str, value: Any,
            limits: Limits) -> NewRun:
    """A run of this key with its input checked, under a fresh id of the key's bucket."""
    check_workflow_id(workflow_id)
    bucket = bucket_for(tenant, definition.name, workflow_id)
    return NewRun(new_execution_id(bucket), workflow_id,
                  checked_input(definition, workflow_id, value, limits), bucket)


def checked_input(definition: WorkflowDef, workflow_id: str, value: Any, limits: Limits) -> str:
    """A run's input as JSON, within the bound and matching the workflow's input schema."""
    what = f"input of {definition.name} {workflow_id!r}"
    encoded = limits.check_input(to_json(value, what), what)
    if definition.input_schema is not None:
        validate(json.loads(encoded), definition.input_schema, what, "input validation failed")
    return encoded


def new_runs(definition: WorkflowDef, tenant: str, items: Sequence[tuple[str, Any]],
             limits: Limits) -> list[NewRun]:
    """The runs of a start_many, each checked, no workflow id twice."""
    check_name(tenant, "tenant")
    seen: set[str] = set()
    runs: list[NewRun] = []
    for workflow_id, value in items:
        run = new_run(definition, tenant, workflow_id, value, limits)  # checks the id first
        if run.workflow_id in seen:
            raise InvalidArgument(f"workflow_id {workflow_id!r} appears twice in one call")
        seen.add(run.workflow_id)
        runs.append(run)
    return runs


def start_batch(definition: WorkflowDef, tenant: str, runs: Sequence[NewRun]) -> StartBatch:
    return StartBatch(tenant, definition.name, definition.version, runs, definition.gates)


def tenants_run(found: Execution | None, ident: uuid.UUID, tenant: str) -> Execution:
    """The run read, when it is `tenant`'s; else ExecutionNotFound (another tenant's run
    is answered as an unknown one)."""
    if found is None or found.tenant != tenant:
        raise ExecutionNotFound(f"execution {ident} not found")
    return found


def list_query(tenant: str | None, state: State | str | None, workflow: str | None,
               limit: int, cursor: str | None) -> ListQuery:
    if tenant is not None:
        check_name(tenant, "tenant")
    if workflow is not None:
        check_name(workflow, "workflow")
    return ListQuery(
        tenant=tenant,
        state=State(state) if state is not None else None,
        workflow=workflow,
        limit=limit,
        after=Cursor.decode(cursor) if cursor is not None else None,
    )


def merged_runs(pages: Sequence[list[Execution]], limit: int,
                reached: Reached[Any] | None = None) -> PartialPage:
    """The shards' pages as one, by id, with the cursor of the page after it; `reached`
    (when some shards were read by `each_shard`) names those that could not be."""
    merged = list(heapq.merge(*pages, key=lambda e: e.id))[:limit]
    last = merged[-1] if len(merged) == limit else None
    return PartialPage(merged, Cursor(last.id).encode() if last else None,
                       *_unread(reached))


def _unread(reached: Reached[Any] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the shards `reached` could not read, and why (a partial page's)."""
    if reached is None:
        return (), ()
    return tuple(reached.unavailable_names), tuple(reached.causes)


class SignalBatch:
    """A signal_many call on its way: each request checked (a refusal kept in its slot),
    the schema checks, then the store's answers put back in input order."""

    def __init__(self, size: int) -> None:
        self.results: list[SignalResult | None] = [None] * size
        self.checked: list[tuple[int, SignalDelivery]] = []

    @classmethod
    def of(cls, signals: Sequence[SignalRequest], tenant: str, limits: Limits) -> SignalBatch:
        """The batch with each request checked; a request that breaks a rule keeps its
        refusal in its slot (a value that is not an execution id at all raises)."""
        check_name(tenant, "tenant")
        batch = cls(len(signals))
        for index, request in enumerate(signals):
            ident = parse_execution_id(request.execution_id)
            try:
                values = check_signal(
                    request.name, request.payload, request.idempotency_key, limits)
            except InvalidArgument as exc:
                batch.results[index] = SignalResult(ident, None, delivered=False, error=exc)
                continue
            batch.checked.append((index, SignalDelivery(ident, *values)))
        return batch

    def schema_candidates(self, registry: Registry) -> list[SignalDelivery]:
        """The checked signals whose name some registered workflow publishes a schema for:
        their targets' workflows are looked up (per shard) to check them."""
        named = registry.schema_signals
        return [s for _, s in self.checked if s.name in named]

    def refuse_by_schema(self, registry: Registry, candidates: Sequence[SignalDelivery],
                         workflows: Sequence[tuple[str, int] | None]) -> None:
        """Refuse the candidates that break the schema their target's workflow publishes
        for them. A target whose workflow this registry does not know is not checked here
        (its contract is unknown to this process); the HTTP server and workers load the
        app."""
        of = {c.target: w for c, w in zip(candidates, workflows, strict=True) if w is not None}
        for index, signal in self.checked:
            if signal.name not in registry.schema_signals:
                continue
            spec = _signal_spec(registry, of.get(signal.target), signal.name)
            if spec is not None and spec.schema is not None:
                try:
                    validate(json.loads(signal.payload_json), spec.schema,
                             f"payload of signal {signal.name!r}",
                             "signal payload validation failed")
                except PayloadInvalid as exc:
                    self.results[index] = SignalResult(signal.target, None, delivered=False,
                                                       error=exc)

    def to_send(self) -> list[SignalDelivery]:
        self.checked = [c for c in self.checked if self.results[c[0]] is None]
        return [c for _, c in self.checked]

    def answered(self, delivered: Sequence[SignalResult]) -> list[SignalResult]:
        for (index, _), result in zip(self.checked, delivered, strict=True):
            self.results[index] = result
        return [r for r in self.results if r is not None]


def _signal_spec(registry: Registry, workflow: tuple[str, int] | None,
                 name: str) -> SignalSpec | None:
    if workflow is None:
        return None
    try:
        return registry.get(*workflow).signal(name)
    except UnknownWorkflow:
        return None


def signalled_start(
    definition: WorkflowDef, tenant: str, workflow_id: str, value: Any, *, signal_name: str,
    payload: Any, idempotency_key: str | None, limits: Limits,
) -> StartSignalled:
    """A signal_with_start call's request: the run and the signal, each checked."""
    check_name(tenant, "tenant")
    run = new_run(definition, tenant, workflow_id, value, limits)
    name, payload_json, key = check_signal(signal_name, payload, idempotency_key, limits)
    spec = definition.signal(name)
    if spec is not None and spec.schema is not None:
        validate(json.loads(payload_json), spec.schema, f"payload of signal {name!r}",
                 "signal payload validation failed")
    return StartSignalled(start_batch(definition, tenant, (run,)), name, payload_json, key)


def cancel_target(execution_id: str | uuid.UUID, tenant: str, actor: str | None) -> uuid.UUID:
    ident = parse_execution_id(execution_id)
    if actor is not None:
        check_label(actor, "actor")
    check_name(tenant, "tenant")
    return ident


@dataclass(frozen=True)
class QueryAsked:
    """A query call, checked: its handler and argument; `answer` replays the history."""

    definition: WorkflowDef
    execution: Execution
    name: str
    spec: QuerySpec
    argument: Any

    @classmethod
    def checked(cls, registry: Registry, execution: Execution, name: str, argument: Any,
                limits: Limits) -> QueryAsked:
        definition = registry.get(execution.workflow_name, execution.workflow_version)
        spec = definition.query(check_name(name, "query"))
        what = f"argument of query {name!r}"
        value = json.loads(payload_json(argument, what, limits))
        validate(value, spec.schema, what, "query argument validation failed")
        return cls(definition, execution, name, spec, value)

    def answer(self, history: Sequence[HistoryEvent]) -> Any:
        state = rebuild_state(self.definition, self.execution, history)
        try:
            response = call_handler(f"query {self.name!r}", self.spec.handler, state,
                                    self.argument)
            return json.loads(to_json(response, f"the response of query {self.name!r}"))
        except QueryFailed:
            raise
        except Exception as exc:  # the handler's own failure, reported to its caller
            raise QueryFailed(f"query {self.name!r} failed: {type(exc).__name__}: {exc}"
                              ) from None


def update_request(
    definition: WorkflowDef, name: str, argument: Any, *, key: str | None, wait: float,
    limits: Limits,
) -> tuple[UpdateSpec, str, str | None]:
    """(the update's spec, its argument JSON, its key), each checked."""
    spec = definition.update(check_name(name, "update"))
    check_wait(wait)
    return (spec, *update_argument(spec, argument, key, limits))


def update_argument(spec: UpdateSpec, argument: Any, key: str | None,
                    limits: Limits) -> tuple[str, str | None]:
    """(argument JSON, key) of an update, checked as a signal's are (but under the
    reserved name no sender may use) and against the update's schema."""
    _, argument_json, key = check_signal("update", argument, key, limits)
    validate(json.loads(argument_json), spec.schema, f"argument of update {spec.name!r}",
             "update payload validation failed")
    return argument_json, key


def update_with_start_request(
    definition: WorkflowDef, tenant: str, workflow_id: str, value: Any, *, name: str,
    argument: Any, key: str | None, wait: float, limits: Limits,
) -> tuple[UpdateSpec, NewRun, StartSignalled]:
    spec = definition.update(check_name(name, "update"))
    check_wait(wait)
    run = new_run(definition, tenant, workflow_id, value, limits)
    argument_json, key = update_argument(spec, argument, key, limits)
    return spec, run, StartSignalled(start_batch(definition, tenant, (run,)),
                                     spec.signal_name, argument_json, key)


def check_takes_updates(execution: Execution) -> None:
    if execution.state.terminal:
        raise UpdateRefused(f"execution {execution.id} is {execution.state}: it takes no "
                            f"updates", "run_finished")


def new_run_state(definition: WorkflowDef, tenant: str, run: NewRun) -> Any:
    """The state a run not started yet starts its code with (an update's validator reads
    it in update_with_start)."""
    return rebuild_state(definition, Execution(
        uuid.UUID(int=0), tenant, definition.name, definition.version, run.workflow_id,
        State.PENDING, json.loads(run.input_json), None, None, False,
        datetime.now(UTC), None), ())


def validate_update(spec: UpdateSpec, argument: Any, state: Callable[[], Any]) -> None:
    if spec.validator is None:
        return
    try:
        call_handler(f"the validator of update {spec.name!r}", spec.validator, state(),
                     argument)
    except QueryFailed:
        raise
    except Exception as exc:  # the validator's refusal, in its own words
        raise UpdateRejected(f"update {spec.name!r} rejected: {exc}") from None


def stored_update(result: SignalResult) -> tuple[int, str]:
    """(update id, stored name) of an update delivered as a signal; its refusal raised (a
    finished run as UpdateRefused `run_finished`)."""
    if isinstance(result.error, SignalRefused) and result.error.reason_code == (
        "target_finished"
    ):
        raise UpdateRefused(str(result.error), "run_finished")
    if result.error is not None:
        raise result.error
    assert result.signal_id is not None and result.signal_name is not None
    return result.signal_id, result.signal_name


@contextmanager
def finished_refuses_update() -> Iterator[None]:
    """A signal_with_start of an update refused by a finished run: UpdateRefused."""
    try:
        yield
    except SignalRefused as exc:
        if exc.reason_code == "target_finished":
            raise UpdateRefused(str(exc), "run_finished") from None
        raise


def check_update_landed(spec: UpdateSpec, stored_name: str) -> None:
    if stored_name != spec.signal_name:
        raise InvalidArgument(f"the idempotency key already landed on this run as "
                              f"{stored_name!r}, not as update {spec.name!r}")


class UpdateWait:
    """Waiting for an update's recorded outcome: what each read means, and the pause
    (2 ms, doubling to 100 ms) before the next one."""

    def __init__(self, ident: uuid.UUID, update_id: int, wait: float, accepted: bool) -> None:
        self.ident, self.update_id, self.wait, self.accepted = ident, update_id, wait, accepted
        self.deadline = time.monotonic() + wait
        self._pause = 0.002

    def answer(self, outcome: dict[str, Any] | None, state: State | None) -> UpdateResult | None:
        """The result once recorded; None: read again after `pause()`. Raises UpdateFailed,
        UpdateRefused (`not_handled`), UpdateTimedOut."""
        if outcome is not None:
            if "error" in outcome:
                error = outcome["error"]
                raise UpdateFailed(self.update_id, {"type": error.get("type"),
                                                    "message": error.get("message")})
            return UpdateResult(self.ident, self.update_id, outcome.get("response"),
                                self.accepted)
        if state is None or state.terminal:
            raise UpdateRefused(f"execution {self.ident} is {state}: it finished without "
                                f"handling update {self.update_id}", "not_handled")
        if time.monotonic() >= self.deadline:
            raise UpdateTimedOut(self.update_id, self.wait)
        return None

    def pause(self) -> float:
        pause, self._pause = self._pause, min(self._pause * 2, 0.1)
        return pause


@dataclass(frozen=True)
class InboxQuery:
    """A pending_interrupts call, checked: what each shard is asked, and the merge."""

    tenant: str
    workflow: str | None
    after: InboxCursor | None
    limit: int
    newest_first: bool
    waited_s: float

    @classmethod
    def checked(cls, tenant: str, workflow: str | None, cursor: str | None, *, limit: int,
                newest_first: bool, waited_s: float) -> InboxQuery:
        check_name(tenant, "tenant")
        if workflow is not None:
            check_name(workflow, "workflow")
        check_page_size(limit, MAX_PAGE)
        check_waited(waited_s)
        after = InboxCursor.decode(cursor) if cursor is not None else None
        return cls(tenant, workflow, after, limit, newest_first, float(waited_s))

    def arguments(self) -> dict[str, Any]:
        """The store's pending_interrupts arguments (after the shard)."""
        return {"tenant": self.tenant, "workflow": self.workflow,
                "after": (self.after.at, self.after.id) if self.after else None,
                "limit": self.limit, "newest_first": self.newest_first,
                "waited_s": self.waited_s}

    def merged(self, pages: Sequence[list[PendingInterrupt]],
               reached: Reached[Any] | None = None) -> PartialInterruptPage:
        """The shards' pages as one, in the asked order; `reached` as merged_runs's."""
        merged = list(heapq.merge(*pages, key=lambda p: (p.requested_at, p.execution_id),
                                  reverse=self.newest_first))[:self.limit]
        last = merged[-1] if len(merged) == self.limit else None
        return PartialInterruptPage(
            merged, InboxCursor(last.requested_at, last.execution_id).encode() if last else None,
            *_unread(reached),
        )


@dataclass(frozen=True)
class DecisionAsked:
    """A decide call, checked: the decision the store is handed once the interrupt is
    read, and what the store's outcome means."""

    execution_id: uuid.UUID
    tenant: str
    interrupt: str
    action: str
    payload_json: str
    what: str
    decision_id: str
    actor: str

    @classmethod
    def checked(cls, execution_id: str | uuid.UUID, interrupt: str, action: str,
                payload: Any, *, decision_id: str, actor: str, tenant: str,
                limits: Limits) -> DecisionAsked:
        ident = parse_execution_id(execution_id)
        check_name(tenant, "tenant")
        check_name(interrupt, "interrupt")
        if action not in INTERRUPT_ACTIONS:
            raise InvalidArgument(f"action must be one of {', '.join(INTERRUPT_ACTIONS)}, "
                                  f"got {action!r} (cancel the run with Client.cancel)")
        check_label(decision_id, "decision_id")
        check_label(actor, "actor")
        what = f"payload of the {action} decision on interrupt {interrupt!r}"
        return cls(ident, tenant, interrupt, action, payload_json(payload, what, limits), what,
                   decision_id, actor)

    def decision(
        self, found: tuple[str, int | None, dict[str, Any] | None] | None,
    ) -> InterruptDecision:
        """What to hand decide_interrupt, given the open interrupt read (store.open_interrupt)
        on the same shard; another tenant's run is an unknown one, an edit meets the
        interrupt's schema."""
        if found is None or found[0] != self.tenant:
            raise ExecutionNotFound(f"execution {self.execution_id} not found")
        _, position, request = found
        if request is not None and self.action == "edit":
            validate(json.loads(self.payload_json), request.get("schema"), self.what,
                     "decision payload validation failed")
        return InterruptDecision(self.execution_id, self.tenant, self.interrupt, position,
                                 self.action, self.payload_json, self.decision_id, self.actor)

    def result(self, outcome: str, decision: dict[str, Any] | None,
               detail: str | None) -> DecisionResult:
        if outcome == "not_found":
            raise ExecutionNotFound(f"execution {self.execution_id} not found")
        if outcome in ("accepted", "repeated"):
            assert decision is not None
            return DecisionResult(Decision.from_event(decision), accepted=outcome == "accepted")
        raise DecisionRefused(outcome, detail or outcome, decision)
