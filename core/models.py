"""The values that cross the store seam: small frozen dataclasses, no SQL, no driver types."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from shardq.core.children import ChildInfo, ChildStart
from shardq.core.errors import ExternalSignalFailed, WorkflowError
from shardq.core.flow import RateWait


class State(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMED_OUT})


class Event(StrEnum):
    """History event kinds. The part before the dot is the workflow call they belong to."""

    STEP_COMPLETED = "step.completed"
    STEP_FAILED = "step.failed"
    TIMER_STARTED = "sleep.started"
    TIMER_FIRED = "sleep.fired"
    SIGNAL_WAITING = "signal.waiting"
    SIGNAL_CONSUMED = "signal.consumed"
    SIGNAL_TIMED_OUT = "signal.timed_out"
    CONDITION_WAITING = "condition.waiting"
    CONDITION_CONSUMED = "condition.consumed"
    """A signal a condition's handler was given (payload as in signal.consumed)."""
    CONDITION_MET = "condition.met"
    CONDITION_TIMED_OUT = "condition.timed_out"
    CLOCK_READ = "now.read"
    SIGNAL_RECEIVED = "signal.received"
    """Not tied to a call: written by the sender when a signal lands."""
    INTERRUPT_REQUESTED = "interrupt.requested"
    """The run asks a person: prompt, accepted actions, schema (payload of the wait)."""
    INTERRUPT_DECIDED = "interrupt.decided"
    """Written by the decider at the interrupt's position: action, payload, id, actor, time."""
    INTERRUPT_TIMED_OUT = "interrupt.timed_out"
    INTERRUPT_REFUSED = "interrupt.refused"
    """No position: a decision attempt that was refused, with its reason (the audit)."""
    EXTERNAL_SENT = "external.sent"
    """ctx.signal_external delivered to a run of the sender's shard, in its commit."""
    EXTERNAL_QUEUED = "external.queued"
    """ctx.signal_external to a run of another shard: an outbox row, for the relay."""
    EXTERNAL_FAILED = "external.failed"
    """At the call's position: a same-shard target refused it. With no position:
    the relay could not deliver a queued one (payload `position` names the call)."""
    EXTERNAL_REQUEUED = "external.requeued"
    """No position: an operator re-queued a queued signal that had failed for good."""
    CHILD_STARTED = "child.started"
    """At the call's position: ctx.start_child (the child's id, workflow, workflow id)."""
    CHILDREN_STARTED = "children.started"
    """At the first of a ctx.start_children call's positions, for all of its children at
    once: their ids, workflows, workflow ids and policies as lists in call order, the
    i-th child at the first position + i. Replay reads it as a `child.started` each."""
    CHILD_OF = "child.of"
    """No position, in the child's history: the parent that started it, and where."""
    RUN_CONTINUED = "run.continued"
    """No position, first of a generation's history (ctx.continue_as_new): its number
    and the position its calls start from."""
    CHILDREN_WAITING = "children.waiting"
    CHILDREN_ENDED = "children.ended"
    """At a wait for children: the outcomes it took (ctx.wait_child(ren))."""
    PATCH_MARKED = "patch.marked"
    """At a ctx.patched call a run reached on code that has it: the change id (its name)."""
    ATTRIBUTES_SET = "attributes.set"
    """At a ctx.set_attributes call: the search attributes it set (`values`, None for one
    removed); the commit writes them where listing reads them (schema/0030)."""
    UPDATE_COMPLETED = "update.completed"
    """At the position of the wait that handled it: an update's argument and its handler's
    response (or error). Not a call of its own: replay applies it at that wait."""

    @property
    def call(self) -> str:
        return self.value.split(".", 1)[0]


@dataclass(frozen=True)
class Execution:
    id: uuid.UUID
    tenant: str
    workflow_name: str
    workflow_version: int
    workflow_id: str
    state: State
    input: Any
    output: Any
    error: dict[str, Any] | None
    cancel_requested: bool
    """A cancellation was asked while a worker held the run: it ends cancelled."""
    created_at: datetime
    finished_at: datetime | None
    priority: int = 0
    """0 (the default) to 9: under a backlog, due runs of a higher priority are claimed
    first (docs/flow-control.md)."""
    concurrency_key: str | None = None
    """The key whose limit the run counts against (docs/flow-control.md); None: no limit."""
    waiting_for_slot: bool = False
    """Due, but every slot of its concurrency key is taken: it runs when one frees."""
    build_id: str | None = None  # its workflow's build at its start (docs/versioning.md)
    pinned: bool = False  # held to that build: only its workers run it
    attributes: dict[str, Any] = field(default_factory=dict)
    """Its search attributes (ctx.set_attributes), as stored: a datetime as ISO text."""


