"""The context a workflow function receives: every call it offers is safe to replay.

Each call takes the next position of the run's history (shardq.workflow.replay)
and returns what is recorded there, or does its work and buffers what it did
(shardq.workflow.journal): a step commits the buffer before it runs; parking,
completion and failure end the turn (shardq.worker.turn) with the rest.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from shardq.core import tracing
from shardq.core.children import ChildHandle
from shardq.core.errors import (
    InvalidArgument,
    NonDeterminismError,
    SignalTimedOut,
    StepFailed,
)
from shardq.core.models import (
    INTERRUPT_ACTIONS,
    BufferedSignal,
    Claim,
    Decision,
    Event,
    ExternalSignal,
    HistoryEvent,
    NewEvent,
    OpenWait,
    Signal,
    SignalRequest,
    State,
    TaskAction,
)
from shardq.core.rules import (
    Limits,
    check_name,
    check_signal_name,
)
from shardq.workflow.arguments import (
    check_condition,
    check_interrupt,
    check_interrupt_value,
    check_timeout,
)
from shardq.workflow.attributes import AttributeCalls
from shardq.workflow.children import ChildCalls, Definitions
from shardq.workflow.continuation import ContinueCalls
from shardq.workflow.contracts import UPDATE_PREFIX, UpdateSpec
from shardq.workflow.control import Cancelled, Park
from shardq.workflow.externals import record_externals
from shardq.workflow.handlers import StateHandlers
from shardq.workflow.journal import Journal
from shardq.workflow.rates import RateSlots, wait_for_slot
from shardq.workflow.recorded import (
    external_result,
    signal_of,
)
from shardq.workflow.replay import Replay
from shardq.workflow.retry import RetryPolicy
from shardq.workflow.steps import attempt_step, run_attempt
from shardq.workflow.versions import PatchCalls

T = TypeVar("T")



class WorkflowContext(ChildCalls, ContinueCalls, PatchCalls, AttributeCalls):
    """What a workflow function can do. Every method is safe to replay.

    Made by the turn for one run of the function, on its turn thread: `replay`
    walks the claim's history, `journal` collects what the calls record.
    """

    def __init__(
        self, claim: Claim, replay: Replay, journal: Journal,
        on_this_shard: Callable[[uuid.UUID], bool] | None = None,
        *, state: object | None = None, updates: Sequence[UpdateSpec] = (),
        limits: Limits | None = None, rate_slots: RateSlots | None = None,
        registry: Definitions | None = None,
    ) -> None:
        self._claim = claim
        self._registry = registry
        self._outcomes: dict[uuid.UUID, dict[str, Any]] = {}
        self._kept: list[ChildHandle] = []
        self._rate_slots = rate_slots
        self._limits = limits or Limits()
        self._handlers = StateHandlers(state, updates)
        self._on_this_shard = on_this_shard
        self._replay = replay
        self._journal = journal
        self._started = time.monotonic()
        self._pending = replay.pending
        self._cancel = claim.cancel_requested
        self._random: random.Random | None = None

    # -- identity --------------------------------------------------------------

    @property
    def execution_id(self) -> uuid.UUID:
        return self._claim.execution_id

    @property
    def workflow_id(self) -> str:
        return self._claim.workflow_id

    @property
    def tenant(self) -> str:
        return self._claim.tenant

    @property
    def input(self) -> Any:
        return self._claim.input

    @property
    def state(self) -> Any:
        """A class-based workflow's instance (its `self`); None for a function workflow."""
        return self._handlers.state

    @property
    def lease_token(self) -> uuid.UUID:
        return self._journal.lease_token

    @property
    def random(self) -> random.Random:
        """Deterministic randomness: the same sequence on every replay of this execution."""
        self._guard()
        if self._random is None:  # seeding costs more than a no-op step: only on use
            self._random = random.Random(self._claim.execution_id.int)
        return self._random

    def uuid(self) -> uuid.UUID:
        """A UUID that is the same on every replay (drawn from `ctx.random`)."""
        return uuid.UUID(int=self.random.getrandbits(128), version=4)

    # -- calls -----------------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        retry: RetryPolicy | int | None = None,
        timeout: float | None = None,
        rate_limit: str | None = None,
        **kwargs: Any,
    ) -> T:
        """Run `fn(*args, **kwargs)` once, durably; on replay return its recorded result.

        The result must be JSON-serialisable; it is returned as JSON gives it back
        (tuples become lists), identically on the first run and on replay.
        A failure is retried per `retry` after a durable backoff; when retries are
        exhausted StepFailed is raised here, and again at this call on replay.
        `timeout` bounds one attempt (the attempt's thread cannot be killed and is
        left to finish in the background; its result is ignored). `rate_limit` names a
        limiter (`registry.rate_limiter`) whose slot each attempt waits for (rates.py).
        """
        check_name(name, "step")
        if rate_limit is not None:
            check_name(rate_limit, "rate limiter")
        policy = RetryPolicy.of(retry)
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidArgument(f"step {name!r}: timeout must be a positive number of seconds")
        self._guard()
        position, recorded = self._replay.next("step", name)
        for event in recorded:
            if event.kind == Event.STEP_COMPLETED:
                return event.payload["result"]  # type: ignore[no-any-return]
            if event.kind == Event.STEP_FAILED and event.payload.get("final"):
                error = event.payload["error"]
                raise StepFailed(name, error["type"], error["message"], event.payload["attempt"])
        # A new position (the common case) has no failed attempts to count.
        attempt = 1 + sum(1 for e in recorded if e.kind == Event.STEP_FAILED) if recorded else 1
        self._journal.flush()
        self._cancel = self._cancel or self._journal.cancel_requested
        if self._cancel:  # learnt from the checkpoint just committed
            raise Cancelled()
        if rate_limit is not None:
            wait_for_slot(self._rate_slots, rate_limit, self.execution_id, position, attempt)
        with tracing.span("shardq.step", attributes={
                "shardq.step": name, "shardq.position": position, "shardq.attempt": attempt,
        }) if tracing.active() else nullcontext():
            return attempt_step(self._journal, position, name, attempt,  # type: ignore[no-any-return]
                                lambda: run_attempt(fn, args, kwargs, timeout), policy)

    def sleep(self, name: str, seconds: float) -> None:
        """Wait `seconds` on a durable timer whose wake time the database's clock sets."""
        check_name(name, "timer")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise InvalidArgument(
                f"sleep {name!r}: seconds must be a positive number, got {seconds!r}"
            )
        self._guard()
        position, recorded = self._replay.next("sleep", name)
        kinds = {e.kind: e for e in recorded}
        started = kinds.get(Event.TIMER_STARTED)
        if started is not None:  # a running worker keeps the recorded wake time
            self._replay.argument(position, f"sleep {name!r}", "seconds",
                                  started.payload.get("seconds"), seconds)
        self._replay_updates(recorded)
        if Event.TIMER_FIRED in kinds:
            return
        self._take_updates(position)
        if started is None:
            self._journal.events.append(NewEvent(
                position, Event.TIMER_STARTED, name, {"seconds": seconds}, wake_in=seconds
            ))
            raise Park(
                state=State.WAITING, task=TaskAction.SCHEDULE, delay=seconds,
                open_wait=OpenWait(position, "timer", name, deadline_in=seconds),
            )
        remaining = self._until(started.payload["wake_at"])
        if remaining > 0:
            raise Park(state=State.WAITING, task=TaskAction.SCHEDULE, delay=remaining)
        self._journal.events.append(NewEvent(position, Event.TIMER_FIRED, name, {}))
        self._journal.close_wait = True

    def receive(self, name: str, timeout: float | None = None) -> Signal | None:
        """The oldest unconsumed signal `name`, parking until one arrives.

        Signals that arrived early are buffered and consumed oldest first. With a
        `timeout` (seconds, > 0) the wait gives up at a database-clock deadline
        and returns None; a signal sent without payload is still a `Signal`
        (its `.payload` is None), so the two never look alike. Which of the two
        happened is decided by the times the store recorded, not by when a
        worker ran: a signal received by the deadline is returned however late
        the run resumes, and one received after it does not count here (it
        stays buffered for a later receive).
        """
        check_signal_name(name)
        check_timeout(timeout, f"receive {name!r}")
        self._guard()
        position, recorded = self._replay.next("signal", name)
        kinds = {e.kind: e for e in recorded}
        self._replay_updates(recorded)
        if Event.SIGNAL_CONSUMED in kinds:
            return signal_of(name, kinds[Event.SIGNAL_CONSUMED].payload)
        if Event.SIGNAL_TIMED_OUT in kinds:
            return None
        self._take_updates(position)
        waiting = kinds.get(Event.SIGNAL_WAITING)
        deadline = waiting.payload.get("wake_at") if waiting is not None else None
        cutoff = datetime.fromisoformat(deadline) if deadline else None
        arrived = next((s for s in self._pending if s.name == name
                        and (cutoff is None or s.received_at <= cutoff)), None)
        if arrived is not None:
            journal = self._journal
            payload = self._consume(arrived, position)
            journal.events.append(NewEvent(position, Event.SIGNAL_CONSUMED, name, payload))
            journal.close_wait = journal.close_wait or waiting is not None
            return signal_of(name, payload)
        if waiting is None:
            self._journal.events.append(NewEvent(
                position, Event.SIGNAL_WAITING, name, {"timeout": timeout}, wake_in=timeout
            ))
            raise Park(
                state=State.WAITING,
                task=TaskAction.SCHEDULE if timeout else TaskAction.DELETE,
                delay=timeout or 0.0,
                open_wait=OpenWait(position, "signal", name, deadline_in=timeout),
                wake_on_signals=(name,),
            )
        remaining = self._until(deadline) if deadline else None
        if remaining is not None and remaining <= 0:
            # The store grants this only if its clock agrees and no signal it
            # received by the deadline is left (defer_premature_timeouts).
            self._journal.events.append(NewEvent(position, Event.SIGNAL_TIMED_OUT, name, {}))
            self._journal.close_wait = True
            return None
        raise Park(
            state=State.WAITING,
            task=TaskAction.SCHEDULE if remaining else TaskAction.DELETE,
            delay=remaining or 0.0,
            wake_on_signals=(name,),
        )

    def interrupt(
        self,
        name: str,
        prompt: str,
        actions: Sequence[str] = INTERRUPT_ACTIONS,
        *,
        schema: dict[str, Any] | None = None,
        timeout: float | None = None,
        value: Any = None,
    ) -> Decision:
        """Ask a person: the run is `input_required` until one decision resolves this.

        `value` is what is under review (a proposal, a draft): stored with the
        request, shown to the reviewer, and what the inbox's edit form starts
        from, so an edit changes fields instead of retyping them. With a
        `schema` it must match it, as an edit's payload must. None: nothing.

        A decision (Client.decide, `shardq workflow decide`) is one of `actions`,
        carries a decision id and an actor, and for `edit` a payload that must
        match `schema` (JSON Schema, Draft 2020-12). It is returned here on the
        first run and on replay alike. With a `timeout` (seconds, > 0) the
        deadline resolves it as `timed_out`, never as an approval: the workflow
        decides what that means. A decision the store accepted before the
        deadline is returned however late the run resumes; one sent after it is
        refused. A cancel of the run is a decision too (the run
        then ends `cancelled` here). History keeps the request, the decision and
        every refused attempt.
        """
        accepted = check_interrupt(name, prompt, actions, schema, timeout)
        self._guard()
        position, recorded = self._replay.next("interrupt", name)
        kinds = {e.kind: e for e in recorded}
        self._replay_updates(recorded)
        if Event.INTERRUPT_DECIDED in kinds:
            decision = Decision.from_event(kinds[Event.INTERRUPT_DECIDED].payload)
            if decision.action == "cancel":
                raise Cancelled()
            return decision
        if Event.INTERRUPT_TIMED_OUT in kinds:
            return Decision.from_event(kinds[Event.INTERRUPT_TIMED_OUT].payload)
        self._take_updates(position)
        requested = kinds.get(Event.INTERRUPT_REQUESTED)
        if requested is None:
            request = {"prompt": prompt, "actions": list(accepted), "schema": schema,
                       "timeout": timeout}
            if value is not None:
                request["value"] = check_interrupt_value(name, value, schema, self._limits)
            self._journal.events.append(NewEvent(
                position, Event.INTERRUPT_REQUESTED, name, request, wake_in=timeout
            ))
            raise Park(
                state=State.INPUT_REQUIRED,
                task=TaskAction.SCHEDULE if timeout else TaskAction.DELETE,
                delay=timeout or 0.0,
                open_wait=OpenWait(position, "interrupt", name, deadline_in=timeout,
                                   request=request),
            )
        deadline = requested.payload.get("wake_at")
        remaining = self._until(deadline) if deadline else None
        if deadline and remaining is not None and remaining <= 0:
            # Granted by the store only if no decision landed meanwhile.
            outcome = {"action": "timed_out", "decided_at": deadline}
            self._journal.events.append(NewEvent(
                position, Event.INTERRUPT_TIMED_OUT, name, outcome
            ))
            self._journal.close_wait = True
            return Decision.from_event(outcome)
        raise Park(
            state=State.INPUT_REQUIRED,
            task=TaskAction.SCHEDULE if remaining else TaskAction.DELETE,
            delay=remaining or 0.0,
        )

    def wait_for_signal(self, name: str, timeout: float | None = None) -> Any:
        """The payload of the oldest unconsumed signal `name` (the short form of `receive`).

        At a `timeout`'s deadline it raises SignalTimedOut, which the workflow
        may catch: a payload of None always means a signal arrived without one.
        """
        received = self.receive(name, timeout)
        if received is None:
            raise SignalTimedOut(name)
        return received.payload

    def wait_until(
        self,
        predicate: Callable[[], object],
        *,
        on: Mapping[str, Callable[[Signal], object]],
        timeout: float | None = None,
        name: str = "condition",
    ) -> bool:
        """Wait until `predicate()` holds; True when it does, False at the deadline.

        `on` maps signal names to handlers: each signal of those names that
        arrives is consumed, oldest first, and passed to its handler, which
        updates the workflow's own state; the predicate is evaluated before the
        first and after each one. Signals of other names stay buffered for later
        waits. With a `timeout` (seconds, > 0) only signals received before the
        database-clock deadline count, and the call returns False once it passed.

        Replay feeds the handlers the same signals in the same order and
        re-evaluates the predicate at the same points, so both must depend only
        on workflow state: no time, randomness or I/O (ctx calls inside them are
        refused; a predicate that answers differently on replay fails the run
        with a non-determinism error).
        """
        check_condition(name, on, timeout)
        self._guard()
        position, recorded = self._replay.next("condition", name)
        waiting = next((e for e in recorded if e.kind == Event.CONDITION_WAITING), None)
        met, outcome = self._replay_condition(position, name, recorded, predicate, on)
        if outcome is not None:
            return met
        deadline = waiting.payload.get("wake_at") if waiting is not None else None
        journal = self._journal
        if self._take_updates(position):
            met = self._handlers.holds(predicate)
        if not met:
            met = self._feed_condition(position, name, predicate, on, deadline)
        if met:
            journal.events.append(NewEvent(position, Event.CONDITION_MET, name, {}))
            journal.close_wait = journal.close_wait or waiting is not None
            return True
        names = tuple(sorted(on))
        if waiting is None:
            journal.events.append(NewEvent(
                position, Event.CONDITION_WAITING, name,
                {"timeout": timeout, "signals": list(names)}, wake_in=timeout,
            ))
            raise Park(
                state=State.WAITING,
                task=TaskAction.SCHEDULE if timeout else TaskAction.DELETE,
                delay=timeout or 0.0,
                open_wait=OpenWait(position, "condition", name, deadline_in=timeout,
                                   request={"signals": list(names)}),
                wake_on_signals=names,
            )
        remaining = self._until(deadline) if deadline else None
        if remaining is not None and remaining <= 0:
            # Granted by the store only if no handled signal received by the
            # deadline is left unconsumed (defer_premature_timeouts).
            journal.events.append(NewEvent(position, Event.CONDITION_TIMED_OUT, name, {}))
            journal.close_wait = True
            return False
        raise Park(
            state=State.WAITING,
            task=TaskAction.SCHEDULE if remaining else TaskAction.DELETE,
            delay=remaining or 0.0,
            wake_on_signals=names,
        )

    def _replay_condition(
        self, position: int, name: str, recorded: Sequence[HistoryEvent],
        predicate: Callable[[], object], on: Mapping[str, Callable[[Signal], object]],
    ) -> tuple[bool, Event | None]:
        """Feed the handlers what history recorded: (whether the predicate holds, the
        recorded outcome if any). Raises NonDeterminismError where replay disagrees."""
        met = self._handlers.holds(predicate)
        outcome = None
        for event in recorded:
            if event.kind == Event.UPDATE_COMPLETED:
                self._handlers.apply_update(event.name, event.payload["payload"])
                met = self._handlers.holds(predicate)
            elif event.kind == Event.CONDITION_CONSUMED:
                signal = signal_of(event.payload["signal"], event.payload)
                if met or signal.name not in on:
                    raise self._diverged(position, name)
                self._handlers.handle(on[signal.name], signal)
                met = self._handlers.holds(predicate)
            elif event.kind in (Event.CONDITION_MET, Event.CONDITION_TIMED_OUT):
                outcome = Event(event.kind)
        if outcome is not None and met != (outcome == Event.CONDITION_MET):
            raise self._diverged(position, name)
        return met, outcome

    def _feed_condition(
        self, position: int, name: str, predicate: Callable[[], object],
        on: Mapping[str, Callable[[Signal], object]], deadline: str | None,
    ) -> bool:
        """Consume buffered signals of the handled names until the predicate holds."""
        cutoff = datetime.fromisoformat(deadline) if deadline else None
        while True:
            arrived = next((
                s for s in self._pending if s.name in on
                and (cutoff is None or s.received_at <= cutoff)
            ), None)
            if arrived is None:
                return False
            payload = self._consume(arrived, position)
            self._journal.events.append(NewEvent(
                position, Event.CONDITION_CONSUMED, name, {**payload, "signal": arrived.name}
            ))
            self._handlers.handle(on[arrived.name], signal_of(arrived.name, payload))
            if self._handlers.holds(predicate):
                return True

    # -- updates (shardq.workflow.contracts) ----------------------------------------

    def _replay_updates(self, recorded: Sequence[HistoryEvent]) -> None:
        """Apply the updates recorded at this wait again, in their order (replay)."""
        for event in recorded:
            if event.kind == Event.UPDATE_COMPLETED:
                self._handlers.apply_update(event.name, event.payload["payload"])

    def _take_updates(self, position: int) -> bool:
        """Handle the updates that arrived, oldest first, at the wait at `position`:
        each one's response (or error) is recorded there. Whether there were any."""
        arrived = [s for s in self._pending if s.name.startswith(UPDATE_PREFIX)]
        for update in arrived:
            name = update.name[len(UPDATE_PREFIX):]
            recorded = self._consume(update, position)
            outcome = self._handlers.apply_update(name, update.payload)
            self._journal.events.append(NewEvent(
                position, Event.UPDATE_COMPLETED, name, {**recorded, **outcome}))
        return bool(arrived)

    def _consume(self, arrived: BufferedSignal, position: int) -> dict[str, Any]:
        """Take a buffered signal for the call at `position`: what its event records."""
        self._pending.remove(arrived)
        self._journal.consumed.append((arrived.id, position))
        return {"signal_id": arrived.id, "payload": arrived.payload,
                "idempotency_key": arrived.idempotency_key,
                "received_at": arrived.received_at.isoformat()}

    def _diverged(self, position: int, name: str) -> NonDeterminismError:
        return NonDeterminismError(
            f"non-deterministic workflow at position {position}: condition {name!r} "
            "answered differently on replay than when it was recorded (its predicate and "
            "handlers must depend only on workflow state: no time, randomness or I/O)"
        )

    def _guard(self) -> None:
        """Every call first: refused inside a condition, unwinds a cancelled run."""
        if self._handlers.running:
            raise InvalidArgument("a wait_until predicate, its handlers and update handlers "
                                  "must not call ctx: they run again on replay and must "
                                  "depend only on workflow state")
        if self._cancel:
            raise Cancelled()

    def signal_external(
        self,
        target: str | UUID,
        name: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
    ) -> ExternalSignal:
        """Signal another run, durably, from this one; the same rules as a client's signal.

        The target must be of this run's tenant (another tenant's run counts as
        not found). Returns once this turn's commit recording the call is
        durable. A target on this run's shard gets the signal in that very
        commit (a target that cannot take it raises ExternalSignalFailed with a
        `reason_code`). A target on another shard gets it through the outbox:
        the commit writes an outbox row, the outbox relay delivers it (exactly
        once, in send order per target) and the call returns `queued=True`; a
        target that cannot take it then is recorded as an `external.failed`
        event in this run's history. Replay returns the recorded outcome and
        sends nothing, even if the code now computes another key.
        """
        (sent,) = self.signal_external_many(
            [SignalRequest(target, name, payload, idempotency_key)])
        if sent.error is not None:
            raise sent.error
        return sent

    def signal_external_many(self, signals: Sequence[SignalRequest]) -> list[ExternalSignal]:
        """Signal many runs in one commit: a fan-out pays one round trip, not one per target.

        Each signal is what `signal_external` makes of it, and takes a call
        position of its own, in the order given; results come back in that order.
        A signal a target of this shard refused carries `error` (an
        ExternalSignalFailed with its `reason_code`) instead of raising, so the
        others stand. A bad name, key or payload raises before anything is sent.
        """
        journal = self._journal
        results, here = record_externals(signals, self._replay, journal, limits=self._limits,
                                         on_this_shard=self._on_this_shard, guard=self._guard)
        if journal.externals or journal.outbox:
            journal.flush()
            self._cancel = self._cancel or journal.cancel_requested
            # journal.sent answers this flush's externals; with none it is an earlier one's.
            if here:
                for index, outcome in zip(here, journal.sent, strict=True):
                    results[index] = external_result(outcome)
        return [r for r in results if r is not None]

    def now(self) -> datetime:
        """The database's current time, recorded so replay sees the same instant."""
        self._guard()
        position, recorded = self._replay.next("now", "now")
        if recorded:
            return datetime.fromisoformat(recorded[0].payload["at"])
        value = self._db_now()
        self._journal.events.append(
            NewEvent(position, Event.CLOCK_READ, "now", {"at": value.isoformat()})
        )
        return value

    # -- clock -----------------------------------------------------------------

    def _db_now(self) -> datetime:
        return self._claim.db_now + timedelta(seconds=time.monotonic() - self._started)

    def _until(self, iso: str) -> float:
        return (datetime.fromisoformat(iso) - self._db_now()).total_seconds()
