"""What Client and AsyncClient share: every part of a call that is not I/O.

A call's checks (core/rules.py), the parameter objects it hands the store
(store/params.py), and how it reads the store's answers are decided here once;
client/client.py and client/async_client.py differ only in how they wait.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shardq.core import tracing
from shardq.core.attributes import check_filters as check_where
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
from shardq.core.flow import ConcurrencyLimit
from shardq.core.models import (
    INTERRUPT_ACTIONS,
    Decision,
    DecisionResult,
    Execution,
    HistoryEvent,
    PendingInterrupt,
    SignalRequest,
    SignalResult,
    State,
    UpdateResult,
)
from shardq.core.rules import (
    Limits,
    check_concurrency,
    check_concurrency_key,
    check_concurrency_limit,
    check_label,
    check_name,
    check_page_size,
    check_priority,
    check_signal,
    check_state,
    check_wait,
    check_waited,
    check_workflow_id,
    payload_json,
    to_json,
    validate,
)
from shardq.shards.fanout import Reached
from shardq.shards.routing import (
    parse_execution_id,
)
from shardq.store.listing import (
    MAX_PAGE,
    Cursor,
    InboxCursor,
    ListQuery,
    PartialInterruptPage,
)
from shardq.store.params import (
    InterruptDecision,
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
    placed_run,
)
from shardq.workflow.contracts import QuerySpec, SignalSpec, UpdateSpec
from shardq.workflow.rebuild import call_handler, rebuild_state
from shardq.workflow.registry import Registry, WorkflowDef

DEFAULT_TENANT = "default"
DEFAULT_UPDATE_WAIT = 30.0
"""Seconds Client.update waits for the run to handle an update before UpdateTimedOut."""
PARALLEL_START_MIN = 1000
"""From this many runs, `start_many` commits on its shards at once rather than in turn."""



def definition_of(registry: Registry, workflow: str | WorkflowDef) -> WorkflowDef:
    if isinstance(workflow, WorkflowDef):
        return workflow
    return registry.get(check_name(workflow, "workflow"))


def new_run(definition: WorkflowDef, tenant: str, workflow_id: str, value: Any,
            limits: Limits, *, concurrency: object = None) -> NewRun:
    """A run of this key with its input checked, under a fresh id of the key's bucket.

    A limited run (`concurrency`, the start's (key, limit), else the workflow's) takes
    its concurrency key's bucket instead: every run of one key, its limit and its queue
    then live on one shard (docs/flow-control.md)."""
    check_workflow_id(workflow_id)
    input_json = definition.checked_input(workflow_id, value, limits)
    chosen = (definition.concurrency_of(value) if concurrency is None
              else check_concurrency(concurrency))
    return placed_run(tenant, definition.name, workflow_id, input_json, chosen)


def new_runs(definition: WorkflowDef, tenant: str, items: Sequence[tuple[str, Any]],
             limits: Limits, concurrency: object = None) -> list[NewRun]:
    """The runs of a start_many, each checked, no workflow id twice, no key given two
    limits."""
    check_name(tenant, "tenant")
    seen: set[str] = set()
    runs: list[NewRun] = []
    keyed: dict[str, int] = {}
    for workflow_id, value in items:
        run = new_run(definition, tenant, workflow_id, value, limits, concurrency=concurrency)
        if run.concurrency is not None:
            key, limit = run.concurrency
            if keyed.setdefault(key, limit) != limit:
                raise InvalidArgument(f"concurrency key {key!r} is given limits "
                                      f"{keyed[key]} and {limit} in one call")
        if run.workflow_id in seen:
            raise InvalidArgument(f"workflow_id {workflow_id!r} appears twice in one call")
        seen.add(run.workflow_id)
        runs.append(run)
    return runs


def limit_change(key: object, limit: object) -> tuple[str, int | None]:
    """An operator's limit change, checked: the key and its limit (None: reset)."""
    return check_concurrency_key(key), None if limit is None else check_concurrency_limit(limit)


def busiest(per_shard: Sequence[list[ConcurrencyLimit]], size: int) -> list[ConcurrencyLimit]:
    """The shards' busiest keys merged: the most runs waiting first, `size` of them."""
    merged = [k for keys in per_shard for k in keys]
    return sorted(merged, key=lambda k: (-k.waiting, k.key))[:size]


def run_priority(definition: WorkflowDef, priority: int | None) -> int:
    """A start's priority: the one it names, checked, or the workflow's own."""
    return definition.priority if priority is None else check_priority(priority)


