"""The Python API for applications: start, signal, cancel, get, list, history."""

from __future__ import annotations

import heapq
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from shardq.queue.contracts import SignalSpec, UpdateSpec
from shardq.queue.encoding import to_json
from shardq.queue.errors import (
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
from shardq.queue.limits import Limits
from shardq.queue.listing import (
    DEFAULT_PAGE,
    MAX_PAGE,
    Cursor,
    InboxCursor,
    ListQuery,
    PartialInterruptPage,
)
from shardq.queue.models import (
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
from shardq.queue.names import check_name, check_text
from shardq.queue.params import (
    InterruptDecision,
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
)
from shardq.queue.rebuild import call_handler, rebuild_state
from shardq.queue.registry import Registry, WorkflowDef
from shardq.queue.schemas import validate
from shardq.queue.signaling import check_signal
from shardq.queue.store import Store
from shardq.shards.config import Shard, ShardMap
from shardq.shards.fanout import each_shard, fan_out
from shardq.shards.follow import rerouted
from shardq.shards.migrations import verify_shards
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for, bucket_of, new_execution_id, parse_execution_id

R = TypeVar("R")

DEFAULT_TENANT = "default"
MAX_LABEL = 255
"""Characters of a decision id or an actor."""
DEFAULT_UPDATE_WAIT = 30.0
"""Seconds Client.update waits for the run to handle an update before UpdateTimedOut."""
MAX_WAIT = 600.0
MAX_AGE_FILTER = 10 * 366 * 86400.0
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
        """queue.signaling.deliver, re-routing a shard's signals when a move refused them."""
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
        definition = self._definition(workflow)
        check_name(tenant, "tenant")
        seen: set[str] = set()
        runs: list[NewRun] = []
        for workflow_id, value in items:
            run = self._new_run(definition, tenant, workflow_id, value)  # checks the id first
            if run.workflow_id in seen:
                raise InvalidArgument(f"workflow_id {workflow_id!r} appears twice in one call")
            seen.add(run.workflow_id)
            runs.append(run)

        def insert(shard: Shard, members: list[NewRun]) -> list[StartResult]:
            return self.store.start_executions(shard, StartBatch(
                tenant, definition.name, definition.version, members, definition.gates))

        # Big batches: the shards' commits overlap instead of queueing.
        return fan_out(self.store.pools, runs, lambda r: r.bucket, insert,
                       parallel=len(runs) >= PARALLEL_START_MIN)

    def _new_run(
        self, definition: WorkflowDef, tenant: str, workflow_id: str, value: Any
    ) -> NewRun:
        """A run of this key with its input checked, under a fresh id of the key's bucket."""
        self._check_workflow_id(workflow_id)
        bucket = bucket_for(tenant, definition.name, workflow_id)
        encoded = self._checked_input(definition, workflow_id, value)
        return NewRun(new_execution_id(bucket), workflow_id, encoded, bucket)

    def _checked_input(self, definition: WorkflowDef, workflow_id: str, value: Any) -> str:
        """A run's input as JSON, within the bound and matching the workflow's input schema."""
        what = f"input of {definition.name} {workflow_id!r}"
        encoded = self.limits.check_input(to_json(value, what), what)
        if definition.input_schema is not None:
            validate(json.loads(encoded), definition.input_schema, what, "input validation failed")
        return encoded

    @staticmethod
    def _check_workflow_id(workflow_id: object) -> None:
        if not isinstance(workflow_id, str) or not workflow_id or len(workflow_id) > 512:
            raise InvalidArgument(f"workflow_id must be a 1..512 character string, got "
                                  f"{workflow_id!r}")
        check_text(workflow_id, "workflow_id")

    def _definition(self, workflow: str | WorkflowDef) -> WorkflowDef:
        if isinstance(workflow, WorkflowDef):
            return workflow
        return self.registry.get(check_name(workflow, "workflow"))

    # -- reading -------------------------------------------------------------

    def get(self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT) -> Execution:
        """The run, or ExecutionNotFound (also for another tenant's run)."""
        ident = parse_execution_id(execution_id)
        found = self._routed(lambda m: self.store.get_execution(m.for_execution(ident), ident))
        if found is None or found.tenant != tenant:
            raise ExecutionNotFound(f"execution {ident} not found")
        return found

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
    ) -> Page:
        """One page of runs over every shard, ordered by id (creation millisecond first).

        Pass `next_cursor` back for the following page. The cursor is a position,
        not an offset, so runs started meanwhile never shift or repeat a page.
        """
        if tenant is not None:
            check_name(tenant, "tenant")
        if workflow is not None:
            check_name(workflow, "workflow")
        query = ListQuery(
            tenant=tenant,
            state=State(state) if state is not None else None,
            workflow=workflow,
            limit=limit,
            after=Cursor.decode(cursor) if cursor is not None else None,
        )
        pages = [self.store.list_executions(shard, query) for shard in self.map.shards]
        merged = list(heapq.merge(*pages, key=lambda e: e.id))[:limit]
        last = merged[-1] if len(merged) == limit else None
        next_cursor = Cursor(last.id).encode() if last else None
        return Page(merged, next_cursor)

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
        check_name(tenant, "tenant")
        results: list[SignalResult | None] = [None] * len(signals)
        checked: list[tuple[int, SignalDelivery]] = []
        for index, request in enumerate(signals):
            ident = parse_execution_id(request.execution_id)
            try:
                values = check_signal(
                    request.name, request.payload, request.idempotency_key, self.limits
                )
            except InvalidArgument as exc:
                results[index] = SignalResult(ident, None, delivered=False, error=exc)
                continue
            checked.append((index, SignalDelivery(ident, *values)))
        for index, error in self._schema_violations([c for _, c in checked]).items():
            results[checked[index][0]] = SignalResult(checked[index][1].target, None,
                                                      delivered=False, error=error)
        checked = [c for c in checked if results[c[0]] is None]
        delivered = self._deliver(tenant, [c for _, c in checked])
        for (index, _), result in zip(checked, delivered, strict=True):
            results[index] = result
        return [r for r in results if r is not None]

    def _schema_violations(
        self, signals: Sequence[SignalDelivery]
    ) -> dict[int, PayloadInvalid]:
        """Which of `signals` break the schema their target's workflow publishes for them.

        Costs a lookup of the targets' workflows per shard, made only for names
        some registered workflow publishes a schema for. A target whose workflow
        this client's registry does not know is not checked here (its contract
        is unknown to this process); the HTTP server and workers load the app.
        """
        named = self.registry.schema_signals
        candidates = [(i, s) for i, s in enumerate(signals) if s.name in named]
        if not candidates:
            return {}
        def read(shard: Shard, members: list[tuple[int, SignalDelivery]]) -> list[
            tuple[str, int] | None
        ]:
            found = self.store.workflows_of(shard, [c.target for _, c in members])
            return [found.get(c.target) for _, c in members]

        answers = fan_out(self.store.pools, candidates, lambda c: bucket_of(c[1].target), read)
        workflows = {c.target: w for (_, c), w in zip(candidates, answers, strict=True)
                     if w is not None}
        refused: dict[int, PayloadInvalid] = {}
        for index, checked in candidates:
            spec = self._signal_spec(workflows.get(checked.target), checked.name)
            if spec is not None and spec.schema is not None:
                try:
                    validate(json.loads(checked.payload_json), spec.schema,
                             f"payload of signal {checked.name!r}",
                             "signal payload validation failed")
                except PayloadInvalid as exc:
                    refused[index] = exc
        return refused

    def _signal_spec(self, workflow: tuple[str, int] | None, name: str) -> SignalSpec | None:
        if workflow is None:
            return None
        try:
            return self.registry.get(*workflow).signal(name)
        except UnknownWorkflow:
            return None

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
        definition = self._definition(workflow)
        check_name(tenant, "tenant")
        run = self._new_run(definition, tenant, workflow_id, input)
        name, payload_json, key = check_signal(signal_name, payload, idempotency_key, self.limits)
        spec = definition.signal(name)
        if spec is not None and spec.schema is not None:
            validate(json.loads(payload_json), spec.schema, f"payload of signal {name!r}",
                     "signal payload validation failed")
        request = StartSignalled(
            StartBatch(tenant, definition.name, definition.version, (run,), definition.gates),
            name, payload_json, key,
        )
        return self._routed(
            lambda m: self.store.signal_with_start(m.for_bucket(run.bucket), request))

    def cancel(
        self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
        actor: str | None = None,
    ) -> State:
        """Cancel a run: at once when parked or queued, at its next checkpoint when running.

        Returns the state right after the call (`cancelled`, or the running state
        when the worker will stop it shortly, or the terminal state it already had).
        A run in `input_required` has its interrupt decided as `cancel`, by `actor`.
        """
        ident = parse_execution_id(execution_id)
        if actor is not None:
            _check_label(actor, "actor")
        check_name(tenant, "tenant")
        return self._routed(lambda m: self.store.cancel(m.for_execution(ident), ident,
                                                        tenant=tenant, actor=actor))

    # -- published contracts: interface, queries, updates ---------------------------

    def interface(self, workflow: str) -> dict[str, list[dict[str, Any]]]:
        """What the workflow publishes: {"signals", "queries", "updates"}, each sorted by
        name, with fields left out where nothing was published. UnknownWorkflow if it is
        not registered."""
        return self._definition(workflow).interface()

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
        definition = self.registry.get(execution.workflow_name, execution.workflow_version)
        spec = definition.query(check_name(name, "query"))
        what = f"argument of query {name!r}"
        argument = json.loads(self.limits.check_payload(to_json(argument, what), what))
        validate(argument, spec.schema, what, "query argument validation failed")
        state = rebuild_state(definition, execution, self._history(ident))
        try:
            response = call_handler(f"query {name!r}", spec.handler, state, argument)
            return json.loads(to_json(response, f"the response of query {name!r}"))
        except QueryFailed:
            raise
        except Exception as exc:  # the handler's own failure, reported to its caller
            raise QueryFailed(f"query {name!r} failed: {type(exc).__name__}: {exc}") from None

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
        spec = definition.update(check_name(name, "update"))
        _check_wait(wait)
        payload_json, key = self._update_payload(spec, argument, idempotency_key)
        if key is not None:
            earlier = self._routed(
                lambda m: self.store.signal_by_key(m.for_execution(ident), ident, key))
            if earlier is not None:
                return self._await_update(ident, spec, *earlier, wait=wait, accepted=False)
        if execution.state.terminal:
            raise UpdateRefused(f"execution {ident} is {execution.state}: it takes no updates",
                                "run_finished")
        self._validate_update(spec, json.loads(payload_json),
                              lambda: rebuild_state(definition, execution,
                                                    self._history(ident)))
        (result,) = self._deliver(tenant, [
            SignalDelivery(ident, spec.signal_name, payload_json, key)])
        if isinstance(result.error, SignalRefused) and result.error.reason_code == (
            "target_finished"
        ):
            raise UpdateRefused(str(result.error), "run_finished")
        if result.error is not None:
            raise result.error
        assert result.signal_id is not None and result.signal_name is not None
        return self._await_update(ident, spec, result.signal_id, result.signal_name, wait=wait,
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
        definition = self._definition(workflow)
        check_name(tenant, "tenant")
        spec = definition.update(check_name(name, "update"))
        _check_wait(wait)
        run = self._new_run(definition, tenant, workflow_id, input)
        payload_json, key = self._update_payload(spec, argument, idempotency_key)
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
                return rebuild_state(definition, Execution(
                    uuid.UUID(int=0), tenant, definition.name, definition.version, workflow_id,
                    State.PENDING, json.loads(run.input_json), None, None, False,
                    datetime.now(UTC), None), ())
            execution = self.get(found, tenant=tenant)
            return rebuild_state(definition, execution, self._history(found))

        self._validate_update(spec, json.loads(payload_json), state)
        try:
            request = StartSignalled(
                StartBatch(tenant, definition.name, definition.version, (run,),
                           definition.gates),
                spec.signal_name, payload_json, key,
            )
            started = self._routed(
                lambda m: self.store.signal_with_start(m.for_bucket(run.bucket), request))
        except SignalRefused as exc:
            if exc.reason_code == "target_finished":
                raise UpdateRefused(str(exc), "run_finished") from None
            raise
        assert started.signal_id is not None and started.signal_name is not None
        result = self._await_update(started.execution_id, spec, started.signal_id,
                                    started.signal_name, wait=wait, accepted=started.delivered)
        return UpdateResult(result.execution_id, result.update_id, result.response,
                            result.accepted, created=started.created)

    def _update_payload(
        self, spec: UpdateSpec, argument: Any, key: str | None
    ) -> tuple[str, str | None]:
        """(argument JSON, key) of an update, checked as a signal's are (but under the
        reserved name no sender may use)."""
        _, payload_json, key = check_signal("update", argument, key, self.limits)
        validate(json.loads(payload_json), spec.schema, f"argument of update {spec.name!r}",
                 "update payload validation failed")
        return payload_json, key

    @staticmethod
    def _validate_update(spec: UpdateSpec, argument: Any, state: Callable[[], Any]) -> None:
        if spec.validator is None:
            return
        try:
            call_handler(f"the validator of update {spec.name!r}", spec.validator, state(),
                         argument)
        except QueryFailed:
            raise
        except Exception as exc:  # the validator's refusal, in its own words
            raise UpdateRejected(f"update {spec.name!r} rejected: {exc}") from None

    def _await_update(
        self, ident: uuid.UUID, spec: UpdateSpec, update_id: int, stored_name: str, *,
        wait: float, accepted: bool,
    ) -> UpdateResult:
        """Poll for the update's recorded outcome until `wait` seconds passed."""
        if stored_name != spec.signal_name:
            raise InvalidArgument(f"the idempotency key already landed on this run as "
                                  f"{stored_name!r}, not as update {spec.name!r}")
        deadline = time.monotonic() + wait
        pause = 0.002
        while True:
            outcome, state = self._routed(
                lambda m: self.store.update_outcome(m.for_execution(ident), ident, update_id))
            if outcome is not None:
                if "error" in outcome:
                    error = outcome["error"]
                    raise UpdateFailed(update_id, {"type": error.get("type"),
                                                   "message": error.get("message")})
                return UpdateResult(ident, update_id, outcome.get("response"), accepted)
            if state is None or state.terminal:
                raise UpdateRefused(f"execution {ident} is {state}: it finished without "
                                    f"handling update {update_id}", "not_handled")
            if time.monotonic() >= deadline:
                raise UpdateTimedOut(update_id, wait)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

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
        check_name(tenant, "tenant")
        if workflow is not None:
            check_name(workflow, "workflow")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidArgument(f"page size must be within 1..{MAX_PAGE}, got {limit!r}")
        if isinstance(waited_s, bool) or not isinstance(waited_s, int | float) or not (
            0 <= waited_s <= MAX_AGE_FILTER
        ):
            raise InvalidArgument(f"waited_s must be within 0..{MAX_AGE_FILTER:g} seconds")
        after = InboxCursor.decode(cursor) if cursor is not None else None
        position = (after.at, after.id) if after else None
        def read(shard: Shard) -> list[PendingInterrupt]:
            return self.store.pending_interrupts(shard, tenant=tenant, workflow=workflow,
                                                 after=position, limit=limit,
                                                 newest_first=newest_first, waited_s=waited_s)

        missing: tuple[str, ...] = ()
        if skip_unavailable:
            reached = each_shard(self.map.shards, read)
            pages = list(reached.answers.values())
            missing = tuple(reached.unavailable_names)
        else:
            pages = [read(shard) for shard in self.map.shards]
        merged = list(heapq.merge(*pages, key=lambda p: (p.requested_at, p.execution_id),
                                  reverse=newest_first))
        merged = merged[:limit]
        last = merged[-1] if len(merged) == limit else None
        return PartialInterruptPage(
            merged, InboxCursor(last.requested_at, last.execution_id).encode() if last else None,
            missing,
        )

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
        ident = parse_execution_id(execution_id)
        check_name(tenant, "tenant")
        check_name(interrupt, "interrupt")
        if action not in INTERRUPT_ACTIONS:
            raise InvalidArgument(f"action must be one of {', '.join(INTERRUPT_ACTIONS)}, got "
                                  f"{action!r} (cancel the run with Client.cancel)")
        _check_label(decision_id, "decision_id")
        _check_label(actor, "actor")
        what = f"payload of the {action} decision on interrupt {interrupt!r}"
        payload_json = self.limits.check_payload(to_json(payload, what), what)

        def decide(shard_map: ShardMap) -> tuple[str, dict[str, Any] | None, str | None]:
            # Read and decision by the same map: a refused decision reads the
            # interrupt again where the run is now.
            shard = shard_map.for_execution(ident)
            found = self.store.open_interrupt(shard, ident, interrupt)
            if found is None or found[0] != tenant:
                raise ExecutionNotFound(f"execution {ident} not found")
            _, position, request = found
            if request is not None and action == "edit":
                validate(json.loads(payload_json), request.get("schema"), what,
                         "decision payload validation failed")
            return self.store.decide_interrupt(shard, InterruptDecision(
                ident, tenant, interrupt, position, action, payload_json, decision_id, actor))

        outcome, decision, detail = self._routed(decide)
        if outcome == "not_found":
            raise ExecutionNotFound(f"execution {ident} not found")
        if outcome in ("accepted", "repeated"):
            assert decision is not None
            return DecisionResult(Decision.from_event(decision), accepted=outcome == "accepted")
        raise DecisionRefused(outcome, detail or outcome, decision)


def iter_all(client: Client, **filters: Any) -> Iterable[Execution]:
    """Every run matching `filters`, page by page."""
    cursor: str | None = None
    while True:
        page = client.list_runs(cursor=cursor, **filters)
        yield from page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _check_wait(wait: object) -> None:
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
        raise InvalidArgument(f"wait must be a number of seconds within 0..{MAX_WAIT:g}, got "
                              f"{wait!r}")


def _check_label(value: object, what: str) -> str:
    """A decision id or an actor: a non-empty string of at most 255 characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LABEL:
        raise InvalidArgument(f"{what} must be a non-empty string of at most {MAX_LABEL} "
                              f"characters, got {value!r}")
    return check_text(value, what)