@dataclass(frozen=True)
class StartResult:
    execution_id: uuid.UUID
    created: bool
    """False when an execution with that workflow_id already existed and was returned."""
    state: State


@dataclass(frozen=True)
class HistoryEvent:
    seq: int
    position: int | None
    kind: str
    name: str
    payload: dict[str, Any]
    recorded_at: datetime | None = None


@dataclass(frozen=True)
class Signal:
    """A signal a workflow received (`ctx.receive`, `ctx.wait_until` handlers).

    The same on the first run and on replay: it is read back from history.
    """

    name: str
    payload: Any
    """What the sender sent; None for a signal without payload (it still arrived)."""
    signal_id: int
    idempotency_key: str | None
    received_at: datetime


@dataclass(frozen=True)
class SignalRequest:
    """One signal for `Client.signal_many` (and `ctx.signal_external_many`)."""

    execution_id: str | uuid.UUID
    name: str
    payload: Any = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class RunView:
    """One run as `shardq workflow show`, `GET /workflows/{id}` and the inbox show it."""

    execution: Execution
    wait: WaitInfo | None
    """The open wait; None when the run waits for nothing."""
    pending: list[BufferedSignal]
    """Signals buffered for it, oldest first."""
    history: list[HistoryEvent]
    rate_limited: RateWait | None = None
    """The slot of a rate limiter the run is parked for; None when it waits for none."""
    children: list[ChildInfo] = field(default_factory=list)
    """The runs it started (ctx.start_child), in start order."""


@dataclass(frozen=True)
class OutboxEntry:
    """A signal on its way between shards (the outbox, docs/signals.md), as a run's page
    shows it: pending (in retry when `attempts` > 0) or failed for good. Delivered rows
    are deleted."""

    id: int
    source_execution_id: uuid.UUID
    source_position: int
    target_execution_id: uuid.UUID
    signal_name: str
    state: str
    attempts: int
    next_attempt_at: datetime
    failure_reason: str | None
    queued_at: datetime


@dataclass(frozen=True)
class RunOutbox:
    """The outbox rows of one run: those it owes (it sent them) and is owed (sent to it),
    oldest first; `unavailable_shards` names the shards that could not be read."""

    owes: list[OutboxEntry]
    owed: list[OutboxEntry]
    unavailable_shards: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpdateResult:
    """What Client.update returns: the handler's response, once committed."""

    execution_id: uuid.UUID
    update_id: int
    """The stored update (its signal's id); a keyed repeat names the first one."""
    response: Any
    accepted: bool
    """False when the idempotency key had already landed: `response` is the recorded one."""
    created: bool = False
    """update_with_start: whether this call started the run."""


@dataclass(frozen=True)
class SignalResult:
    execution_id: uuid.UUID
    signal_id: int | None
    """The stored signal (the earlier one for a collapsed repeat); None when refused."""
    delivered: bool
    """False when the idempotency key had already landed (the repeat was collapsed)
    or the signal was refused."""
    error: WorkflowError | None = None
    """Why the signal was refused (ExecutionNotFound, SignalRefused); `signal_many` only,
    `signal` raises it."""
    signal_name: str | None = None
    """The stored signal's name. Idempotency keys are per execution, not per name: a
    repeat whose key landed with another name says so here."""


@dataclass(frozen=True)
class Claim:
    """A leased task with everything a turn needs, read in the claim's round trip."""

    execution_id: uuid.UUID
    lease_token: uuid.UUID
    claims: int
    tenant: str
    workflow_name: str
    workflow_version: int
    workflow_id: str
    input: Any
    cancel_requested: bool
    db_now: datetime
    history: tuple[HistoryEvent, ...]
    signals: tuple[BufferedSignal, ...]
    trace: str | None = None
    """The start's traceparent (core/tracing.py): a first turn continues it."""


class TaskAction(StrEnum):
    """What a commit does to the execution's task row."""

    KEEP = "keep"
    """Mid-turn checkpoint: the lease stays (the heartbeat extends it, not the commit)."""
    DELETE = "delete"
    """The run finished or parked on a wait with no deadline."""
    SCHEDULE = "schedule"
    """Release the lease; the run is due again `delay` seconds after the turn chose it."""


@dataclass(frozen=True)
class NewEvent:
    position: int | None
    kind: Event
    name: str
    payload: dict[str, Any]
    wake_in: float | None = None
    """When set, the store adds `wake_at` = database now + wake_in seconds to the payload."""


@dataclass(frozen=True)
class OpenWait:
    position: int
    kind: str
    name: str
    deadline_in: float | None = None
    request: dict[str, Any] | None = None


