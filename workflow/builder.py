"""Declarative workflows: "step, wait for an approval, step", with gates and compensation.

A definition is a list of stages checked when it is built and compiled into
an ordinary workflow function over WorkflowContext, so it runs, replays and
survives crashes exactly as code-first workflows do:

    approval = (Workflow("approval").version(1)
        .step("prepare", prepare_proposal, compensate=withdraw_proposal)
        .wait_for("manager-approval", timeout=86_400)
        .interrupt("finance_review", "Approve or reject this proposal")
        .timer("cooldown", 30)
        .step("commit", commit_decision)
        .build())
    registry.register_definition(approval)

Step functions (and compensations) take one argument, a `Run`: `run.input`,
`run.steps[name]` (results of completed steps), `run.signals[event]` (the
payload of each gate that opened), `run.decisions[name]` (interrupt
decisions) and `run.timed_out` (gates of `wait_for_signal_or_timeout` that
timed out).

Gates differ from code-first signal waits: a run takes one signal per gate
event. The first one stands; a second signal of that name is refused when it
is sent (`SignalRefused`, reason `gate_closed`), before or after the gate was
reached, and never replaces the accepted payload. A signal sent before the
run reaches its gate is kept and opens the gate when it gets there. A gate's
or an interrupt's timeout is decided as a code-first wait's (`ctx.receive`,
`ctx.interrupt`): by the deadline the store wrote and the arrival it recorded,
so a signal or decision in time opens it however late a worker comes, and a
late one does not.

Unwinding: when a step fails for good (its retries spent, or a deliberate
raise with `retry=1`), an interrupt is rejected, or a gate or interrupt times
out, the compensations of the steps completed so far run in reverse order,
each once and durably (a crash while unwinding resumes it where it was), and
the run ends `failed` (`timed_out` for a timeout) with the cause.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardq.core.errors import InvalidArgument, StepFailed, WorkflowError, WorkflowTimedOut
from shardq.core.models import INTERRUPT_ACTIONS, Decision
from shardq.core.rules import check_name, check_signal_name
from shardq.workflow.arguments import check_interrupt
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import WorkflowDef
from shardq.workflow.retry import RetryPolicy

COMPENSATION_PREFIX = "compensate:"


class Rejected(WorkflowError):
    """A person rejected the run at an interrupt: the cause of a declarative run's failure."""


@dataclass
class Run:
    """What a declarative workflow's steps and compensations see of their run."""

    input: Any
    steps: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    timed_out: set[str] = field(default_factory=set)


StepFn = Callable[[Run], Any]


@dataclass(frozen=True)
class _Stage:
    kind: str  # step, gate, optional_gate, interrupt, timer
    name: str
    fn: StepFn | None = None
    compensate: StepFn | None = None
    retry: RetryPolicy | int | None = None
    step_timeout: float | None = None
    event: str | None = None
    timeout: float | None = None
    prompt: str | None = None
    actions: tuple[str, ...] = INTERRUPT_ACTIONS
    schema: Mapping[str, Any] | None = None
    value: Callable[[Run], Any] | None = None
    seconds: float = 0.0


