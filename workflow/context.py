"""The context a workflow function receives: every call it offers is safe to replay.

Each call takes the next position of the run's history (shardq.workflow.replay)
and returns what is recorded there, or does its work and buffers what it did
(shardq.workflow.journal): a step commits the buffer before it runs; parking,
completion and failure end the turn (shardq.worker.turn) with the rest.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar
from uuid import UUID

from shardq.core.errors import (
    ExternalSignalFailed,
    InvalidArgument,
    NonDeterminismError,
    NotSerializable,
    SignalTimedOut,
    StepFailed,
)
from shardq.core.instruments import STEP_ATTEMPTS, STEP_SECONDS
from shardq.core.models import (
    INTERRUPT_ACTIONS,
    Claim,
    Decision,
    Event,
    ExternalRequest,
    ExternalSignal,
    HistoryEvent,
    NewEvent,
    OpenWait,
    OutboxRequest,
    PendingSignal,
    Signal,
    SignalRequest,
    State,
    TaskAction,
)
from shardq.core.rules import (
    Limits,
    check_name,
    check_schema,
    check_signal,
    check_signal_name,
    check_text,
    payload_json,
    validate,
)
from shardq.shards.routing import bucket_of, parse_execution_id
from shardq.workflow.contracts import UPDATE_PREFIX, UpdateSpec
from shardq.workflow.control import Cancelled, Park
from shardq.workflow.journal import Journal
from shardq.workflow.replay import Replay
from shardq.workflow.retry import RetryPolicy

T = TypeVar("T")
MAX_ERROR_TEXT = 8000
_STEP_COMPLETED, _STEP_RETRIED, _STEP_FAILED = (
    STEP_ATTEMPTS.labels(o) for o in ("completed", "retried", "failed"))
MAX_PROMPT = 4000
MAX_EXTERNAL_BATCH = 10_000
"""Signals one `signal_external_many` call may send: its targets are locked in one commit."""
"""Characters of an interrupt's prompt: what a reviewer reads, not a document store."""


class StepTimeout(Exception):
    """A step attempt ran longer than its `timeout`."""


def error_payload(exc: BaseException) -> dict[str, Any]:
    """How a run's or a step's failure is recorded: type, message, the traceback's end."""
    text = "".join(traceback.format_exception(exc))
    return {
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": text[-MAX_ERROR_TEXT:],
    }


