"""One turn: replay a claimed execution and run it until it finishes, fails or must wait.

The turn's API is two functions. `run_turn` runs the workflow function and
returns the commit that ends the turn, still to be made: the caller hands it to
the completer without waiting, so a turn's thread is free for the next claimed
run while the commit is in flight. Mid-turn checkpoints go through
`checkpoint` (the worker's completer) and block until durable.
`failing_commit` is what the caller makes instead of a commit the database
refused, be it a checkpoint or the ending commit (the policy lives in
`Worker._turn_ended`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from shardq.core import tracing
from shardq.core.errors import (
    LimitExceeded,
    NotSerializable,
    StoreRejected,
    UnknownWorkflow,
    WorkflowTimedOut,
)
from shardq.core.models import Claim, State, TaskAction, TurnCommit
from shardq.core.rules import Limits
from shardq.workflow.context import WorkflowContext
from shardq.workflow.control import Cancelled, ContinueAsNew, Park, TurnAborted
from shardq.workflow.journal import Checkpoint, Journal
from shardq.workflow.rates import RateSlots
from shardq.workflow.registry import Registry, WorkflowDef
from shardq.workflow.replay import Replay
from shardq.workflow.steps import error_payload

__all__ = ["UNKNOWN_VERSION_RETRY_S", "failing_commit", "run_turn"]

log = logging.getLogger(__name__)

_WAITS = frozenset({State.WAITING, State.INPUT_REQUIRED})
UNKNOWN_VERSION_RETRY_S = 60.0
"""How long a run whose workflow version this worker lacks waits for a worker that has it."""


def run_turn(
    claim: Claim, registry: Registry, checkpoint: Checkpoint,
    on_this_shard: Callable[[uuid.UUID], bool] | None = None, *, limits: Limits | None = None,
    rate_slots: RateSlots | None = None,
) -> TurnCommit | None:
    """The commit that ends this turn, still to be made; None when the lease was lost.

    `on_this_shard` says whether an execution id routes to the claim's shard
    (`ctx.signal_external` delivers there in the turn's own commit); without
    it, every target counts as on another shard.

    Raises CommitRejected when the database refused one of the turn's
    checkpoints: the caller treats the refused commit as it would a refused
    ending commit.
    """
    journal = Journal(claim, checkpoint)
    try:
        definition = registry.get(claim.workflow_name, claim.workflow_version)
    except UnknownWorkflow as exc:
        log.error(
            "workflow not registered in this worker; retrying later",
            extra={"execution_id": str(claim.execution_id), "error": str(exc)},
        )
        return journal.commit(state=None, task=TaskAction.SCHEDULE, delay=UNKNOWN_VERSION_RETRY_S)
    replay = Replay(claim.history, claim.signals, max_calls=definition.max_history)
    with _turn_span(claim) if tracing.active() else nullcontext() as span:
        journal.trace = tracing.traceparent(span)
        try:
            ctx = WorkflowContext(claim, replay, journal, on_this_shard,
                                  state=definition.new_state(), updates=definition.updates,
                                  limits=limits, rate_slots=rate_slots, registry=registry)
            return _play(definition, ctx, claim, replay, journal)
        except TurnAborted:
            log.warning("lease lost; turn abandoned",
                        extra={"execution_id": str(claim.execution_id)})
            return None


def _turn_span(claim: Claim) -> Any:
    parent, links = _continued_traces(claim)
    return tracing.span("shardq.turn", kind=tracing.CONSUMER, parent=parent, links=links,
                        attributes={"shardq.execution_id": str(claim.execution_id),
                                    "shardq.workflow": claim.workflow_name,
                                    "shardq.workflow_id": claim.workflow_id,
                                    "shardq.claims": claim.claims})


MAX_LINKS = 8
"""Traces of further buffered signals a turn's span links to (core/tracing.py)."""


def _continued_traces(claim: Claim) -> tuple[str | None, list[str]]:
    """The trace a turn continues, and those it links to: the newest buffered signal's
    (what woke it), else on the run's first turn its start's (a child's: the turn that
    started it); the start's, and the other signals', are links. A first turn is one
    with no call recorded yet: a child's first claim counts two claims, and its
    history holds its `child.of`."""
    sent = [s.trace for s in reversed(claim.signals) if s.trace]
    if sent:
        return sent[0], [*sent[1:MAX_LINKS], *([claim.trace] if claim.trace else [])]
    if claim.claims <= 1 or all(e.position is None for e in claim.history):
        return claim.trace, []
    return None, [claim.trace] if claim.trace else []


def _play(
    definition: WorkflowDef, ctx: WorkflowContext, claim: Claim, replay: Replay,
    journal: Journal,
) -> TurnCommit:
    """Run the workflow function; the commit its ending asks for (checkpoints raise through)."""
    try:
        if claim.cancel_requested:
            raise Cancelled()
        result = definition.fn(ctx)
        ctx._wait_for_kept()  # a completing run waits for its `wait` children first
        replay.finish()
        try:
            output = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise NotSerializable(
                f"workflow returned {type(result).__name__}, which is not "
                f"JSON-serialisable: {exc}"
            ) from exc
        # A wait the run resumed from was closed by the call that resumed
        # (the journal flags it); nothing else can be open when the function returns.
        return journal.commit(state=State.COMPLETED, task=TaskAction.DELETE, output_json=output)
    except Park as park:
        return _parking(definition, journal, park)
    except ContinueAsNew as nxt:
        return journal.commit(state=State.PENDING, task=TaskAction.SCHEDULE, close_wait=True,
                              continued=(nxt.input_json, replay.generation + 1,
                                         replay.position))
    except Cancelled:
        return journal.commit(state=State.CANCELLED, task=TaskAction.DELETE, close_wait=True)
    except WorkflowTimedOut as exc:
        return journal.commit(
            state=State.TIMED_OUT, task=TaskAction.DELETE,
            error=error_payload(replay.fatal or exc), close_wait=True,
        )
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        # sys.exit() in workflow or step code fails the run like any error: let
        # through, it would end the turn thread silently, one thread per retry
        # of the run, until the worker ran no turns at all. (The engine's own
        # control flow, Park, Cancelled and TurnAborted, is caught above or by
        # the caller.)
        return journal.commit(
            state=State.FAILED, task=TaskAction.DELETE, error=error_payload(replay.fatal or exc),
            close_wait=True,
        )


def _parking(definition: WorkflowDef, journal: Journal, park: Park) -> TurnCommit:
    """The commit of a run that must wait: a wait longer than the definition allows
    fails it instead."""
    longest = park.open_wait.deadline_in if park.open_wait else None
    if longest is not None and longest > definition.max_wait_s:
        too_long = LimitExceeded(
            f"a wait of {longest:.0f} s is longer than the definition's max_wait_s "
            f"({definition.max_wait_s:.0f} s)")
        return journal.commit(state=State.FAILED, task=TaskAction.DELETE,
                              error=error_payload(too_long), close_wait=True)
    wake = park.wake_on_signals
    if definition.updates and park.state in _WAITS:  # not a retry's backoff: no early wake
        wake += tuple(u.signal_name for u in definition.updates)
    return journal.commit(
        state=park.state, task=park.task, delay=park.delay,
        open_wait=park.open_wait, wake_on_signals=wake,
    )


def failing_commit(refused: TurnCommit, error: StoreRejected) -> TurnCommit:
    """The commit that fails a run with the database's reason for refusing `refused`.

    It drops the refused events: retrying them would hit the same refusal
    forever, and a failed run with the reason is what an operator can act on.
    It carries `refused`'s lease token, which is still current (nothing of
    `refused` was written).
    """
    log.error("database refused a turn's commit; failing the run",
              extra={"execution_id": str(refused.execution_id), "error": str(error)})
    return TurnCommit(
        refused.execution_id, refused.lease_token, state=State.FAILED, task=TaskAction.DELETE,
        error=error_payload(error), close_wait=True, family=refused.family,
    )