def _seed_tokens() -> None:
    global _token_prefix, _token_counter  # noqa: PLW0603 - the process's token source
    _token_prefix = int.from_bytes(os.urandom(8), "big") << 64
    _token_counter = itertools.count(1)


_token_prefix = 0
_token_counter = itertools.count(1)
_seed_tokens()
os.register_at_fork(after_in_child=_seed_tokens)


def fresh_token() -> uuid.UUID:
    """A lease token no other commit holds: 64 random bits drawn once per process
    (again in a forked child), then a counter.

    A token is only ever compared for equality with the one a run's task row
    carries, so it needs to be unique, not unpredictable. uuid4() per commit is
    an urandom() syscall, which releases the GIL: among a worker's hundred turn
    threads that would be a thread switch per commit.
    """
    return uuid.UUID(int=_token_prefix | next(_token_counter))


@dataclass
class TurnCommit:
    """One atomic, lease-fenced write of a turn: events, state, wait, task.

    `next_token` replaces the lease token in the same commit, which makes a
    commit safe to retry after an ambiguous failure (connection lost before the
    COMMIT was acknowledged): if the row already carries `next_token`, the
    earlier attempt landed.
    """

    execution_id: uuid.UUID
    lease_token: uuid.UUID
    next_token: uuid.UUID = field(default_factory=fresh_token)
    events: list[NewEvent] = field(default_factory=list)
    state: State | None = None
    output_json: str | None = None
    error: dict[str, Any] | None = None
    task: TaskAction = TaskAction.KEEP
    delay: float = 0.0
    decided_at: float = field(default_factory=time.monotonic)
    """When the turn chose `delay` (time.monotonic()): it, its timers' wake_in and its
    wait's deadline_in count from here, not from when the commit reaches the database
    (the completer's queue, a retried commit)."""
    open_wait: OpenWait | None = None
    close_wait: bool = False
    consumed_signals: list[tuple[int, int]] = field(default_factory=list)
    """(signal id, position) pairs consumed by this turn."""
    wake_on_signals: tuple[str, ...] = ()
    """Parking on signals of these names: if one is already pending, the task stays due."""
    externals: list[ExternalRequest] = field(default_factory=list)
    """Signals to other runs of the shard, delivered in this commit."""
    outbox: list[OutboxRequest] = field(default_factory=list)
    """Signals to runs of other shards, written to the outbox in this commit."""
    children: list[ChildStart] = field(default_factory=list)
    """Child runs this commit starts (ctx.start_child)."""
    continued: tuple[str, int, int] | None = None
    """ctx.continue_as_new: the next generation's input JSON, number and first position."""
    family: tuple[uuid.UUID | None] | None = None
    """Set for a run that is a child (its parent) or started children ((None,)): a commit
    that ends it tells its parent and its children."""
    trace: str | None = None
    """The turn's traceparent (core/tracing.py): the signals it sends carry it."""


@dataclass(frozen=True)
class ExternalRequest:
    """A `ctx.signal_external` to a run of the sender's shard, made by its turn's commit."""

    position: int
    target: uuid.UUID
    name: str
    payload_json: str
    idempotency_key: str | None


@dataclass(frozen=True)
class OutboxRequest:
    """A `ctx.signal_external` to a run of another shard: an outbox row of its commit."""

    position: int
    target: uuid.UUID
    target_bucket: int
    name: str
    payload_json: str
    idempotency_key: str | None


@dataclass(frozen=True)
class ExternalSignal:
    """What `ctx.signal_external` did with a signal.

    To a run of the sender's shard: delivered (`delivered=True`, `signal_id`
    set) or found delivered already under its key (`delivered=False`). To a run
    of another shard: `queued=True`, no `signal_id`: the outbox relay delivers
    it; if it cannot, the sender's history gets an `external.failed` event.
    """

    target: uuid.UUID
    name: str
    signal_id: int | None
    delivered: bool
    idempotency_key: str | None
    queued: bool = False
    error: ExternalSignalFailed | None = None
    """Set, in `ctx.signal_external_many`'s results, for a signal the target refused."""


@dataclass(frozen=True)
class CommitOutcome:
    landed: bool
    """False when the lease was lost: nothing of the commit was written."""
    cancel_requested: bool = False
    externals: tuple[dict[str, Any], ...] | None = None
    """The outcomes of the commit's signals to other runs, as recorded in its history
    (None when it sent none, or when they are not known: a retry found it landed)."""


@dataclass(frozen=True)
class Page:
    items: list[Execution]
    next_cursor: str | None