def start_batch(definition: WorkflowDef, tenant: str, runs: Sequence[NewRun],
                priority: int = 0, trace: str | None = None) -> StartBatch:
    """The runs to insert on one shard; `priority` as run_priority resolved it, `trace`
    the starting span's (core/tracing.py)."""
    return StartBatch(tenant, definition.name, definition.version, runs, definition.gates,
                      priority, trace)


def start_span(definition: WorkflowDef, tenant: str, count: int) -> Any:
    """The span of a start (tracing.span's context manager)."""
    return tracing.span("shardq.start", kind=tracing.PRODUCER, attributes={
        "shardq.workflow": definition.name, "shardq.tenant": tenant, "shardq.runs": count})


def signal_span(signals: Sequence[SignalRequest], tenant: str) -> Any:
    """The span of a signal call (tracing.span's context manager)."""
    first = signals[0] if len(signals) == 1 else None
    return tracing.span("shardq.signal", kind=tracing.PRODUCER, attributes={
        "shardq.tenant": tenant, "shardq.signals": len(signals),
        "shardq.signal": first.name if first is not None else None,
        "shardq.execution_id": str(first.execution_id) if first is not None else None})


def tenants_run(found: Execution | None, ident: uuid.UUID, tenant: str) -> Execution:
    """The run read, when it is `tenant`'s; else ExecutionNotFound (another tenant's run
    is answered as an unknown one)."""
    if found is None or found.tenant != tenant:
        raise ExecutionNotFound(f"execution {ident} not found")
    return found


def check_filters(tenant: str | None, workflow: str | None) -> None:
    """The tenant and workflow a read of many runs (a page, a count) is filtered by."""
    if tenant is not None:
        check_name(tenant, "tenant")
    if workflow is not None:
        check_name(workflow, "workflow")


def list_query(tenant: str | None, state: State | str | None, workflow: str | None,
               limit: int, cursor: str | None, *, priority: int | None = None,
               created_after: datetime | None = None,
               created_before: datetime | None = None, where: Any = None) -> ListQuery:
    if priority is not None:
        check_priority(priority)
    check_filters(tenant, workflow)
    return ListQuery(
        tenant=tenant,
        state=check_state(state),
        workflow=workflow,
        limit=limit,
        after=Cursor.decode(cursor) if cursor is not None else None,
        priority=priority,
        created_after=created_after,
        created_before=created_before,
        where=check_where(where),
    )


def unread_of(reached: Reached[Any] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
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

    def to_send(self, trace: str | None = None,
                traces: Sequence[str | None] | None = None) -> list[SignalDelivery]:
        """What is left to deliver, each carrying its sender's trace: `traces[i]` for the
        i-th signal given when set (a coalesced batch's callers'), else `trace`."""
        self.checked = [c for c in self.checked if self.results[c[0]] is None]
        if traces is not None or trace is not None:
            self.checked = [
                (i, dataclasses.replace(c, trace=traces[i] if traces is not None else trace))
                for i, c in self.checked]
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
    payload: Any, idempotency_key: str | None, limits: Limits, priority: int | None = None,
) -> StartSignalled:
    """A signal_with_start call's request: the run and the signal, each checked."""
    check_name(tenant, "tenant")
    run = new_run(definition, tenant, workflow_id, value, limits)
    name, payload_json, key = check_signal(signal_name, payload, idempotency_key, limits)
    spec = definition.signal(name)
    if spec is not None and spec.schema is not None:
        validate(json.loads(payload_json), spec.schema, f"payload of signal {name!r}",
                 "signal payload validation failed")
    return StartSignalled(start_batch(definition, tenant, (run,),
                                      run_priority(definition, priority)),
                          name, payload_json, key)


def cancel_target(execution_id: str | uuid.UUID, tenant: str, actor: str | None) -> uuid.UUID:
    ident = parse_execution_id(execution_id)
    if actor is not None:
        check_label(actor, "actor")
    check_name(tenant, "tenant")
    return ident


def priority_target(execution_id: str | uuid.UUID, tenant: str, priority: object
                    ) -> tuple[uuid.UUID, int]:
    """A priority change's run and new priority, checked before anything is asked."""
    ident = parse_execution_id(execution_id)
    check_name(tenant, "tenant")
    return ident, check_priority(priority)


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
    argument: Any, key: str | None, wait: float, limits: Limits, priority: int | None = None,
) -> tuple[UpdateSpec, NewRun, StartSignalled]:
    spec = definition.update(check_name(name, "update"))
    check_wait(wait)
    run = new_run(definition, tenant, workflow_id, value, limits)
    argument_json, key = update_argument(spec, argument, key, limits)
    batch = start_batch(definition, tenant, (run,), run_priority(definition, priority))
    return spec, run, StartSignalled(batch, spec.signal_name, argument_json, key)


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
            *unread_of(reached),
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