class WorkflowContext:
    """What a workflow function can do. Every method is safe to replay.

    Made by the turn for one run of the function, on its turn thread: `replay`
    walks the claim's history, `journal` collects what the calls record.
    """

    def __init__(
        self, claim: Claim, replay: Replay, journal: Journal,
        on_this_shard: Callable[[uuid.UUID], bool] | None = None,
        *, state: object | None = None, updates: Sequence[UpdateSpec] = (),
        limits: Limits | None = None,
    ) -> None:
        self._claim = claim
        self._limits = limits or Limits()
        self._state = state
        self._updates = {u.name: u for u in updates}
        self._on_this_shard = on_this_shard
        self._replay = replay
        self._journal = journal
        self._started = time.monotonic()
        self._pending = replay.pending
        self._cancel = claim.cancel_requested
        self._random: random.Random | None = None
        self._in_condition = False

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
        return self._state

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
        **kwargs: Any,
    ) -> T:
        """Run `fn(*args, **kwargs)` once, durably; on replay return its recorded result.

        The result must be JSON-serialisable; it is returned as JSON gives it back
        (tuples become lists), identically on the first run and on replay.
        A failure is retried per `retry` after a durable backoff; when retries are
        exhausted StepFailed is raised here, and again at this call on replay.
        `timeout` bounds one attempt (the attempt's thread cannot be killed and is
        left to finish in the background; its result is ignored).
        """
        check_name(name, "step")
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
        self._cancel = self._journal.flush() or self._cancel
        if self._cancel:  # learnt from the checkpoint just committed
            raise Cancelled()
        try:
            started = time.perf_counter()
            try:
                result = _run_attempt(fn, args, kwargs, timeout)
            finally:
                STEP_SECONDS.observe(time.perf_counter() - started)
        except Exception as exc:
            self._step_failed(position, name, attempt, exc, policy)
        try:
            encoded = _json_round_trip(result)
        except (TypeError, ValueError) as exc:
            problem = NotSerializable(
                f"step {name!r} returned {type(result).__name__}, which is not "
                f"JSON-serialisable: {exc}"
            )
            self._step_failed(position, name, attempt, problem, RetryPolicy(max_attempts=1))
        self._journal.events.append(
            NewEvent(position, Event.STEP_COMPLETED, name, {"result": encoded})
        )
        _STEP_COMPLETED.inc()
        return encoded  # type: ignore[no-any-return]

    def _step_failed(
        self, position: int, name: str, attempt: int, exc: Exception, policy: RetryPolicy
    ) -> NoReturn:
        error = error_payload(exc)
        if policy.should_retry(exc, attempt):
            delay = policy.backoff(attempt)
            self._journal.events.append(NewEvent(
                position, Event.STEP_FAILED, name,
                {"attempt": attempt, "error": error, "retry_in": delay}, wake_in=delay,
            ))
            _STEP_RETRIED.inc()
            raise Park(state=State.PENDING, task=TaskAction.SCHEDULE, delay=delay) from exc
        self._journal.events.append(NewEvent(
            position, Event.STEP_FAILED, name, {"attempt": attempt, "error": error, "final": True}
        ))
        _STEP_FAILED.inc()
        raise StepFailed(name, error["type"], error["message"], attempt) from exc

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
        self._replay_updates(recorded)
        if Event.TIMER_FIRED in kinds:
            return
        self._take_updates(position)
        started = kinds.get(Event.TIMER_STARTED)
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
        _check_timeout(timeout, f"receive {name!r}")
        self._guard()
        position, recorded = self._replay.next("signal", name)
        kinds = {e.kind: e for e in recorded}
        self._replay_updates(recorded)
        if Event.SIGNAL_CONSUMED in kinds:
            return _signal(name, kinds[Event.SIGNAL_CONSUMED].payload)
        if Event.SIGNAL_TIMED_OUT in kinds:
            return None
        self._take_updates(position)
        waiting = kinds.get(Event.SIGNAL_WAITING)
        deadline = waiting.payload.get("wake_at") if waiting is not None else None
        cutoff = datetime.fromisoformat(deadline) if deadline else None
        arrived = next((s for s in self._pending if s.name == name
                        and (cutoff is None or _received(s) <= cutoff)), None)
        if arrived is not None:
            journal = self._journal
            payload = self._consume(arrived, position)
            journal.events.append(NewEvent(position, Event.SIGNAL_CONSUMED, name, payload))
            journal.close_wait = journal.close_wait or waiting is not None
            return _signal(name, payload)
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
        _check_condition(name, on, timeout)
        self._guard()
        position, recorded = self._replay.next("condition", name)
        waiting = next((e for e in recorded if e.kind == Event.CONDITION_WAITING), None)
        met, outcome = self._replay_condition(position, name, recorded, predicate, on)
        if outcome is not None:
            return met
        deadline = waiting.payload.get("wake_at") if waiting is not None else None
        journal = self._journal
        if self._take_updates(position):
            met = self._holds(predicate)
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
        met = self._holds(predicate)
        outcome = None
        for event in recorded:
            if event.kind == Event.UPDATE_COMPLETED:
                self._apply_update(event.name, event.payload["payload"])
                met = self._holds(predicate)
            elif event.kind == Event.CONDITION_CONSUMED:
                signal = _signal(event.payload["signal"], event.payload)
                if met or signal.name not in on:
                    raise self._diverged(position, name)
                self._handle(on[signal.name], signal)
                met = self._holds(predicate)
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
                and (cutoff is None or _received(s) <= cutoff)
            ), None)
            if arrived is None:
                return False
            payload = self._consume(arrived, position)
            self._journal.events.append(NewEvent(
                position, Event.CONDITION_CONSUMED, name, {**payload, "signal": arrived.name}
            ))
            self._handle(on[arrived.name], _signal(arrived.name, payload))
            if self._holds(predicate):
                return True

    # -- updates (shardq.workflow.contracts) ----------------------------------------

    def _replay_updates(self, recorded: Sequence[HistoryEvent]) -> None:
        """Apply the updates recorded at this wait again, in their order (replay)."""
        for event in recorded:
            if event.kind == Event.UPDATE_COMPLETED:
                self._apply_update(event.name, event.payload["payload"])

    def _take_updates(self, position: int) -> bool:
        """Handle the updates that arrived, oldest first, at the wait at `position`:
        each one's response (or error) is recorded there. Whether there were any."""
        arrived = [s for s in self._pending if s.name.startswith(UPDATE_PREFIX)]
        for update in arrived:
            name = update.name[len(UPDATE_PREFIX):]
            recorded = self._consume(update, position)
            outcome = self._apply_update(name, update.payload)
            self._journal.events.append(NewEvent(
                position, Event.UPDATE_COMPLETED, name, {**recorded, **outcome}))
        return bool(arrived)

    def _apply_update(self, name: str, argument: Any) -> dict[str, Any]:
        """Run update `name`'s handler on the state: {"response": ...} or {"error": ...}."""
        spec = self._updates.get(name)
        if spec is None:
            return {"error": {"type": "UnknownHandler", "message":
                              f"this version of the workflow has no update named {name!r}"}}
        self._in_condition = True
        try:
            return {"response": _json_round_trip(spec.handler(self._state, argument))}
        except Exception as exc:  # the handler's failure is its caller's answer
            return {"error": error_payload(exc)}
        finally:
            self._in_condition = False

    def _consume(self, arrived: PendingSignal, position: int) -> dict[str, Any]:
        """Take a buffered signal for the call at `position`: what its event records."""
        self._pending.remove(arrived)
        self._journal.consumed.append((arrived.id, position))
        return {"signal_id": arrived.id, "payload": arrived.payload,
                "idempotency_key": arrived.idempotency_key, "received_at": arrived.received_at}

    def _holds(self, predicate: Callable[[], object]) -> bool:
        self._in_condition = True
        try:
            return bool(predicate())
        finally:
            self._in_condition = False

    def _handle(self, handler: Callable[[Signal], object], signal: Signal) -> None:
        self._in_condition = True
        try:
            handler(signal)
        finally:
            self._in_condition = False

    def _diverged(self, position: int, name: str) -> NonDeterminismError:
        return NonDeterminismError(
            f"non-deterministic workflow at position {position}: condition {name!r} "
            "answered differently on replay than when it was recorded (its predicate and "
            "handlers must depend only on workflow state: no time, randomness or I/O)"
        )

    def _guard(self) -> None:
        """Every call first: refused inside a condition, unwinds a cancelled run."""
        if self._in_condition:
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
        if len(signals) > MAX_EXTERNAL_BATCH:
            raise InvalidArgument(f"at most {MAX_EXTERNAL_BATCH} signals in one call, "
                                  f"got {len(signals)}")
        targets = [parse_execution_id(s.execution_id) for s in signals]
        for s in signals:
            check_signal_name(s.name)
        self._guard()
        calls = [self._replay.next("external", s.name) for s in signals]
        # Checked only when sent: a replay returns what was recorded, whatever the
        # code computes now.
        checked = {i: check_signal(s.name, s.payload, s.idempotency_key, self._limits)
                   for i, (s, (_, recorded)) in enumerate(zip(signals, calls, strict=True))
                   if not recorded}
        journal = self._journal
        results: list[ExternalSignal | None] = [None] * len(signals)
        here: list[int] = []
        for index, (ident, (position, recorded)) in enumerate(zip(targets, calls, strict=True)):
            if recorded:
                results[index] = _external_result(recorded[0].payload)
                continue
            name, encoded, key = checked[index]
            if self._on_this_shard is not None and self._on_this_shard(ident):
                journal.externals.append(ExternalRequest(position, ident, name, encoded, key))
                here.append(index)
            else:
                queued = {"target": str(ident), "name": name, "idempotency_key": key,
                          "queued": True}
                journal.outbox.append(
                    OutboxRequest(position, ident, bucket_of(ident), name, encoded, key))
                journal.events.append(NewEvent(position, Event.EXTERNAL_QUEUED, name, queued))
                results[index] = _external_result(queued)
        if journal.externals or journal.outbox:
            self._cancel = journal.flush() or self._cancel
            # journal.sent answers this flush's externals; with none it is an earlier one's.
            if here:
                for index, outcome in zip(here, journal.sent, strict=True):
                    results[index] = _external_result(outcome)
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