@dataclass(frozen=True)
class SignalWithStartResult:
    execution_id: uuid.UUID
    created: bool
    """True when this call started the run (the signal was buffered before its first turn)."""
    delivered: bool
    """False when the idempotency key had already landed on that run."""
    signal_id: int | None
    signal_name: str | None


@dataclass(frozen=True)
class WaitInfo:
    """What a parked run waits for (`shardq workflow show`)."""

    kind: str
    name: str
    started_at: datetime
    deadline: datetime | None
    request: Any


@dataclass(frozen=True)
class BufferedSignal:
    """A signal that arrived and is not consumed yet: what a claim hands the turn and
    what a client reads of a run. `received_at` is the database's clock at arrival,
    which decides whether it came before a wait's deadline."""

    id: int
    name: str
    payload: Any
    idempotency_key: str | None
    received_at: datetime
    trace: str | None = field(default=None, compare=False, repr=False)  # the sender's


INTERRUPT_ACTIONS = ("approve", "edit", "reject")
"""What a person may answer an interrupt with; `cancel` (Client.cancel) always ends the run."""


@dataclass(frozen=True)
class Decision:
    """How an interrupt was resolved: the same on the first run and on replay.

    `action` is one of the interrupt's actions, `cancel`, or `timed_out` (its
    deadline passed: never an approval; then there is no id, actor or payload).
    """

    action: str
    payload: Any
    decision_id: str | None
    actor: str | None
    decided_at: datetime

    @classmethod
    def from_event(cls, payload: dict[str, Any]) -> Decision:
        return cls(payload["action"], payload.get("payload"), payload.get("decision_id"),
                   payload.get("actor"), datetime.fromisoformat(payload["decided_at"]))

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "payload": self.payload, "decision_id": self.decision_id,
                "actor": self.actor, "decided_at": self.decided_at.isoformat()}


@dataclass(frozen=True)
class DecisionResult:
    decision: Decision
    accepted: bool
    """False when this decision id had been accepted before: the call changed nothing."""


@dataclass(frozen=True)
class PendingInterrupt:
    """An open interrupt: a run in `input_required`, waiting for a person."""

    execution_id: uuid.UUID
    tenant: str
    workflow_name: str
    workflow_id: str
    name: str
    prompt: str
    actions: tuple[str, ...]
    schema: dict[str, Any] | None
    requested_at: datetime
    deadline: datetime | None
    value: Any = None
    """What is under review (`ctx.interrupt(value=...)`), None when the request has none."""


@dataclass(frozen=True)
class InterruptPage:
    items: list[PendingInterrupt]
    next_cursor: str | None


@dataclass(frozen=True)
class StaleBounds:
    """When an open wait counts as stale: open longer than its kind's bound (None: never
    by age alone), or past its deadline by more than `grace_s` and not woken.

    Separate from every deadline a workflow sets: a bound is an operator's
    expectation of how long waits of a kind usually last, not a timeout.
    """

    timer_s: float | None = None
    signal_s: float | None = 7 * 86400.0
    condition_s: float | None = 7 * 86400.0
    interrupt_s: float | None = 3 * 86400.0
    grace_s: float = 300.0

    def params(self) -> dict[str, float | None]:
        return {"timer_s": self.timer_s, "signal_s": self.signal_s,
                "condition_s": self.condition_s, "interrupt_s": self.interrupt_s,
                "grace_s": self.grace_s}


@dataclass(frozen=True)
class StaleWait:
    execution_id: uuid.UUID
    tenant: str
    workflow_name: str
    kind: str
    name: str
    age_s: float
    deadline: datetime | None


@dataclass(frozen=True)
class ShardHealth:
    """What the store exporter reads of one shard in one scrape."""

    open_waits: list[tuple[str, str, int]]
    """(kind, workflow, count)."""
    stale_waits: list[tuple[str, str, int, float]]
    """(kind, workflow, count, oldest age in seconds)."""
    pending_signals: int
    overdue_tasks: int
    oldest_overdue_s: float | None
    runs_by_state: dict[str, int]
    due_by_priority: dict[int, int]
    """Tasks due now and not running, by priority level (levels without any left out)."""
    concurrency_waiting: int = 0
    """Runs due but waiting for a slot of their concurrency key."""
    concurrency_keys_waiting: int = 0
    """Concurrency keys with a run waiting for a slot."""
    tenants_due: int = 0
    """Tenants with unpinned runs due at priority 0 and not running (docs/flow-control.md)."""
    rate_limiters: list[tuple[str, int, float]] = field(default_factory=list)
    """(limiter, steps parked for a slot, seconds until its next free slot); the home
    shard's, none elsewhere."""
