"""One turn: replay a claimed execution and run it until it finishes, fails or must wait.

The turn writes only through `checkpoint` (the worker's completer), so the
same code runs under the inline and the batching completer, and a test can
drive a turn against a real store without a worker around it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from shardq.queue.context import (
    Checkpoint,
    CommitRejected,
    TurnAborted,
    WorkflowContext,
    _Cancelled,
    _Park,
    error_payload,
)
from shardq.queue.errors import NonDeterminismError, NotSerializable, UnknownWorkflow
from shardq.queue.models import Claim, State, TaskAction, TurnCommit
from shardq.queue.registry import Registry

log = logging.getLogger(__name__)

UNKNOWN_VERSION_RETRY_S = 60.0
"""How long a run whose workflow version this worker lacks waits for a worker that has it."""


@dataclass(frozen=True)
class TurnOutcome:
    state: State | None
    """The state the turn left the run in; None when the lease was lost (nothing written)."""


def run_turn(claim: Claim, registry: Registry, checkpoint: Checkpoint) -> TurnOutcome:
    ctx = WorkflowContext(claim, checkpoint)
    try:
        definition = registry.get(claim.workflow_name, claim.workflow_version)
    except UnknownWorkflow as exc:
        log.error(
            "workflow not registered in this worker; retrying later",
            extra={"execution_id": str(claim.execution_id), "error": str(exc)},
        )
        commit = ctx._commit_for(
            state=None, task=TaskAction.SCHEDULE, delay=UNKNOWN_VERSION_RETRY_S
        )
        return _final(ctx, commit, None)
    try:
        try:
            if claim.cancel_requested:
                raise _Cancelled()
            result = definition.fn(ctx)
            if ctx._fatal is not None:
                raise ctx._fatal
            leftover = ctx._unreplayed()
            if leftover is not None:
                raise NonDeterminismError(
                    f"non-deterministic workflow: it returned after {ctx._position} call(s) but "
                    f"history recorded a call at position {leftover}"
                )
            try:
                output = json.dumps(result, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise NotSerializable(
                    f"workflow returned {type(result).__name__}, which is not "
                    f"JSON-serialisable: {exc}"
                ) from exc
            # A wait the run resumed from was closed by the call that resumed
            # (ctx flags it); nothing else can be open when the function returns.
            commit = ctx._commit_for(
                state=State.COMPLETED, task=TaskAction.DELETE, output_json=output
            )
        except _Park as park:
            commit = ctx._commit_for(
                state=park.state, task=park.task, delay=park.delay,
                open_wait=park.open_wait, wake_on_signal=park.wake_on_signal,
            )
        except _Cancelled:
            commit = ctx._commit_for(state=State.CANCELLED, task=TaskAction.DELETE, close_wait=True)
        except Exception as exc:
            failure = ctx._fatal or exc
            commit = ctx._commit_for(
                state=State.FAILED, task=TaskAction.DELETE, error=error_payload(failure),
                close_wait=True,
            )
        return _final(ctx, commit, commit.state)
    except CommitRejected as rejected:
        try:
            return _fail_rejected(ctx, rejected)
        except TurnAborted:
            return TurnOutcome(None)
    except TurnAborted:
        log.warning("lease lost; turn abandoned", extra={"execution_id": str(claim.execution_id)})
        return TurnOutcome(None)


def _final(ctx: WorkflowContext, commit: TurnCommit, state: State | None) -> TurnOutcome:
    try:
        try:
            ctx._commit(commit)
        except CommitRejected as rejected:
            return _fail_rejected(ctx, rejected)
    except TurnAborted:
        log.warning("lease lost at commit", extra={"execution_id": str(ctx.execution_id)})
        return TurnOutcome(None)
    return TurnOutcome(state)


def _fail_rejected(ctx: WorkflowContext, rejected: CommitRejected) -> TurnOutcome:
    """Fail the run with the database's reason, dropping the events it refused to store.

    Retrying would hit the same refusal forever; a failed run with the reason
    is what an operator can act on.
    """
    log.error("database refused a turn's commit; failing the run",
              extra={"execution_id": str(ctx.execution_id), "error": str(rejected.error)})
    ctx._buffer, ctx._consumed = [], []
    commit = ctx._commit_for(
        state=State.FAILED, task=TaskAction.DELETE, error=error_payload(rejected.error),
        close_wait=True,
    )
    ctx._commit(commit)
    return TurnOutcome(State.FAILED)