def _external_result(recorded: Mapping[str, Any]) -> ExternalSignal:
    """What a signal_external call returns from its recorded outcome (a refusal in `error`)."""
    target, name, key = uuid.UUID(recorded["target"]), recorded["name"], recorded.get(
        "idempotency_key")
    if "reason_code" in recorded:
        detail = recorded.get("detail") or f"execution {recorded['target']} not found"
        return ExternalSignal(target, name, None, delivered=False, idempotency_key=key,
                              error=ExternalSignalFailed(recorded["reason_code"], detail))
    if recorded.get("queued"):
        return ExternalSignal(target, name, None, delivered=False, idempotency_key=key,
                              queued=True)
    return ExternalSignal(target, name, int(recorded["signal_id"]), bool(recorded["delivered"]),
                          key)


def check_interrupt(
    name: str, prompt: str, actions: Sequence[str], schema: Mapping[str, Any] | None,
    timeout: float | None,
) -> tuple[str, ...]:
    """The accepted actions of a well-formed interrupt request; else InvalidArgument."""
    check_name(name, "interrupt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise InvalidArgument(f"interrupt {name!r}: the prompt must be 1..{MAX_PROMPT} "
                              "characters")
    check_text(prompt, f"interrupt {name!r} prompt")
    accepted = tuple(actions)
    if not accepted or len(set(accepted)) != len(accepted) or not set(accepted) <= set(
        INTERRUPT_ACTIONS
    ):
        raise InvalidArgument(f"interrupt {name!r}: actions must be distinct, from "
                              f"{', '.join(INTERRUPT_ACTIONS)}; got {list(accepted)}")
    if schema is not None:
        check_schema(dict(schema), f"interrupt {name!r}")
    _check_timeout(timeout, f"interrupt {name!r}")
    return accepted