class Workflow:
    """A declarative workflow under construction; `build()` checks and compiles it."""

    def __init__(self, name: str) -> None:
        self._name = check_name(name, "workflow")
        self._version = 1
        self._stages: list[_Stage] = []

    def version(self, version: int) -> Workflow:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidArgument(f"workflow {self._name}: version must be an integer >= 1")
        self._version = version
        return self

    def step(
        self,
        name: str,
        fn: StepFn,
        *,
        compensate: StepFn | None = None,
        retry: RetryPolicy | int | None = None,
        timeout: float | None = None,
    ) -> Workflow:
        """Run `fn(run)` once, durably. `compensate(run)` undoes it when the run unwinds."""
        if not callable(fn) or (compensate is not None and not callable(compensate)):
            raise InvalidArgument(f"step {name!r}: fn and compensate must be callables")
        RetryPolicy.of(retry)
        if timeout is not None:
            self._check_timeout(f"step {name!r}", timeout)
        return self._add(_Stage("step", name, fn=fn, compensate=compensate, retry=retry,
                                step_timeout=timeout))

    def wait_for(self, event: str, *, timeout: float | None = None) -> Workflow:
        """A gate: wait until signal `event` arrived (a signal without payload counts).

        Its payload is `run.signals[event]`. Without `timeout` it waits
        indefinitely; at the timeout the run unwinds and ends `timed_out`.
        """
        if timeout is not None:
            self._check_timeout(f"gate {event!r}", timeout)
        return self._add(_Stage("gate", event, event=event, timeout=timeout))

    def wait_for_signal_or_timeout(self, name: str, event: str, *, timeout: float) -> Workflow:
        """A gate that may time out without failing: later steps see which happened.

        When `event` arrived, `run.signals[event]` holds its payload; when the
        timeout came first, `name` is in `run.timed_out`.
        """
        self._check_timeout(f"gate {name!r}", timeout)
        return self._add(_Stage("optional_gate", name, event=event, timeout=timeout))

    def interrupt(
        self,
        name: str,
        prompt: str,
        *,
        actions: Sequence[str] = INTERRUPT_ACTIONS,
        schema: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        value: Callable[[Run], Any] | None = None,
    ) -> Workflow:
        """Ask a person (see `ctx.interrupt`): approve and edit go on (`run.decisions[name]`
        holds the decision, an edit's payload with it); reject unwinds and fails the run;
        a timeout unwinds and ends it `timed_out`. `value(run)` computes what is under
        review (for example a step's proposal), shown to the reviewer and prefilling
        the edit form."""
        accepted = check_interrupt(name, prompt, actions, schema, timeout)
        if value is not None and not callable(value):
            raise InvalidArgument(f"interrupt {name!r}: value must be a function of the run")
        return self._add(_Stage("interrupt", name, prompt=prompt, actions=accepted,
                                schema=schema, timeout=timeout, value=value))

    def timer(self, name: str, seconds: float) -> Workflow:
        """Wait `seconds` on a durable timer."""
        self._check_timeout(f"timer {name!r}", seconds)
        return self._add(_Stage("timer", name, seconds=seconds))

    def build(self) -> WorkflowDef:
        """The checked, compiled definition, for `Registry.register_definition`."""
        if not any(s.kind == "step" for s in self._stages):
            raise InvalidArgument(f"workflow {self._name}: a definition needs at least one step")
        stages = tuple(self._stages)
        gates = tuple(s.event for s in stages if s.event is not None)

        def run_definition(ctx: WorkflowContext) -> dict[str, Any]:
            return _play(ctx, stages)

        run_definition.__name__ = run_definition.__qualname__ = self._name
        return WorkflowDef(self._name, self._version, run_definition, gates=gates)

    # -- checks ----------------------------------------------------------------

    def _add(self, stage: _Stage) -> Workflow:
        what = {"optional_gate": "gate"}.get(stage.kind, stage.kind)
        if stage.kind in ("gate", "optional_gate"):
            check_signal_name(stage.event)
            if stage.kind == "optional_gate":
                check_name(stage.name, what)
            if any(s.event == stage.event for s in self._stages):
                raise InvalidArgument(f"workflow {self._name}: it waits on event "
                                      f"{stage.event!r} twice; one event per gate")
        else:
            check_name(stage.name, what)
        if stage.name.startswith(COMPENSATION_PREFIX):
            raise InvalidArgument(f"{what} name {stage.name!r}: the prefix "
                                  f"{COMPENSATION_PREFIX!r} is reserved for compensations")
        if any(s.name == stage.name for s in self._stages):
            raise InvalidArgument(f"workflow {self._name}: the name {stage.name!r} is used "
                                  "twice; every step, gate, interrupt and timer needs its own")
        self._stages.append(stage)
        return self

    @staticmethod
    def _check_timeout(what: str, seconds: object) -> None:
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not math.isfinite(seconds) or seconds <= 0):
            raise InvalidArgument(f"{what}: the timeout must be a positive number of seconds, "
                                  f"got {seconds!r}")


def _play(ctx: WorkflowContext, stages: Sequence[_Stage]) -> dict[str, Any]:
    run = Run(ctx.input)
    completed: list[_Stage] = []
    try:
        for stage in stages:
            _enter(ctx, stage, run)
            if stage.kind == "step":
                completed.append(stage)
    except (StepFailed, Rejected, WorkflowTimedOut):
        for stage in reversed(completed):
            if stage.compensate is not None:
                ctx.step(COMPENSATION_PREFIX + stage.name, stage.compensate, run)
        raise
    return {"steps": run.steps, "signals": run.signals,
            "decisions": {k: d.as_json() for k, d in run.decisions.items()},
            "timed_out": sorted(run.timed_out)}


def _enter(ctx: WorkflowContext, stage: _Stage, run: Run) -> None:
    if stage.kind == "step":
        assert stage.fn is not None
        run.steps[stage.name] = ctx.step(stage.name, stage.fn, run, retry=stage.retry,
                                         timeout=stage.step_timeout)
    elif stage.kind in ("gate", "optional_gate"):
        assert stage.event is not None
        received = ctx.receive(stage.event, stage.timeout)
        if received is not None:
            run.signals[stage.event] = received.payload
        elif stage.kind == "optional_gate":
            run.timed_out.add(stage.name)
        else:
            raise WorkflowTimedOut(f"gate {stage.event!r} timed out after {stage.timeout} s")
    elif stage.kind == "interrupt":
        assert stage.prompt is not None
        decision = ctx.interrupt(stage.name, stage.prompt, stage.actions,
                                 schema=dict(stage.schema) if stage.schema else None,
                                 timeout=stage.timeout,
                                 value=stage.value(run) if stage.value else None)
        run.decisions[stage.name] = decision
        if decision.action == "reject":
            raise Rejected(f"interrupt {stage.name!r} rejected by {decision.actor}")
        if decision.action == "timed_out":
            raise WorkflowTimedOut(f"interrupt {stage.name!r} timed out after "
                                   f"{stage.timeout} s")
    else:
        ctx.sleep(stage.name, stage.seconds)
