"""One turn: replay a claimed execution and run it until it finishes, fails or must wait.

The turn's API is two functions. `run_turn` runs the workflow function and
returns the commit that ends the turn, still to be made: the caller hands it to
the completer without waiting, so a turn's thread is free for the next claimed
run while the commit is in flight. Mid-turn checkpoints go through
`checkpoint` (the worker's completer) and block until durable.
`refused_by_store` is what the caller makes instead of an ending commit the
database refused.
"""

from __future__ import annotations

import json
import logging
import uuid

from shardq.queue.context import WorkflowContext, error_payload
from shardq.queue.control import Cancelled, CommitRejected, Park, TurnAborted
from shardq.queue.errors import NotSerializable, StoreRejected, UnknownWorkflow
from shardq.queue.journal import Checkpoint, Journal
from shardq.queue.models import Claim, State, TaskAction, TurnCommit
from shardq.queue.registry import Registry, WorkflowFn
from shardq.queue.replay import Replay

__all__ = ["UNKNOWN_VERSION_RETRY_S", "refused_by_store", "run_turn"]

log = logging.getLogger(__name__)

UNKNOWN_VERSION_RETRY_S = 60.0
"""How long a run whose workflow version this worker lacks waits for a worker that has it."""


def run_turn(claim: Claim, registry: Registry, checkpoint: Checkpoint) -> TurnCommit | None:
    """The commit that ends this turn, still to be made; None when the lease was lost."""
    journal = Journal(claim, checkpoint)
    try:
        definition = registry.get(claim.workflow_name, claim.workflow_version)
    except UnknownWorkflow as exc:
        log.error(
            "workflow not registered in this worker; retrying later",
            extra={"execution_id": str(claim.execution_id), "error": str(exc)},
        )
        return journal.commit(state=None, task=TaskAction.SCHEDULE, delay=UNKNOWN_VERSION_RETRY_S)
    replay = Replay(claim.history, claim.signals)
    try:
        return _play(definition.fn, claim, replay, journal)
    except CommitRejected as rejected:
        return refused_by_store(claim.execution_id, journal.lease_token, rejected.error)
    except TurnAborted:
        log.warning("lease lost; turn abandoned", extra={"execution_id": str(claim.execution_id)})
        return None


def _play(fn: WorkflowFn, claim: Claim, replay: Replay, journal: Journal) -> TurnCommit:
    """Run the workflow function; the commit its ending asks for (checkpoints raise through)."""
    try:
        if claim.cancel_requested:
            raise Cancelled()
        result = fn(WorkflowContext(claim, replay, journal))
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
        return journal.commit(
            state=park.state, task=park.task, delay=park.delay,
            open_wait=park.open_wait, wake_on_signal=park.wake_on_signal,
        )
    except Cancelled:
        return journal.commit(state=State.CANCELLED, task=TaskAction.DELETE, close_wait=True)
    except Exception as exc:
        return journal.commit(
            state=State.FAILED, task=TaskAction.DELETE, error=error_payload(replay.fatal or exc),
            close_wait=True,
        )


def refused_by_store(
    execution_id: uuid.UUID, lease_token: uuid.UUID, error: StoreRejected
) -> TurnCommit:
    """The commit that fails a run with the database's reason for refusing its last commit.

    It drops the refused events: retrying them would hit the same refusal
    forever, and a failed run with the reason is what an operator can act on.
    `lease_token` is the one the refused commit carried (it never landed).
    """
    log.error("database refused a turn's commit; failing the run",
              extra={"execution_id": str(execution_id), "error": str(error)})
    return TurnCommit(
        execution_id, lease_token, state=State.FAILED, task=TaskAction.DELETE,
        error=error_payload(error), close_wait=True,
    )