def check_interrupt_value(
    name: str, value: Any, schema: Mapping[str, Any] | None, limits: Limits
) -> Any:
    """The value under review, as JSON will store it; else InvalidArgument or PayloadInvalid."""
    what = f"value of interrupt {name!r}"
    stored = json.loads(payload_json(value, what, limits))
    validate(stored, dict(schema) if schema is not None else None, what)
    return stored


def _check_timeout(timeout: float | None, what: str) -> None:
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float)
        or not math.isfinite(timeout) or timeout <= 0
    ):
        raise InvalidArgument(f"{what}: timeout must be > 0 seconds, got {timeout!r}")


_LONG_AGO = datetime.min.replace(tzinfo=UTC)


def _check_condition(
    name: str, on: Mapping[str, Callable[[Signal], object]], timeout: float | None
) -> None:
    check_name(name, "condition")
    _check_timeout(timeout, f"wait_until {name!r}")
    if not on:
        raise InvalidArgument(f"wait_until {name!r}: `on` must name at least one signal")
    for signal_name, handler in on.items():
        check_signal_name(signal_name)
        if not callable(handler):
            raise InvalidArgument(f"wait_until {name!r}: the handler of {signal_name!r} "
                                  "is not callable")


def _received(signal: PendingSignal) -> datetime:
    return datetime.fromisoformat(signal.received_at) if signal.received_at else _LONG_AGO


def _signal(name: str, recorded: Mapping[str, Any]) -> Signal:
    """A received signal from what its consumption event records."""
    at = recorded.get("received_at")
    return Signal(name, recorded["payload"], int(recorded["signal_id"]),
                  recorded.get("idempotency_key"),
                  datetime.fromisoformat(at) if at else _LONG_AGO)


def _json_round_trip(value: Any) -> Any:
    """`value` as JSON gives it back; scalars that JSON keeps as they are skip the trip."""
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:
        return value
    if kind is float and math.isfinite(value):
        return value
    return json.loads(json.dumps(value, allow_nan=False))


def _run_attempt(
    fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> T:
    if timeout is None:
        return fn(*args, **kwargs)
    # The attempt runs on a thread of its own (`shardq-step`) that touches nothing
    # but `box`; past the timeout the turn stops waiting for it and never reads
    # `box` again, so its late result or error goes nowhere.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed back to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="shardq-step", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StepTimeout(f"attempt did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]
